"""The node's facts for the report: CANN, driver, npu-smi, Python, the installed versions of the pinned
stack against ``sources.lock``, and the patch series state (``apply_all_patches.sh --status``).

Read-only: files under the Ascend install folder, package metadata, two commands with a timeout.
Host names are kept apart (``private``): the report uses them only to leave them out.
"""

from __future__ import annotations

import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from npu_rl import REPO_ROOT

REQUIRED_CANN = "9.1"  # vllm-ascend 0.23.0.post1's row (README "The pinned stack"; docker/Dockerfile CANN_VERSION)
# distribution names of the stack as installed, and the sources.lock entry that pins each (None: runtime)
PACKAGES = {
    "torch": None, "torch_npu": None, "transformers": None, "ray": None, "verl": "verl", "vllm": "vllm",
    "vllm_ascend": "vllm-ascend", "megatron-core": "megatron-core", "mbridge": "mbridge", "mindspeed": "mindspeed",
}  # fmt: skip
_ASCEND = Path("/usr/local/Ascend")


def cann_version(env: Mapping[str, str], root: Path = _ASCEND) -> tuple[str | None, str]:
    """CANN's version and the file it was read from (``version=`` of ``ascend_toolkit_install.info``,
    or ``version.cfg``), looked for under ``ASCEND_TOOLKIT_HOME`` then ``root``; (None, why) if absent."""
    homes = [Path(env["ASCEND_TOOLKIT_HOME"])] if env.get("ASCEND_TOOLKIT_HOME") else []
    homes += [root / "ascend-toolkit" / "latest", root / "cann"]
    for home in homes:
        for info in sorted(home.glob("*/ascend_toolkit_install.info")) + [home / "version.cfg"]:
            if info.is_file():
                m = re.search(r"^\s*(?:version|Version)\s*=\s*([\w.\-]+)", info.read_text(errors="replace"), re.M)
                if m:
                    return m.group(1), str(info)
    return None, f"no ascend_toolkit_install.info or version.cfg under {', '.join(map(str, homes))}"


def driver_version(root: Path = _ASCEND) -> str | None:
    """``Version=`` of the NPU driver's ``version.info``, None when there is none."""
    info = root / "driver" / "version.info"
    if not info.is_file():
        return None
    m = re.search(r"^\s*Version\s*=\s*(\S+)", info.read_text(errors="replace"), re.M)
    return m.group(1) if m else None


def npu_smi_summary(limit: int = 40) -> list[str]:
    """The first lines of ``npu-smi info`` (the device table), empty when npu-smi is absent or fails."""
    exe = shutil.which("npu-smi")
    if not exe:
        return []
    try:
        r = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.rstrip() for ln in r.stdout.splitlines() if ln.strip()][:limit]


def installed(name: str) -> str | None:
    """The installed version of distribution ``name`` in this Python, None when not installed."""
    for candidate in (name, name.replace("_", "-"), name.replace("-", "_")):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def pinned_versions() -> dict[str, str]:
    """sources.lock's version per upstream name."""
    from npu_rl.lock import load_lock

    return {name: up.version for name, up in load_lock().upstreams.items()}


def patch_status() -> dict:
    """``bash apply_all_patches.sh --status``: its exit code and table."""
    try:
        r = subprocess.run(
            ["bash", str(REPO_ROOT / "apply_all_patches.sh"), "--status"],
            capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"exit_code": None, "output": [f"could not run apply_all_patches.sh --status: {e}"]}
    lines = [ln.rstrip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    return {"exit_code": r.returncode, "output": lines}


def collect(env: Mapping[str, str], npus: str) -> dict:
    """Every fact (``facts.json``); ``npus`` is the launcher's view (count and where it came from)."""
    cann, cann_from = cann_version(env)
    pins = pinned_versions()
    status = patch_status()
    return {
        "cann": f"{cann} ({cann_from})" if cann else f"not found: {cann_from}",
        "cann_version": cann,
        "driver": driver_version() or "not found",
        "npu_smi": npu_smi_summary(),
        "npus": npus,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {
            name: {"installed": installed(name), "pinned": pins.get(lock) if lock else None}
            for name, lock in PACKAGES.items()
        },  # fmt: skip
        "patch_series": f"apply_all_patches.sh --status exited {status['exit_code']}"
        + (" (a consistent set)" if status["exit_code"] == 0 else " (see patch_status)"),
        "patch_status": status,
        "private": {
            "hosts": sorted({socket.gethostname(), socket.getfqdn(), platform.node()} - {""}),
            "home": str(Path.home()),
        },
    }


def cann_problem(version: str | None, required: str = REQUIRED_CANN) -> str | None:
    """Why this CANN cannot run the stack (None when it can): absent, or not ``required``.x."""
    if version is None:
        return (
            "CANN was not found (no ascend_toolkit_install.info / version.cfg): source CANN's set_env.sh "
            f"(ASCEND_SET_ENV_FILES) or install CANN {required}"
        )
    if version != required and not version.startswith(required + "."):
        return (
            f"CANN {version} is installed, but the pinned stack (vllm-ascend 0.23.0.post1, torch_npu 2.10.0.post4) "
            f"needs CANN {required}: use the A3 image (docker/) or install CANN {required}"
        )
    return None
