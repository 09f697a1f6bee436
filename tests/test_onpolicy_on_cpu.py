"""The old-log-prob shortcut (``recompute_old_log_prob=false``) against the real, patched verl on CPU.

- the PPO loss of verl's ``ppo_loss`` (``verl/workers/utils/losses.py``, patched) and its gradient on a
  tiny torch policy are the same with the shortcut as with ``old_log_probs`` recomputed by a forward
  pass under ``no_grad`` (what ``_compute_old_log_prob`` does), for every policy-loss mode we ship;
- every invalid combination is refused by the patched ``validate_config`` on a composed config and by
  our preflight, each with a message naming the key;
- the generated reference yamls match what verl's generator produces from the patched config.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
verl = pytest.importorskip("verl")

from npu_rl import onpolicy  # noqa: E402
from npu_rl.preflight import run_preflight  # noqa: E402

VERL_ROOT = Path(verl.__file__).resolve().parent.parent
CONFIG_DIR = VERL_ROOT / "verl" / "trainer" / "config"
KEY = "actor_rollout_ref.actor.recompute_old_log_prob"

# On-policy: one optimizer step over the whole batch, GRPO, no KL in reward.
ON_POLICY = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.model.path=/nonexistent/Qwen3-0.6B",
    "trainer.n_gpus_per_node=4",
    "trainer.nnodes=1",
]

# Every invalid combination: (override, text the message must contain).
INVALID = [
    ("actor_rollout_ref.actor.ppo_epochs=2", "ppo_epochs=2"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "ppo_mini_batch_size=4 != data.train_batch_size=16"),
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward=true"),
    ("algorithm.rollout_correction.rollout_is=token", "rollout_correction.rollout_is=token"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "rollout_correction.rollout_rs=token_k1"),
    ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode=true"),
    ("algorithm.adv_estimator=optimal_token_baseline", "adv_estimator=optimal_token_baseline"),
    ("algorithm.adv_estimator=tir_optimal_token_baseline", "adv_estimator=tir_optimal_token_baseline"),
    ("trainer.v1.trainer_mode=colocate_async", "trainer_mode=colocate_async"),
    ("distillation.enabled=true", "distillation.enabled=true"),
]


def compose(*overrides: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose("ppo_trainer", overrides=list(overrides))


def actor_config(recompute: bool, **extra: str):
    from verl.utils.config import omega_conf_to_dataclass

    ov = [*ON_POLICY, f"{KEY}={str(recompute).lower()}"] + [
        f"actor_rollout_ref.actor.{k}={v}" for k, v in extra.items()
    ]
    return omega_conf_to_dataclass(compose(*ov).actor_rollout_ref.actor)


# ---------------------------------------------------------------------------------------------------
# A tiny policy and the batch layout ppo_loss reads (padded prompts/responses, flat per-token outputs).


class TinyPolicy(torch.nn.Module):
    """Next-token model: embedding -> tanh MLP -> vocabulary logits (a real differentiable policy)."""

    def __init__(self, vocab: int = 23, hidden: int = 16, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, vocab))

    def forward(self, flat_tokens: torch.Tensor, seq_lens: list[int]):
        """Per-token log-prob of the next token and entropy, flattened over sequences ((total,), (total,))."""
        logits = self.mlp(self.emb(flat_tokens)).float()
        logp = torch.log_softmax(logits, dim=-1)
        nxt = torch.roll(flat_tokens, -1)
        lp = logp.gather(-1, nxt[:, None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        # the last position of each sequence has no next token (ppo_loss never reads it)
        ends = torch.tensor(seq_lens).cumsum(0) - 1
        keep = torch.ones_like(lp)
        keep[ends] = 0
        return lp * keep, ent


def make_batch(batch: int = 6, prompt: int = 5, max_resp: int = 7, vocab: int = 23, seed: int = 1):
    """Prompts of full length, responses of varied length (right-padded), advantages per sequence."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    resp_lens = torch.randint(2, max_resp + 1, (batch,), generator=g)
    resp_lens[0] = max_resp
    prompts = torch.randint(0, vocab, (batch, prompt), generator=g)
    responses = torch.randint(0, vocab, (batch, max_resp), generator=g)
    response_mask = (torch.arange(max_resp)[None, :] < resp_lens[:, None]).long()
    attention_mask = torch.cat([torch.ones(batch, prompt, dtype=torch.long), response_mask], dim=1)
    flat = torch.cat([torch.cat([prompts[i], responses[i, : resp_lens[i]]]) for i in range(batch)])
    adv = torch.randn(batch, generator=g)[:, None] * response_mask
    td = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "advantages": adv.float(),
        },
        batch_size=[batch],
    )
    seq_lens = (prompt + resp_lens).tolist()
    return td, flat, seq_lens


