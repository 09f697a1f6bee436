"""verl #7487 (HCCL bucket broadcast on the caller's thread) in the installed verl 0.9.1.

Our verl patch 0001 backported it to verl 0.9.0; verl 0.9.1 contains it, so the bump dropped that
patch (docs/maintaining.md) and this test now guards upstream's behaviour. HCCL communicators are
bound to the thread that created them; verl 0.9.0 ran each bucket broadcast in a thread-pool
executor. Since #7487, BroadcastOperation broadcasts on the caller's thread before its constructor
returns. torch_npu does not import on CPU: only ``torch.npu``'s existence is stubbed (what verl
checks before loading the HCCL engine); the process group is a recorder and the metadata travels
over real zeromq sockets.
"""

import asyncio
import importlib
import sys
import threading
import types

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed: run 'bash install_stack.sh --cpu' first")
zmq = pytest.importorskip("zmq")
torch = pytest.importorskip("torch")


class RecordingGroup:
    def __init__(self):
        self.calls = []

    def broadcast(self, tensor, src):
        self.calls.append((threading.current_thread(), tensor.clone(), src))


@pytest.fixture
def hccl_module(monkeypatch):
    import verl.checkpoint_engine.base  # noqa: F401 - import the rest of verl before torch.npu exists

    monkeypatch.setattr(torch, "npu", types.ModuleType("torch.npu"), raising=False)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    name = "verl.checkpoint_engine.hccl_checkpoint_engine"
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def test_broadcast_runs_on_the_calling_thread_before_returning(hccl_module):
    ctx = zmq.Context.instance()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.bind("inproc://npu_rl-hccl-test")
    sub.connect("inproc://npu_rl-hccl-test")
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    group = RecordingGroup()
    bucket = torch.arange(8, dtype=torch.float32)
    meta = {"w": {"shape": (8,)}}

    async def run():
        op = hccl_module.BroadcastOperation(
            rank=0, process_group=group, bucket=bucket, metadata=meta, socket=pub, topic="bucket"
        )
        assert len(group.calls) == 1, "the broadcast must have happened inside the constructor"
        return await op.wait_for_complete()

    try:
        caller = threading.current_thread()
        result = asyncio.run(run())
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
    thread, sent, src = group.calls[0]
    assert thread is caller  # asyncio.run's loop runs on this thread; an executor would not
    assert src == 0 and torch.equal(sent, bucket)
    assert result is meta
