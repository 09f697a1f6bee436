"""SAM in the patched vLLM 0.23 / vllm-ascend 0.23.0.post1 on CPU (issue 6).

The proposer runs against vLLM's real V1 ``InputBatch`` (requests added, tokens written the way
``GPUModelRunner._bookkeeping_sync`` writes them, requests removed and the batch condensed). The
patched code paths of ``GPUModelRunner.__init__`` (drafter construction) and
``propose_draft_token_ids`` are executed from the patched source itself (the runner cannot be built
without an accelerator); vllm-ascend's ``get_spec_decode_method`` likewise, and its ``utils`` module
is imported for real with only ``torch_npu`` stubbed.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

for _mod in ("pybase64", "uvloop", "cpuinfo"):  # vLLM's V1 input batch imports them
    pytest.importorskip(_mod, reason=f"{_mod} is not installed: constraints/cpu.txt lists it: install_stack.sh --cpu")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import SpeculativeConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

from npu_rl import REPO_ROOT  # noqa: E402
from npu_rl.spec_decode.config import DEFAULT_BATCH_SIZE_THRESHOLD, ENV_ALIAS, NO_LIMIT  # noqa: E402
from npu_rl.spec_decode.vllm_proposer import AscendSamProposer, SamProposer  # noqa: E402

MAX_LEN = 64
VLLM_ROOT = Path(vllm.__file__).parent  # the patched vLLM this environment runs


def ascend_root() -> Path:
    root = Path(os.environ.get("NPU_RL_SOURCES") or REPO_ROOT / "sources") / "vllm-ascend"
    if not (root / "vllm_ascend").is_dir():
        pytest.skip(f"{root} is missing: bash download_sources.sh && bash apply_all_patches.sh")
    return root


def vllm_config(**spec_kwargs):
    spec = SpeculativeConfig(method="sam", **{"num_speculative_tokens": 3, **spec_kwargs})
    return SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=MAX_LEN))


def new_batch() -> InputBatch:
    return InputBatch(
        max_num_reqs=4,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=MAX_LEN,
        device=torch.device("cpu"),
        pin_memory=False,
        vocab_size=1000,
        block_sizes=[16],
        kernel_block_sizes=[16],
    )


def add(batch: InputBatch, req_id: str, prompt: list[int], output: list[int] | None = None) -> int:
    req = CachedRequestState(
        req_id=req_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(),
        pooling_params=None,
        mm_features=[],
        block_ids=([],),
        generator=None,
        num_computed_tokens=0,
        output_token_ids=list(output or []),
    )
    return batch.add_request(req)


def bookkeep(batch: InputBatch, sampled: list[list[int]]) -> None:
    """What GPUModelRunner._bookkeeping_sync does with the sampled ids before drafting."""
    for i, ids in enumerate(sampled):
        if not ids:
            continue
        start = int(batch.num_tokens_no_spec[i])
        batch.token_ids_cpu[i, start : start + len(ids)] = ids
        batch.num_tokens_no_spec[i] = start + len(ids)


def remove(batch: InputBatch, req_id: str) -> None:
    """A request leaves the batch as in GPUModelRunner._update_states (remove, condense, refresh)."""
    batch.remove_request(req_id)
    batch.condense()
    batch.refresh_metadata()


def step(proposer, batch: InputBatch, sampled: list[list[int]]) -> list[list[int]]:
    bookkeep(batch, sampled)
    return proposer.propose(batch, sampled)


PROMPT = [10, 11, 12, 13, 14, 10, 11]


def test_speculative_config_keeps_method_sam_and_checks_our_keys(monkeypatch):
    monkeypatch.delenv(ENV_ALIAS, raising=False)
    spec = SpeculativeConfig(method="sam", num_speculative_tokens=3)
    assert spec.method == "sam" and spec.model == "sam"  # not rewritten to ngram, no draft model to load
    assert spec.prompt_lookup_max == 0
    assert SamProposer(vllm_config()).settings.max_batch == DEFAULT_BATCH_SIZE_THRESHOLD
    assert SamProposer(vllm_config(sam_batch_size_threshold="always")).settings.max_batch == NO_LIMIT
    with pytest.raises(ValueError, match="sam_batch_size_threshold='sometimes'"):
        SpeculativeConfig(method="sam", num_speculative_tokens=3, sam_batch_size_threshold="sometimes")
    with pytest.raises(ValueError, match="sam_group_corpus_mb"):
        SpeculativeConfig(method="sam", num_speculative_tokens=3, sam_group_corpus_mb=-1)
    with pytest.raises(ValueError, match="sam_min_match"):
        SpeculativeConfig(method="sam", num_speculative_tokens=3, sam_min_match=0)
    with pytest.raises(ValueError, match="sam_bogus"):
        SpeculativeConfig(method="sam", num_speculative_tokens=3, sam_bogus=1)
    # the reference recipe's variable is an alias; a disagreement names both
    monkeypatch.setenv(ENV_ALIAS, "8")
    assert SamProposer(vllm_config()).settings.max_batch == 8
    with pytest.raises(ValueError, match=ENV_ALIAS):
        SpeculativeConfig(method="sam", num_speculative_tokens=3, sam_batch_size_threshold=16)


def _extract(path: Path, func: str, first_test: str) -> ast.If:
    """The if/elif chain in ``func`` of ``path`` whose first test is ``first_test`` (source text)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            for sub in ast.walk(node):
                if isinstance(sub, ast.If) and ast.unparse(sub.test) == first_test:
                    return sub
    raise LookupError(f"{first_test} in {func} of {path}")