def loss_and_grad(policy, config, td, flat, seq_lens, old_log_probs=None):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    data = td.clone()
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(td["response_mask"].sum()), global_batch_size=len(td))
    if old_log_probs is not None:
        data["old_log_probs"] = old_log_probs
    policy.zero_grad()
    lp, ent = policy(flat, seq_lens)
    loss, metrics = ppo_loss(copy.deepcopy(config), {"log_probs": lp, "entropy": ent}, data)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in policy.parameters()])
    return loss.detach(), grads, metrics


def recomputed_old_log_probs(policy, td, flat, seq_lens):
    """What the old-log-prob pass produces: the same forward under no_grad, sliced to the response."""
    from verl.workers.utils.padding import no_padding_2_padding

    with torch.no_grad():
        lp, _ = policy(flat, seq_lens)
    return no_padding_2_padding(lp, td).float()


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "clip_cov"])
def test_shortcut_gives_the_same_loss_and_gradient_as_the_recompute(loss_mode):
    td, flat, seq_lens = make_batch()
    policy = TinyPolicy()
    old = recomputed_old_log_probs(policy, td, flat, seq_lens)
    extra = {"policy_loss.loss_mode": loss_mode}
    loss_ref, grad_ref, _ = loss_and_grad(policy, actor_config(True, **extra), td, flat, seq_lens, old)
    loss_skip, grad_skip, metrics = loss_and_grad(policy, actor_config(False, **extra), td, flat, seq_lens)
    assert grad_ref.abs().sum() > 0
    torch.testing.assert_close(loss_skip, loss_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad_skip, grad_ref, rtol=1e-5, atol=1e-7)
    # the recompute pass reported actor/entropy (trainer_base: agg_loss over the batch); the update pass now does
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.workers.utils.padding import no_padding_2_padding

    with torch.no_grad():
        ent = no_padding_2_padding(policy(flat, seq_lens)[1], td)
    cfg = actor_config(True, **extra)
    expect = agg_loss(loss_mat=ent, loss_mask=td["response_mask"], loss_agg_mode=cfg.loss_agg_mode)
    assert metrics["actor/entropy"] is not metrics["actor/entropy_loss"]  # separate Metric objects (they append)
    assert metrics["actor/entropy"].aggregate() == pytest.approx(expect.item(), rel=1e-5)


def test_the_comparison_sees_a_stale_anchor():
    """Sanity of the test itself: old log-probs of other weights (a second mini-batch) change the gradient."""
    td, flat, seq_lens = make_batch()
    policy = TinyPolicy()
    stale = recomputed_old_log_probs(TinyPolicy(seed=5), td, flat, seq_lens)
    _, grad_stale, _ = loss_and_grad(policy, actor_config(True), td, flat, seq_lens, stale)
    _, grad_skip, _ = loss_and_grad(policy, actor_config(False), td, flat, seq_lens)
    assert not torch.allclose(grad_stale, grad_skip, rtol=1e-3, atol=1e-5)


