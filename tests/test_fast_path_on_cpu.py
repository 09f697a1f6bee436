"""The rollout's fast path (issue 19): every NPU recipe runs its rollout with ACL graphs and npugraph_ex,
as verl, vLLM and vllm-ascend resolve them (vllm-ascend's NPUPlatform.check_and_update_config run from
sources/vllm-ascend with torch_npu stubbed), and the preflight names the key that turns the fast path off.

Expected values are written out here from what each recipe asks for (its batch, its drafter), not taken
from the code under test: the capture lists are literals, the graph modes the rule of vllm-ascend's docs.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from npu_rl import REPO_ROOT
from npu_rl.preflight import checks, fastpath, run_preflight
from npu_rl.recipes import discover
from tests.dryrun import plan as dry_run
from tests.test_preflight_on_cpu import BASE, ENV_2X16

pytest.importorskip("verl")
pytest.importorskip("vllm")

R = "actor_rollout_ref.rollout"
MODE = f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_mode"
NGE = f"{R}.engine_kwargs.vllm.additional_config.ascend_compilation_config.enable_npugraph_ex"
SIZES = f"{R}.cudagraph_capture_sizes"
RECIPE_32B = (REPO_ROOT / "recipes/qwen3-32b/grpo_32die.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh")
SAM_32B = (REPO_ROOT / "recipes/qwen3-32b/grpo_32die_sam.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh")
UP_TO_256 = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256]
# What each NPU recipe asks of its rollout: graph mode, capture list (requests one vLLM DP rank decodes
# at once = train_batch_size x n / DP ranks, at most max_num_seqs; x (1 + k) tokens with drafts).
EXPECTED = {
    "qwen3-32b/grpo_32die.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 64 x 16 / 4 replicas of TP 8
    "qwen3-32b/dapo_32die.sh": ("FULL_DECODE_ONLY", UP_TO_256),
    "qwen3-32b/grpo_32die_sam.sh": ("FULL", [*UP_TO_256, 320, 384, 512]),  # SAM k=3: 256 x 4, capped at 512
    "qwen3-235b-a22b/grpo_128die.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 512 x 16 / 32 DP ranks
    "qwen3-235b-a22b/dapo_128die.sh": ("FULL_DECODE_ONLY", UP_TO_256),
    # separate pools (docs/async.md): prompt groups in flight x n / the rollout pool's DP ranks
    "qwen3-32b/grpo_32die_fully_async.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 4 x 16 groups x 16 / 4 replicas
    "qwen3-32b/grpo_32die_one_step_off.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 64 x 16 / 4 replicas of TP 4
    "qwen3-235b-a22b/grpo_128die_fully_async.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 256 groups x 16 / 16 DP
    "qwen3-235b-a22b/grpo_128die_random_init.sh": ("FULL_DECODE_ONLY", UP_TO_256),
    "qwen3-30b-a3b/grpo_16die.sh": ("FULL_DECODE_ONLY", UP_TO_256),  # 128 x 8 / 4 DP ranks
    "qwen3-30b-a3b/grpo_16die_sam.sh": ("FULL", [*UP_TO_256, 320, 384, 512]),  # SAM k=4: 256 x 5, capped at 512
    "qwen3-8b/grpo_gsm8k.sh": ("FULL_DECODE_ONLY", [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]),  # 128 x 8 / 8
    "qwen3-0.6b/grpo_gsm8k_smoke.sh": ("FULL_DECODE_ONLY", [1, 2, 4, 8, 16]),  # 64 x 4 / 16
    "qwen3-0.6b/grpo_gsm8k_smoke_onpolicy.sh": ("FULL_DECODE_ONLY", [1, 2, 4, 8, 16]),
}
NPU_RECIPES = [(r, e) for r, e in discover() if r.parent.name != "qwen3-tiny"]


def test_every_npu_recipe_is_listed_here():
    assert sorted(f"{r.parent.name}/{r.name}" for r, _ in NPU_RECIPES) == sorted(EXPECTED)


@pytest.mark.parametrize(("recipe", "env"), NPU_RECIPES, ids=[f"{r.parent.name}/{r.name}" for r, _ in NPU_RECIPES])
def test_recipe_dry_run_shows_graph_mode_and_npugraph_ex_on(recipe, env):
    rc, out, facts = dry_run(recipe, env)
    assert rc == 0, out
    mode, sizes = EXPECTED[f"{recipe.parent.name}/{recipe.name}"]
    fast = facts["fast_path"]
    assert fast["mode"] == mode, out
    assert fast["compilation"] == "VLLM_COMPILE"
    assert fast["npugraph_ex"] is True, out
    assert fast["capture_sizes"] == sizes
    assert fast["error"] == ""
    # the plan's label column is as wide as its longest label (wider in the separate-pool plans)
    assert re.search(rf"rollout graphs +{mode} \(VLLM_COMPILE\), npugraph_ex on; {len(sizes)} capture size\(s\)", out)
    # nothing about the fast path is left to warn about in a shipped recipe
    for word in ("npugraph_ex is off", "runs eager", "cudagraph_capture_sizes: left", "uniform decode"):
        assert word not in out, out


def test_enforce_eager_gets_the_warning_with_the_fix():
    rc, out, facts = dry_run(*RECIPE_32B, f"{R}.enforce_eager=True")
    assert rc == 0, out
    assert facts["fast_path"]["mode"] == "NONE" and facts["fast_path"]["npugraph_ex"] is False
    assert "rollout graphs  eager (cudagraph_mode NONE, enforce_eager): no ACL graphs, no npugraph_ex" in out
    assert f"warning: {R}.enforce_eager: the rollout runs eager on NPU (enforce_eager=True)" in out
    assert f"fix: set {R}.enforce_eager=False and '+{MODE}=FULL_DECODE_ONLY'" in out


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_a_piecewise_mode_turns_npugraph_ex_off_and_is_named(mode):
    # the recipe adds the key with '+', so the override is the plain form
    rc, out, facts = dry_run(*RECIPE_32B, f"{MODE}={mode}")
    assert rc == 0, out
    assert facts["fast_path"]["mode"] == mode and facts["fast_path"]["npugraph_ex"] is False
    assert (
        f"warning: {MODE}: npugraph_ex is off on NPU: cudagraph_mode {mode} (set by the recipe) needs piecewise" in out
    )
    assert f"fix: '+{MODE}=FULL_DECODE_ONLY' (or {MODE}=FULL_DECODE_ONLY where the recipe sets it)" in out


def test_verls_default_mode_is_named_as_the_cause():
    # BASE sets no compilation_config: verl's FULL_AND_PIECEWISE default (vllm_async_server.py:310)
    r = run_preflight(list(BASE), ENV_2X16)
    p = {w.key: w for w in r.report.warnings}[MODE]
    assert "cudagraph_mode FULL_AND_PIECEWISE (verl's default, vllm_async_server.py:310)" in p.message
    assert r.facts["fast_path"]["npugraph_ex"] is False
    assert r.ok


def test_npugraph_ex_switched_off_in_a_full_mode_is_named_and_the_ascend_config_is_not_reused():
    off = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY", f"+{NGE}=False"], ENV_2X16)
    p = {w.key: w for w in off.report.warnings}[NGE]
    assert "npugraph_ex is off on NPU: it is switched off" in p.message
    assert p.fix.startswith(f"drop {NGE}")
    # the same process again without the switch: vllm-ascend's cached AscendConfig must not carry it over
    on = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY"], ENV_2X16)
    assert on.facts["fast_path"]["npugraph_ex"] is True
    assert NGE not in {w.key for w in on.report.warnings}


def test_sam_with_full_decode_only_is_warned(monkeypatch):
    monkeypatch.setenv("ROLLOUT_GRAPH_MODE", "FULL_DECODE_ONLY")
    rc, out, facts = dry_run(*SAM_32B)
    assert rc == 0, out
    assert facts["fast_path"]["mode"] == "FULL_DECODE_ONLY"
    assert f"warning: {MODE}: FULL_DECODE_ONLY replays a graph only for uniform decode batches" in out
    assert f"fix: set {MODE}=FULL" in out


def test_the_default_capture_list_is_warned_with_a_short_one():
    r = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY", f"{R}.max_num_seqs=128"], ENV_2X16)
    p = {w.key: w for w in r.report.warnings}[SIZES]
    assert "left to the default list: 19 ACL graphs" in p.message  # 1, 2, 4, 8, ..., 128 in steps of 8
    assert f"set {SIZES}='[1,2,4,8,16,24,32,48,64,96,128]'" in p.fix
    r = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY", f"{SIZES}=[1,8,64]"], ENV_2X16)
    assert r.facts["fast_path"]["capture_sizes"] == [1, 8, 64]
    assert SIZES not in {w.key for w in r.report.warnings}


def test_task_queue_2_in_the_rollout_is_refused_and_verls_rollout_variable_is_the_fix():
    full = [*BASE, f"+{MODE}=FULL_DECODE_ONLY"]
    r = run_preflight(full, {**ENV_2X16, "TASK_QUEUE_ENABLE": "2"})
    p = {e.key: e for e in r.report.errors}["TASK_QUEUE_ENABLE"]
    assert "cannot be combined with ACL graph" in p.message
    assert "VLLM_ASCEND_TASK_QUEUE_ENABLE=1" in p.fix
    # verl's NPU platform gives the rollout VLLM_ASCEND_TASK_QUEUE_ENABLE as its TASK_QUEUE_ENABLE
    r = run_preflight(full, {**ENV_2X16, "TASK_QUEUE_ENABLE": "2", "VLLM_ASCEND_TASK_QUEUE_ENABLE": "1"})
    assert r.ok, r.render()
    assert r.facts["fast_path"]["task_queue"] == "1"
    # eager: nothing to combine with
    r = run_preflight([*BASE, f"{R}.enforce_eager=True"], {**ENV_2X16, "TASK_QUEUE_ENABLE": "2"})
    assert "TASK_QUEUE_ENABLE" not in {e.key for e in r.report.errors}


def test_weight_nz_mode_with_sleep_mode_is_refused():
    full = [*BASE, f"+{MODE}=FULL_DECODE_ONLY"]
    r = run_preflight(full, {**ENV_2X16, "VLLM_ASCEND_ENABLE_NZ": "1"})
    p = {e.key: e for e in r.report.errors}["VLLM_ASCEND_ENABLE_NZ"]
    assert "NPUWorker.wake_up refuses FRACTAL_NZ weights" in p.message
    # unset: verl sets VLLM_ASCEND_ENABLE_NZ=0 for the rollout (VLLM_ASCEND_REQUIRED_ENV_VARS)
    r = run_preflight(full, ENV_2X16)
    assert r.facts["fast_path"]["weight_nz_mode"] == 0
    # additional_config wins over the variable (AscendConfig._get_config_value)
    key = f"{R}.engine_kwargs.vllm.additional_config.weight_nz_mode"
    r = run_preflight([*full, f"+{key}=0"], {**ENV_2X16, "VLLM_ASCEND_ENABLE_NZ": "1"})
    assert "VLLM_ASCEND_ENABLE_NZ" not in {e.key for e in r.report.errors}, r.render()
    r = run_preflight([*full, f"+{key}=2"], ENV_2X16)
    assert key in {e.key for e in r.report.errors}
    # without sleep mode nothing wakes up
    r = run_preflight([*full, f"+{R}.enable_sleep_mode=False"], {**ENV_2X16, "VLLM_ASCEND_ENABLE_NZ": "1"})
    assert "VLLM_ASCEND_ENABLE_NZ" not in {e.key for e in r.report.errors}


def test_the_graph_pool_is_counted_beside_vllms_share():
    # everything offloaded, vLLM asks for 0.997 x 64 GiB = 63.81 GiB: fits eager, not with the graph pool
    offload = [*BASE, f"{R}.gpu_memory_utilization=0.997"]
    eager = run_preflight([*offload, f"{R}.enforce_eager=True"], ENV_2X16)
    assert f"{R}.gpu_memory_utilization" not in {e.key for e in eager.report.errors}, eager.render()
    graphs = run_preflight([*offload, f"+{MODE}=FULL_DECODE_ONLY"], ENV_2X16)
    p = {e.key: e for e in graphs.report.errors}[f"{R}.gpu_memory_utilization"]
    assert "its ACL graph pool needs ~0.44 GiB beside it" in p.message


def test_the_fast_path_is_replayed_with_the_reused_verdict(tmp_path):
    env = {**ENV_2X16, "NPU_RL_CACHE": str(tmp_path)}
    args = [*BASE, f"+{MODE}=FULL_DECODE_ONLY", f"{SIZES}=[1,2,4]"]
    first, again = run_preflight(args, env), run_preflight(args, env)
    assert "checks run now" in dict(first.plan)["library checks"]
    assert "reused" in dict(again.plan)["library checks"]
    assert dict(again.plan)["rollout graphs"] == dict(first.plan)["rollout graphs"]
    assert again.facts["fast_path"] == first.facts["fast_path"]
    assert again.facts["fast_path"]["capture_sizes"] == [1, 2, 4]


def test_the_cpu_recipe_has_no_fast_path_line():
    r = run_preflight([*BASE, "trainer.device=cpu"], {**ENV_2X16, "VERL_PLATFORM": "cpu"})
    assert "rollout graphs" not in dict(r.plan)


@pytest.mark.parametrize(
    ("seqs", "decode", "expected"),
    [
        (256, 1, UP_TO_256),
        (256, 4, [*UP_TO_256, 320, 384, 512]),
        (100, 1, [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100]),
        (1, 1, [1]),
        (3, 2, [1, 2, 4, 6]),
        (1000, 8, [*UP_TO_256, 320, 384, 512]),
    ],
)
def test_capture_sizes_in_python_and_in_the_recipes_bash_helper(seqs, decode, expected):
    assert fastpath.capture_sizes(seqs, decode) == expected
    script = f'source "{REPO_ROOT}/internal/verl.sh"; verl::capture_sizes {seqs} {decode}'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == expected


def test_fast_path_helper_picks_full_for_drafts_and_refuses_bad_numbers():
    def run(args: str, env: str = "") -> subprocess.CompletedProcess:
        script = (
            f'source "{REPO_ROOT}/internal/verl.sh"; {env} verl::fast_path {args} && printf "%s\\n" "${{FAST_PATH[@]}}"'
        )
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)

    out = run("1024 4 256").stdout.splitlines()
    assert out == [f"+{MODE}=FULL_DECODE_ONLY", f"{SIZES}=[1,2,4,8,16,24,32,48,64,96,128,160,192,256]"]
    assert run("1024 4 256", "SPEC_TOKENS=3").stdout.splitlines()[0] == f"+{MODE}=FULL"
    assert run("1024 4 256", "SPEC_TOKENS=3 ROLLOUT_GRAPH_MODE=FULL_DECODE_ONLY").stdout.startswith(
        f"+{MODE}=FULL_DECODE_ONLY"
    )
    assert run("256 16 256").stdout.splitlines()[1] == f"{SIZES}=[1,2,4,8,16]"
    for bad in ("x 4 256", "1024 0 256", "1024 4"):
        r = run(bad)
        assert r.returncode == 2 and "verl::fast_path" in r.stderr, bad


def test_device_type_follows_vllm_ascends_soc_mapping():
    assert fastpath.device_type({}) == "A3"
    assert fastpath.device_type({"SOC_VERSION": "ascend910_9391"}) == "A3"
    assert fastpath.device_type({"SOC_VERSION": "ascend910b1"}) == "A2"
    assert fastpath.device_type({"SOC_VERSION": "Ascend310P3"}) == "_310P"


def test_docker_image_installs_the_jemalloc_the_235b_env_preloads():
    dockerfile = (REPO_ROOT / "docker/Dockerfile").read_text()
    env = (REPO_ROOT / "recipes/qwen3-235b-a22b/env_8node.sh").read_text()
    assert "yum install -y git gcc gcc-c++ make jemalloc" in dockerfile
    assert "test -f /usr/lib64/libjemalloc.so.2" in dockerfile
    assert 'NPU_RL_JEMALLOC="${NPU_RL_JEMALLOC:-/usr/lib64/libjemalloc.so.2}"' in env


def test_env_script_preloads_jemalloc_only_where_it_exists(tmp_path):
    lib = tmp_path / "libjemalloc.so.2"
    env_script = REPO_ROOT / "recipes/qwen3-235b-a22b/env_8node.sh"

    def preload(jemalloc: str, before: str = "") -> str:
        show = 'printf "%s" "${LD_PRELOAD:-}"'
        script = f'LD_PRELOAD="{before}"; NPU_RL_JEMALLOC="{jemalloc}"; source "{env_script}"; {show}'
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout

    assert preload(str(lib)) == ""  # missing file: nothing preloaded
    lib.write_bytes(b"")
    assert preload(str(lib)) == str(lib)
    assert preload(str(lib), "/x.so") == f"{lib}:/x.so"
    assert preload(str(lib), f"{lib}") == str(lib)  # not twice


def test_memory_estimate_keeps_the_graph_pool_in_training_too():
    r = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY"], ENV_2X16)
    assert "ACL graph pool ~0.44 GiB (held while training)" in dict(r.plan)["memory/die"]
    assert checks.MemoryEstimate(1, 1, 1, 0, 1, 1, 1).graph == 0.0


def test_vllms_registries_are_vllms_own_after_the_npu_platform_ran():
    from vllm.model_executor.layers import quantization

    before = (list(quantization.QUANTIZATION_METHODS), dict(quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG))
    r = run_preflight([*BASE, f"+{MODE}=FULL_DECODE_ONLY"], {**ENV_2X16, "NPU_RL_PREFLIGHT_CACHE": "0"})
    assert r.facts["fast_path"]["npugraph_ex"] is True
    # vllm-ascend registers "ascend" and its own "fp8" config while it is imported; none of it stays
    assert (list(quantization.QUANTIZATION_METHODS), dict(quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG)) == before
    assert "ascend" not in quantization.QUANTIZATION_METHODS
    # and its own method is still known to it the next time (its modules are not imported again)
    assert run_preflight([*BASE, f"{R}.quantization=ascend"], ENV_2X16).ok