def _run_chain(chain: ast.If, names: dict[str, Any], result: str) -> Any:
    body = textwrap.indent(ast.unparse(chain), "    ")
    src = f"def _chain({', '.join(names)}):\n{body}\n    return {result}\n"
    ns: dict[str, Any] = {"cast": cast, "Any": Any}
    exec(compile(src, "<patched chain>", "exec"), ns)  # noqa: S102 - the patched upstream code under test
    return ns["_chain"](*names.values())


def test_patched_runner_builds_our_drafter_and_calls_it(monkeypatch):
    monkeypatch.delenv(ENV_ALIAS, raising=False)
    runner_py = VLLM_ROOT / "v1" / "worker" / "gpu_model_runner.py"
    init_chain = _extract(runner_py, "__init__", "self.speculative_config.method == 'custom_class'")
    cfg = vllm_config()
    runner = SimpleNamespace(speculative_config=cfg.speculative_config, vllm_config=cfg, device="cpu")
    drafter = _run_chain(init_chain, {"self": runner}, "self.drafter")
    assert type(drafter) is SamProposer  # not the n-gram proposer
    bogus = SimpleNamespace(
        method="bogus", **{m: (lambda: False) for m in dir(cfg.speculative_config) if m.startswith("use")}
    )
    with pytest.raises(ValueError, match="Unknown speculative decoding method: bogus"):
        _run_chain(init_chain, {"self": SimpleNamespace(speculative_config=bogus, vllm_config=cfg)}, "self.drafter")

    propose_chain = _extract(runner_py, "propose_draft_token_ids", "spec_config.method == 'ngram'")
    batch = new_batch()
    add(batch, "a", PROMPT)
    bookkeep(batch, [[12]])
    runner.input_batch, runner.drafter = batch, drafter
    names = {"self": runner, "spec_config": cfg.speculative_config, "sampled_token_ids": [[12]], "slot_mappings": None}
    assert _run_chain(propose_chain, names, "draft_token_ids") == [[13, 14, 10]]


def test_lazy_start_catch_up_gate_and_release():
    proposer = SamProposer(vllm_config(sam_batch_size_threshold=1))
    d = proposer.drafter
    batch = new_batch()
    add(batch, "a", PROMPT)
    assert step(proposer, batch, [[]]) == [[]]  # partial prefill: no state, no draft
    assert "a" not in d
    assert step(proposer, batch, [[12]]) == [[13, 14, 10]]  # "10 11 12" seen before, continue it
    assert d.num_tokens("a") == len(PROMPT) + 1
    # skipped steps: three tokens arrive at once, the drafter catches up from token_ids_cpu
    bookkeep(batch, [[13, 14, 10]])
    assert step(proposer, batch, [[11]]) == [[12, 13, 14]]
    assert d.num_tokens("a") == len(PROMPT) + 5
    # a second request: the running batch (2) is over the gate (1): empty drafts, automata catch up
    add(batch, "b", [7, 8, 9, 7, 8])
    assert step(proposer, batch, [[12], [9]]) == [[], []]
    assert proposer.gated_steps == 1
    assert d.num_tokens("a") == len(PROMPT) + 6 and d.num_tokens("b") == 6
    # "b" leaves (finished): its state goes, and "a" drafts again from the tokens it caught up on
    remove(batch, "b")
    assert step(proposer, batch, [[13]]) == [[14, 10, 11]]
    assert "b" not in d
    remove(batch, "a")
    assert proposer.propose(batch, []) == []
    assert d.request_bytes == 0 and not d.requests  # memory released (drafter's own accounting)
    assert len(d.groups) == 2  # both texts stay in their prompts' group automata (issue 20 drafter)