def test_update_pass_reports_the_rollout_mismatch():
    td, flat, seq_lens = make_batch()
    policy = TinyPolicy()
    old = recomputed_old_log_probs(policy, td, flat, seq_lens)
    td["rollout_log_probs"] = (old + 0.1) * td["response_mask"]
    _, _, metrics = loss_and_grad(policy, actor_config(False), td, flat, seq_lens)
    mask = td["response_mask"].bool()
    expect = (old.exp() - (old + 0.1).exp()).abs()[mask]
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(expect.mean().item(), rel=1e-5)
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(expect.max().item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------------
# Invalid combinations: patched validate_config and the preflight refuse each, naming the key.


def _validate(cfg):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_on_policy_config_passes_validate_config():
    _validate(compose(*ON_POLICY, f"{KEY}=false"))
    assert onpolicy.problems(compose(*ON_POLICY, f"{KEY}=false")) == []
    assert onpolicy.recompute_old_log_prob(compose(*ON_POLICY)) is True  # default keeps verl's behaviour


@pytest.mark.parametrize(("override", "text"), INVALID, ids=[o for o, _ in INVALID])
def test_patched_validate_config_refuses_each_invalid_combination(override, text):
    cfg = compose(*ON_POLICY, f"{KEY}=false", override)
    with pytest.raises(ValueError, match="invalid on-policy shortcut") as e:
        onpolicy.check_config(cfg)
    assert KEY in str(e.value) and text in str(e.value)
    # the same rule through verl's own entry point (main_ppo calls validate_config first)
    with pytest.raises(ValueError) as e:
        _validate(cfg)
    assert KEY in str(e.value) and text in str(e.value)
    # and the recompute on: the same override is fine for our rule
    assert onpolicy.problems(compose(*ON_POLICY, override)) == []


PREFLIGHT_BASE = [
    o if not o.startswith("trainer.n_gpus_per_node") else "trainer.n_gpus_per_node=4" for o in ON_POLICY
] + [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.max_model_len=2048",
    'trainer.logger=["console"]',
]
PREFLIGHT_ENV = {"NNODES": "1", "NPUS_PER_NODE": "4", "NPU_RL_DRY_RUN": "1", "NPU_RL_MODEL_META": "Qwen3-0.6B"}


def test_preflight_refuses_every_invalid_combination_at_once():
    invalid = [o for o, _ in INVALID if "distillation" not in o and "adv_estimator=tir" not in o]
    r = run_preflight([*PREFLIGHT_BASE, f"{KEY}=false", *invalid], PREFLIGHT_ENV)
    msgs = "\n".join(p.message for p in r.report.errors if p.key == KEY)
    for override, text in INVALID:
        if override in invalid:
            assert text in msgs, (override, r.render())
    ok = run_preflight([*PREFLIGHT_BASE, f"{KEY}=false"], PREFLIGHT_ENV)
    assert not [p for p in ok.report.errors if KEY in p.key or KEY in p.message], ok.render()
    assert "skip old-log-prob recompute" in dict(ok.plan).get("features on", ""), ok.render()


def test_non_boolean_switch_is_an_error_naming_the_key():
    with pytest.raises(onpolicy.NpuRlError, match=KEY):
        onpolicy.recompute_old_log_prob({"actor_rollout_ref": {"actor": {"recompute_old_log_prob": "maybe"}}})


def test_estimators_reading_old_log_probs_are_found_by_signature():
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    readers = {name for name in ADV_ESTIMATOR_REGISTRY if onpolicy.estimator_reads_old_log_probs(name)}
    assert readers == {"optimal_token_baseline", "tir_optimal_token_baseline"}
    assert not onpolicy.estimator_reads_old_log_probs("grpo")


def test_generated_yamls_match_verls_generator():
    """scripts/generate_trainer_config.sh (upstream, not in the sdist) flattens ppo_trainer.yaml with
    scripts/print_cfg.py --cfg job; the patched _generated_*.yaml must equal that output."""
    for out, arg in [
        ("_generated_ppo_trainer.yaml", []),
        ("_generated_ppo_megatron_trainer.yaml", ["model_engine=megatron"]),
    ]:
        r = subprocess.run(
            [sys.executable, "scripts/print_cfg.py", "--cfg", "job", *arg],
            cwd=VERL_ROOT, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        body = r.stdout[r.stdout.index("\nactor_rollout_ref") + 1 :]
        shipped = (CONFIG_DIR / out).read_text()
        assert shipped.split("\n\n", 1)[1] == body, f"{out} is stale"
        assert "recompute_old_log_prob: true" in shipped


def test_preflight_checks_the_gc_and_progress_variables():
    env = {
        **PREFLIGHT_ENV,
        "NPU_RL_ENGINE_GC": "1",
        "NPU_RL_ENGINE_GC_EVERY": "often",
        "NPU_RL_ROLLOUT_PROGRESS": "1",
        "NPU_RL_ROLLOUT_PROGRESS_INTERVAL": "-5",
    }
    r = run_preflight(PREFLIGHT_BASE, env)
    errs = {p.key: p.message for p in r.report.errors}
    assert errs["NPU_RL_ENGINE_GC_EVERY"] == "NPU_RL_ENGINE_GC_EVERY='often' is not an integer >= 1"
    assert errs["NPU_RL_ROLLOUT_PROGRESS_INTERVAL"].endswith("=-5.0 is not a positive number of seconds")
    ok = run_preflight(PREFLIGHT_BASE, {**PREFLIGHT_ENV, "NPU_RL_ENGINE_GC": "1", "NPU_RL_ROLLOUT_PROGRESS": "1"})
    assert ok.ok, ok.render()
    plan = dict(ok.plan)["features on"]
    assert "no GC pauses in decode steps" in plan and "rollout progress" in plan


def test_engine_gc_is_opt_in_in_every_npu_env_script_and_on_in_the_cpu_main_job():
    # issue 18, item 6: off in the shipped NPU env scripts until a measurement shows a gain
    import subprocess

    from npu_rl import REPO_ROOT

    def gc_value(env_script) -> str:
        script = f'unset NPU_RL_ENGINE_GC; source "{env_script}"; printf "%s" "$NPU_RL_ENGINE_GC"'
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout

    scripts = sorted(REPO_ROOT.glob("recipes/*/env_*.sh"))
    npu = [s for s in scripts if s.parent.name != "qwen3-tiny"]
    assert len(npu) >= 6
    assert {str(s.relative_to(REPO_ROOT)): gc_value(s) for s in npu} == {
        str(s.relative_to(REPO_ROOT)): "0" for s in npu
    }
    assert gc_value(REPO_ROOT / "recipes/qwen3-tiny/env_cpu.sh") == "1"
