"""Process helpers several test files share: a free TCP port, and a function run on spawned gloo ranks."""

from __future__ import annotations

import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(body: Callable[[int, int], Any], rank: int, world: int, port: int, queue: Any) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        out = body(rank, world)
        dist.barrier()
        queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - every failure goes back to the test
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo_ranks(body: Callable[[int, int], Any], world: int, timeout: float = 240.0) -> list[Any]:
    """Run ``body(rank, world)`` in ``world`` spawned processes that share one gloo process group
    (TCP on 127.0.0.1); a barrier follows a body that returned. ``body`` must be a module-level
    function (spawn pickles it by name).

    Returns:
        What each rank's ``body`` returned, in the order the ranks finished.

    Raises:
        AssertionError: a rank raised (the message is its traceback).
        queue.Empty: a rank reported nothing within ``timeout`` seconds.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(body, r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(world):
            results.append(queue.get(timeout=timeout))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [r[2] for r in results if r[1] != "ok"]
    assert not errors, errors[0]
    return [r[2] for r in results]
