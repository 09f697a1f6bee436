"""After launcher runs: does a plain ``ray.init()`` on this machine start a local Ray? (issue 36)

Ray's ``ray.init()`` without an address joins the cluster that Ray's current-cluster file names
(``<temp dir>/ray_current_cluster``); a file left naming a stopped cluster makes it try that address
for minutes. The launcher removes the file when it stops a cluster it started. This starts Ray the
way a user's script would, says whether it started a local one or joined a running cluster, and stops
what it started.

    python tools/check_local_ray.py      # exit 0: a local Ray started; 1: it joined a running cluster
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.pop("RAY_ADDRESS", None)
    import ray
    from ray._common.utils import get_ray_address_file

    ctx = ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        started = ray._private.worker._global_node.head  # False: it connected to a running cluster
        what = "started a local Ray" if started else "JOINED a running cluster"
        print(f"ray.init() {what} at {ctx.address_info['gcs_address']} (Ray's current-cluster file: "
              f"{get_ray_address_file(None)})", flush=True)  # fmt: skip
    finally:
        ray.shutdown()
    return 0 if started else 1


if __name__ == "__main__":
    sys.exit(main())