def test_resume_with_other_tokens_rebuilds_and_siblings_feed_the_group():
    proposer = SamProposer(vllm_config(sam_batch_size_threshold="always"))
    batch = new_batch()
    add(batch, "a", [1, 2, 3])
    for tok in [40, 41, 42, 43, 44, 45]:
        step(proposer, batch, [[tok]])
    remove(batch, "a")  # finished: its response joins the group of prompt [1, 2, 3]
    proposer.propose(batch, [])
    add(batch, "b", [1, 2, 3])  # a sibling (same prompt) drafts from "a"'s response
    assert step(proposer, batch, [[40]]) == [[41, 42, 43]]
    # "b" is preempted and comes back under the same id with different tokens: rebuilt, not corrupted
    remove(batch, "b")
    proposer.propose(batch, [])
    add(batch, "b", [1, 2, 3], output=[50, 51, 50])
    assert step(proposer, batch, [[51]]) == [[50, 51, 50]]
    assert proposer.drafter.num_tokens("b") == 7
    # near max_model_len the draft shrinks to what still fits
    batch.num_tokens_no_spec[0] = MAX_LEN - 3
    batch.token_ids_cpu[0, 7 : MAX_LEN - 3] = 51
    assert len(step(proposer, batch, [[51]])[0]) == 1  # MAX_LEN - (MAX_LEN - 2) - 1


def test_ascend_proposer_reads_the_runner_batch():
    runner = SimpleNamespace(input_batch=new_batch())
    proposer = AscendSamProposer(vllm_config(), runner)
    add(runner.input_batch, "a", PROMPT)
    bookkeep(runner.input_batch, [[12]])
    assert proposer.propose([[12]]) == [[13, 14, 10]]
    assert proposer.dummy_run(8) is None and proposer.load_model(None) is None


@pytest.fixture()
def stub_torch_npu(monkeypatch):
    fake = types.ModuleType("torch_npu")
    fake.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.syspath_prepend(str(ascend_root()))


