"""A checkpoint engine for verl's weight sync between separate trainer and rollout pools on CPU.

verl 0.9.1 syncs weights between disaggregated pools (the fully-async and one-step-off-policy
trainers) through a checkpoint engine (``verl/checkpoint_engine``): ``nccl`` and ``nixl`` need CUDA
and cupy, ``hccl`` needs torch_npu, ``kimi_ckpt_engine`` and ``mooncake`` need their transfer
engines; ``naive`` is for a colocated rollout only. On a CPU machine none of the disaggregated ones
registers, so this module adds ``gloo``: the same protocol as verl's NCCL engine
(``nccl_checkpoint_engine.py``: actor rank 0 broadcasts buckets of weight chunks to every rollout
worker, the other actor ranks only walk the weight generator, which is collective over the actor
group), over a gloo process group of its own (a ``TCPStore`` on actor rank 0's node plus
``ProcessGroupGloo``, built for each sync and destroyed after it, apart from the trainer's
default group). Bucket metadata travels in the same broadcast as a pickled byte tensor, so no
zeromq side channel is needed.

Switched on by two recipe keys (the CPU fully-async recipe sets them)::

    actor_rollout_ref.rollout.checkpoint_engine.backend=gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=npu_rl.cpu.checkpoint_engine

verl imports ``custom_backend_module`` in every process that builds an engine (the actor workers,
the rollout's ``CheckpointEngineWorker`` and the trainer's ``CheckpointEngineManager``) before it
looks the backend up. For CPU development and CI only: on NPUs use ``hccl``.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)

BACKEND = "gloo"
logger = logging.getLogger(__name__)


@dataclass
class MasterAddress:
    """Where actor rank 0's TCPStore listens for this sync's group."""

    host: str
    port: int


def _pack(obj: object) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Bucketed broadcast of the actor's weights to the rollout workers over gloo (module docstring).

    Args:
        bucket_size: bytes per bucket (``checkpoint_engine.update_weights_bucket_megabytes`` << 20);
            a weight larger than a bucket is split into chunks and merged again on the receiver.
        is_master: whether this process is actor rank 0 (the sender); verl passes it to actor workers.
        timeout_s: seconds a rank waits for the others at the rendezvous and in each broadcast.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0:
            raise ValueError(f"checkpoint_engine.update_weights_bucket_megabytes must be > 0, got {bucket_size >> 20}")
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout = timedelta(seconds=timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: dist.TCPStore | None = None
        self._group: dist.ProcessGroupGloo | None = None
        self._address: MasterAddress | None = None

    # --- topology ------------------------------------------------------------------------------
    def prepare(self) -> dict:
        """Actor rank 0 picks a free port for this sync's store; every worker reports its metadata."""
        if not self.is_master:
            return {"master": None}
        import ray
        from verl.utils.net_utils import get_free_port

        host = ray.util.get_node_ip_address().strip("[]")
        port, sock = get_free_port(host)
        if sock is not None:
            sock.close()
        self._address = MasterAddress(host, port)
        return {"master": self._address}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """Actor rank 0 is group rank 0, the rollout workers ranks 1..R; other actor ranks sit out (-1)."""
        master = metadata[0]["master"]
        if master is None:
            raise RuntimeError("gloo checkpoint engine: actor rank 0 was not built with is_master=True")
        world = 1 + rollout_world_size
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world] * actor_wg_world_size,
            "master": [master] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, world)),
            "world_size": [world] * rollout_world_size,
            "master": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: MasterAddress) -> None:
        """Join this sync's gloo group (blocks until every member joined)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        self._store = dist.TCPStore(
            master.host,
            master.port,
            world_size,
            is_master=rank == 0,
            timeout=self.timeout,
            wait_for_workers=False,
        )
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)
        logger.info("gloo checkpoint engine: rank %d of %d joined %s:%d", rank, world_size, master.host, master.port)

    def finalize(self) -> None:
        """Drop this sync's group and store (the next sync builds new ones on a new port)."""
        self._group = None
        self._store = None
        self.rank = self.world_size = None

    # --- transfer ------------------------------------------------------------------------------
    def _broadcast(self, tensor: torch.Tensor) -> None:
        assert self._group is not None
        self._group.broadcast(tensor, 0).wait()

    def _send_bucket(self, bucket: torch.Tensor, length: int, meta: dict[str, TensorMeta], is_last: bool) -> None:
        head = _pack({"bucket_meta": meta, "is_last": is_last, "length": length})
        self._broadcast(torch.tensor([head.numel()], dtype=torch.int64))
        self._broadcast(head)
        if length:
            self._broadcast(bucket[:length])

    def _recv_bucket(self) -> tuple[dict, torch.Tensor]:
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        head = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(head)
        meta = pickle.loads(head.numpy().tobytes())
        # a fresh buffer per bucket: the chunks yielded from it stay valid while the consumer holds them
        bucket = torch.empty(meta["length"], dtype=torch.uint8)
        if meta["length"]:
            self._broadcast(bucket)
        return meta, bucket

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps=None):
        """Actor side: rank 0 broadcasts the weights bucket by bucket; other actor ranks walk the
        generator (each weight is gathered collectively over the actor group) and send nothing."""
        if self.rank is None:
            raise RuntimeError("gloo checkpoint engine: send_weights before init_process_group")
        if self.rank < 0:
            for _ in weights:
                pass
            return None
        if self.rank != 0:
            raise RuntimeError(f"gloo checkpoint engine: rollout rank {self.rank} cannot send weights")
        start = time.time()
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        meta: dict[str, TensorMeta] = {}
        offset = total = 0
        async for tensor_meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + tensor_meta.chunk_size > self.bucket_size:
                self._send_bucket(bucket, offset, meta, is_last=False)
                meta, offset = {}, 0
            tensor_meta.offset = offset
            meta[tensor_meta.name] = tensor_meta
            bucket[offset : offset + tensor_meta.chunk_size] = chunk.cpu()
            offset += tensor_meta.chunk_size
            total += tensor_meta.chunk_size
        self._send_bucket(bucket, offset, meta, is_last=True)
        logger.info("gloo checkpoint engine: sent %d bytes in %.2f s", total, time.time() - start)
        return None

    @torch.no_grad()
    async def receive_weights(self, global_steps=None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Rollout side: (name, tensor) pairs, each weight whole again (chunks merged)."""
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        if self.rank is None or self.rank < 1:
            raise RuntimeError(f"gloo checkpoint engine: receive_weights on rank {self.rank} (rollout ranks are >= 1)")
        while True:
            meta, bucket = self._recv_bucket()
            for tensor_meta in meta["bucket_meta"].values():
                yield tensor_meta, bucket[tensor_meta.offset : tensor_meta.offset + tensor_meta.chunk_size]
            if meta["is_last"]:
                return
