"""verl patch 0002 (random init) against the installed, patched verl.

The engines' real ``_build_megatron_module`` runs; what needs devices and a process group is
replaced: megatron-core's module factory, the rank query and the size print. verl 0.9.1's MindSpeed
engine (``MindspeedEngineWithLMHead``, what ``model_engine=megatron`` runs on NPU) builds its module
through MegatronEngine's, so the one hook covers both; the test runs both classes. The bridge records
whether weights were loaded.
"""

from __future__ import annotations

import types

import pytest

from npu_rl.errors import NpuRlError
from npu_rl.random_init import random_init_enabled

pytest.importorskip("verl", reason="verl is not installed: run 'bash install_stack.sh --cpu' first")
torch = pytest.importorskip("torch")


class RecordingBridge:
    def __init__(self):
        self.loaded = []

    def load_weights(self, module, path):
        self.loaded.append(path)

    def load_hf_weights(self, module, path, allowed_mismatched_params=()):
        self.loaded.append(path)


def _engine(cls, bridge):
    from omegaconf import OmegaConf

    engine = object.__new__(cls)  # no __init__: it would build process groups
    engine.engine_config = OmegaConf.create(
        {
            "forward_only": False,
            "use_distributed_optimizer": True,
            "use_megatron_fsdp": False,
            "override_mcore_model_config": {},
            "override_ddp_config": {},
            "use_dist_checkpointing": False,
        }
    )
    engine.optimizer_config = OmegaConf.create({"optimizer": "adam"})
    engine.model_config = types.SimpleNamespace(
        hf_config=None, local_path="/models/Qwen3-235B-A22B", architectures=["Qwen3MoeForCausalLM"], get=lambda k, d: d
    )
    engine.is_value_model, engine.tf_config, engine.provider, engine.peft_cls = False, object(), None, None
    engine.bridge, engine.vanilla_bridge, engine.enable_routing_replay = bridge, True, False
    return engine


@pytest.fixture
def stubs(monkeypatch):
    import verl.utils.megatron_utils as mu
    import verl.utils.model as vm

    monkeypatch.setattr(mu, "make_megatron_module", lambda **kw: ([torch.nn.Linear(2, 2)], kw["tf_config"]))
    monkeypatch.setattr(vm, "print_model_size", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: 0)


def _engines():
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine
    from verl.workers.engine.mindspeed.transformer_impl import MindspeedEngineWithLMHead  # mindspeed optional

    return [MegatronEngine, MindspeedEngineWithLMHead]


@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_weights_are_loaded_unless_random_init_is_on(stubs, monkeypatch, switch):
    if switch is None:
        monkeypatch.delenv("NPU_RL_RANDOM_INIT", raising=False)
    else:
        monkeypatch.setenv("NPU_RL_RANDOM_INIT", switch)
    for cls in _engines():
        bridge = RecordingBridge()
        module = _engine(cls, bridge)._build_megatron_module()
        assert len(module) == 1
        assert bridge.loaded == ([] if switch == "1" else ["/models/Qwen3-235B-A22B"]), cls.__name__


def test_a_bad_switch_value_is_an_error_naming_it():
    with pytest.raises(NpuRlError, match="NPU_RL_RANDOM_INIT='maybe' is not a boolean"):
        random_init_enabled({"NPU_RL_RANDOM_INIT": "maybe"})
    assert random_init_enabled({}) is False and random_init_enabled({"NPU_RL_RANDOM_INIT": "on"}) is True