def _ascend_get_spec_decode_method():
    """vllm-ascend's patched ``get_spec_decode_method``, compiled alone: its module imports every NPU
    proposer (needs torch.npu), so this runs the function's own code."""
    tree = ast.parse((ascend_root() / "vllm_ascend" / "spec_decode" / "__init__.py").read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_spec_decode_method")
    ns: dict[str, Any] = {}
    exec(compile(ast.Module([func], []), "<patched get_spec_decode_method>", "exec"), ns)  # noqa: S102
    return ns["get_spec_decode_method"]


def test_patched_vllm_ascend_dispatches_sam(stub_torch_npu, monkeypatch):
    monkeypatch.delenv(ENV_ALIAS, raising=False)
    root = ascend_root() / "vllm_ascend"
    runner = SimpleNamespace(input_batch=new_batch())
    drafter = _ascend_get_spec_decode_method()("sam", vllm_config(), "cpu", runner)
    assert type(drafter) is AscendSamProposer and drafter.runner is runner
    # NPUModelRunner.propose_draft_token_ids: a "sam" branch calling the drafter with the sampled ids
    runner_src = (root / "worker" / "model_runner_v1.py").read_text()
    chain = _extract(root / "worker" / "model_runner_v1.py", "propose_draft_token_ids", "not self.drafter")
    tests = []
    node: ast.stmt | None = chain
    while isinstance(node, ast.If):
        tests.append((ast.unparse(node.test), ast.unparse(node.body)))
        node = node.orelse[0] if node.orelse else None
    sam = [body for test, body in tests if test == "self.speculative_config.method == 'sam'"]
    assert sam == ["draft_token_ids = self.drafter.propose(valid_sampled_token_ids)"], runner_src.count("sam")
    # the fused MoE decode path stays on for sam (the real module, torch_npu stubbed)
    from vllm_ascend.utils import speculative_enable_dispatch_gmm_combine_decode

    assert speculative_enable_dispatch_gmm_combine_decode(
        SimpleNamespace(speculative_config=SimpleNamespace(method="sam"))
    )


def test_custom_class_cannot_carry_sam_in_the_pinned_engines():
    """Why SAM's glue is a patch and not vLLM 0.23's ``method="custom_class"`` plug-in (issue 20, item 4;
    the vLLM patch's header and docs/spec_decode.md say the same). If a bump changes any of these,
    revisit the glue."""
    # 1. vLLM builds a custom proposer from the config alone (the runner's real build branch, with a
    #    recording factory: nothing else reaches the proposer) and calls it with batch rows only: no
    #    request ids, no prompt lengths, so it cannot follow a request across steps (rows are
    #    condensed and reused) or group siblings by prompt
    runner_py = VLLM_ROOT / "v1" / "worker" / "gpu_model_runner.py"
    built = []

    def factory(*args, **kwargs):
        built.append((args, kwargs))
        return SimpleNamespace()

    cfg = vllm_config()
    spec = SimpleNamespace(method="custom_class")
    runner = SimpleNamespace(speculative_config=spec, vllm_config=cfg, device="cpu")
    init_chain = _extract(runner_py, "__init__", "self.speculative_config.method == 'custom_class'")
    drafter = _run_chain(init_chain, {"self": runner, "create_custom_proposer": factory}, "self.drafter")
    assert built == [((cfg,), {})] and vars(drafter) == {}
    calls = []
    recorder = SimpleNamespace(propose=lambda *args, **kwargs: calls.append((args, kwargs)) or [[]])
    batch = new_batch()
    add(batch, "a", PROMPT)
    runner = SimpleNamespace(input_batch=batch, drafter=recorder)
    propose_chain = _extract(runner_py, "propose_draft_token_ids", "spec_config.method == 'ngram'")
    names = {"self": runner, "spec_config": spec, "sampled_token_ids": [[12]], "slot_mappings": None}
    _run_chain(propose_chain, names, "draft_token_ids")
    ((args, kwargs),) = calls
    assert args == ([[12]], batch.num_tokens_no_spec, batch.token_ids_cpu) and kwargs == {"slot_mappings": None}
    # 2. SpeculativeConfig refuses keys it does not declare: keeping the keys as speculative_config.sam_*
    #    needs the patch (a custom proposer could read vllm_config.additional_config instead; 1 stands)
    with pytest.raises(ValueError, match="not_a_field"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, not_a_field=1)
    # 3. vllm-ascend 0.23 has no custom_class drafter: its dispatch (which our patch extends) refuses it
    with pytest.raises(ValueError, match="Unknown speculative decoding method: custom_class"):
        _ascend_get_spec_decode_method()("custom_class", cfg, "cpu", runner)


@pytest.mark.slow  # two vLLM TP ranks over gloo
def test_only_the_rank_whose_drafts_vllm_takes_runs_the_drafter(tmp_path):
    """Two vLLM tensor-parallel ranks (real ``vllm.distributed`` groups over gloo, one process each)
    under the mp executor: rank 0, the one ``MultiprocExecutor`` takes drafts from, drafts; rank 1
    keeps no drafter and returns empty drafts. The same ranks with external_launcher (every rank
    schedules from its own drafts) both draft."""
    import json
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, sys\n"
        "from types import SimpleNamespace\n"
        "from vllm.distributed import parallel_state as ps\n"
        "rank, port = int(sys.argv[1]), sys.argv[2]\n"
        "ps.init_distributed_environment(world_size=2, rank=rank, local_rank=rank, backend='gloo',\n"
        "                                distributed_init_method=f'tcp://127.0.0.1:{port}')\n"
        "from vllm.config import VllmConfig, set_current_vllm_config\n"
        "with set_current_vllm_config(VllmConfig()):\n"
        "    ps.initialize_model_parallel(tensor_model_parallel_size=2, backend='gloo')\n"
        "from tests.test_spec_decode_vllm_on_cpu import PROMPT, SamProposer, add, new_batch, step, vllm_config\n"
        "out = {}\n"
        "from vllm.config import ParallelConfig\n"
        "for backend in ('mp', 'external_launcher'):\n"
        "    cfg = vllm_config(sam_batch_size_threshold=1)\n"
        "    cfg.parallel_config = ParallelConfig(tensor_parallel_size=2, distributed_executor_backend=backend)\n"
        "    cfg.parallel_config.rank = rank  # as vLLM's WorkerBase sets it\n"
        "    p = SamProposer(cfg)\n"
        "    batch = new_batch()\n"
        "    add(batch, 'a', PROMPT)\n"
        "    out[backend] = [p.drafter is not None, step(p, batch, [[12]]), p.nbytes > 0, p.stats_line()]\n"
        "print('RESULT ' + json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, err[-3000:]
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    (on, drafts0, mem0, _), (off, drafts1, mem1, line1) = results[0]["mp"], results[1]["mp"]
    assert (on, drafts0, mem0) == (True, [[13, 14, 10]], True)
    assert (off, drafts1, mem1) == (False, [[]], False)
    assert "off on this rank" in line1 and "only from rank 0" in line1 and "this is rank 1 of 2" in line1
    for r in results:
        assert r["external_launcher"][:3] == [True, [[13, 14, 10]], True]


@pytest.mark.parametrize(
    ("tp", "pp", "pcp", "drafting_rank"),
    [(1, 1, 1, 0), (2, 1, 1, 0), (1, 2, 1, 1), (2, 2, 1, 2), (4, 2, 1, 4), (2, 1, 2, 0), (2, 2, 2, 4)],
)
def test_drafting_rank_is_the_first_of_the_last_pipeline_stage(tp, pp, pcp, drafting_rank):
    """Under the mp executor exactly one rank of a replica drafts: vLLM numbers ranks with TP fastest,
    then PCP, then PP, and takes drafts from TP and PCP rank 0 of the last PP stage (the expected rank
    is written out here from that layout, not from vLLM's function)."""
    from vllm.config import ParallelConfig

    from npu_rl.spec_decode.vllm_proposer import _drafts_unused_here

    drafting = []
    for rank in range(tp * pp * pcp):
        pc = ParallelConfig(
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            prefill_context_parallel_size=pcp,
            distributed_executor_backend="mp",
        )
        pc.rank = rank
        why = _drafts_unused_here(SimpleNamespace(parallel_config=pc))
        if why is None:
            drafting.append(rank)
        else:
            assert f"only from rank {drafting_rank}" in why and f"this is rank {rank} of {tp * pp * pcp}" in why
    assert drafting == [drafting_rank]


def _expand_reference(values, cu_num_tokens, replace_from, replace_to, num_tokens):
    """What vLLM's Triton ``expand_kernel`` writes: request i's value (``replace_from`` made
    ``replace_to``) at tokens ``cu[i-1]..cu[i]``, read off rejection_sampler.py line by line."""
    out, start = [], 0
    for value, end in zip(values, cu_num_tokens, strict=True):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out + [None] * (num_tokens - len(out))


@pytest.mark.parametrize(
    ("values", "dtype", "replace_from", "replace_to"),
    [
        ([0.7, -1.0, 1.5], torch.float32, -1.0, 1.0),  # temperatures: greedy (-1) expands as 1
        ([3, 0, 7], torch.int32, 0, 151936),  # top-k: 0 (off) expands as the vocabulary
    ],
)
def test_the_cpu_expand_fallback_fills_float_and_int32_outputs(values, dtype, replace_from, replace_to):
    # vllm patch 0006: before it, a float32 or int32 output went to the C++ kernel as an int64 copy and
    # came back uninitialised, so the rejection sampler divided its logits by garbage at T > 0
    from vllm.utils.cpu_triton_utils import _expand_kernel_impl

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    out = torch.full((5,), -123, dtype=dtype)
    _expand_kernel_impl(out, torch.tensor(values, dtype=dtype), cu, replace_from, replace_to)
    assert out.tolist() == pytest.approx(_expand_reference(values, [2, 2, 5], replace_from, replace_to, 5))
