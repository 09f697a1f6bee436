"""npu_rl.cpu.checkpoint_engine: verl's weight sync between separate pools over gloo, on real
processes (verl's CheckpointEngineRegistry, prepare/build_topology/init_process_group as verl's
CheckpointEngineManager calls them; torch.distributed gloo; nothing mocked)."""

from __future__ import annotations

import asyncio

import pytest

from tests.procs import run_gloo_ranks

# gloo processes: left out of --quick.
pytestmark = pytest.mark.slow

BUCKET = 1024  # bytes: the 3 KiB weight is split into chunks, the rest spread over several buckets


def _weights(seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(24, 32, generator=g),  # 3,072 bytes > one bucket: chunked, merged
        "layer.0.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layer.0.bias": torch.randn(8, generator=g),
        "norm.weight": torch.ones(5),
    }


def _rank_sync(rank: int, world: int):
    """Ranks 0 and 1 are the trainer (an FSDP-like group: each weight is produced collectively),
    rank 2 the rollout worker. Two syncs in a row, as every trainer step does."""
    import torch
    import torch.distributed as dist
    from verl.checkpoint_engine import CheckpointEngineRegistry

    import npu_rl.cpu.checkpoint_engine  # noqa: F401 - registers "gloo", as custom_backend_module does

    actor_group = dist.new_group([0, 1])
    engine = CheckpointEngineRegistry.new("gloo", bucket_size=BUCKET, is_master=rank == 0, timeout_s=60)
    received = []
    for sync in range(2):
        meta = [engine.prepare()]
        metas = [None] * world
        dist.all_gather_object(metas, meta[0])
        actor_kw, rollout_kw = type(engine).build_topology(2, 1, metas)
        kw = {k: v[rank] for k, v in actor_kw.items()} if rank < 2 else {k: v[0] for k, v in rollout_kw.items()}
        engine.init_process_group(**kw)
        if rank < 2:

            def produce(sync=sync):
                for name, w in _weights(sync).items():
                    w = w.clone()
                    dist.all_reduce(w, group=actor_group)  # collective on the trainer side, as FSDP's gather
                    yield name, w / 2

            asyncio.run(engine.send_weights(produce()))
        else:

            async def collect():
                return {name: w.clone() for name, w in [x async for x in engine.receive_weights()]}

            got = asyncio.run(collect())
            want = _weights(sync)
            assert list(got) == list(want)
            for name, w in want.items():
                assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
                assert torch.equal(got[name], w), name
            received.append(sorted(got))
        engine.finalize()
    return rank, received


def test_gloo_engine_syncs_weights_between_pools():
    results = sorted(run_gloo_ranks(_rank_sync, 3, timeout=180))
    assert results[2][1] == [sorted(_weights(0))] * 2


def test_gloo_engine_is_registered_by_its_module():
    from verl.checkpoint_engine import CheckpointEngineRegistry

    import npu_rl.cpu.checkpoint_engine as ce

    assert CheckpointEngineRegistry.get("gloo") is ce.GlooCheckpointEngine
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
        ce.GlooCheckpointEngine(bucket_size=0)
