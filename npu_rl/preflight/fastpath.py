"""The rollout's fast path as the pinned code resolves it (issue 19): graph mode, npugraph_ex, capture sizes.

The rollout's decode speed on Ascend comes from ACL graphs, and most from npugraph_ex (vllm-ascend's
FX-graph backend that optimizes a graph before ACL captures it). Three libraries decide whether a run
gets them, each in its own code:

1. **verl** fills the engine's ``compilation_config``: ``cudagraph_mode`` defaults to
   ``FULL_AND_PIECEWISE``, ``rollout.cudagraph_capture_sizes`` becomes its capture list
   (``vllm_async_server.py:307-324``); :func:`npu_rl.preflight.libraries.server_args` runs that step.
2. **vLLM**'s ``VllmConfig.__post_init__`` resolves the compilation mode, turns graphs off for
   ``enforce_eager`` and builds the capture list (``vllm/config/vllm.py``), asking the platform for
   its defaults (``apply_config_platform_defaults``: vllm-ascend caps the list at
   ``min(max_num_seqs x (1 + K), 512)``).
3. **vllm-ascend**'s ``NPUPlatform.check_and_update_config`` (``vllm_ascend/platform.py:450-800``) keeps
   npugraph_ex only in ``FULL`` and ``FULL_DECODE_ONLY`` and turns it (and static kernels) off in
   ``NONE`` and in every mode that needs piecewise compilation; it refuses ACL graphs with
   ``ASCEND_LAUNCH_BLOCKING=1``.

:func:`resolve` builds the engine config the way the rollout server does, with vLLM's platform set to
vllm-ascend's ``NPUPlatform`` (imported from ``sources/vllm-ascend`` with ``torch_npu`` stubbed, the
device type the SoC's build would write into ``vllm_ascend/_build_info.py``), so steps 2 and 3 run as
written. Two things of the real start-up are left out and said so: vllm-ascend's global patches of vLLM
(``pre_register_and_update``, which rewrites vLLM classes in the process) and everything that asks the
device (memory, streams). :func:`judge` turns the result into the plan's line and into findings: the
key that turned the fast path off and the fix.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from npu_rl.preflight.checks import R, plain, sel

VLLM_KW = f"{R}.engine_kwargs.vllm"
MODE_KEY = f"{VLLM_KW}.compilation_config.cudagraph_mode"
NPUGRAPH_EX_KEY = f"{VLLM_KW}.additional_config.ascend_compilation_config.enable_npugraph_ex"
SIZES_KEY = f"{R}.cudagraph_capture_sizes"
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
# Drafters whose proposals vary in length per request (empty or short drafts): their decode batches
# are not uniform (1 + K tokens for every request), which FULL_DECODE_ONLY needs to replay a graph
# (vllm_ascend/worker/model_runner_v1.py:2956-2963).
VARIABLE_DRAFTERS = ("sam", "ngram", "suffix", "ngram_gpu", "custom_class")
# The largest capture size vllm-ascend sets by default (platform.py:207-241: min(max_num_seqs x
# decode length, 512)); the recipes' lists stop there too.
MAX_CAPTURE = 512
# Graph pool sizes that vllm-ascend reported on A3 with its default capture lists (public logs of its
# worker's "GiB for NPU graph memory" line): 0.23 GiB (vllm-ascend issue 11514, TP 8) and 0.44 GiB
# (issue 10700, DP x TP x EP). Not derivable from the model on CPU: the preflight reserves the larger,
# scaled by the share of the default list's graphs a run captures, and the run's log gives the figure.
GRAPH_POOL_ANCHOR_GIB = 0.44
DEFAULT_GRAPHS_AT_256 = 35  # vLLM's default list up to 256: 1, 2, 4, then every 8 (vllm/config/vllm.py)


@dataclass
class FastPath:
    """The rollout's compilation settings after verl, vLLM and vllm-ascend (one engine, replica 0)."""

    device: str  # vllm-ascend's device type the run was resolved for: "A3", "A2"
    requested: str  # the cudagraph_mode verl hands vLLM (after its default)
    mode: str  # CUDAGraphMode in effect
    compilation: str  # CompilationMode in effect
    npugraph_ex: bool
    static_kernel: bool
    capture_sizes: list[int] = field(default_factory=list)  # tokens per step, ascending
    eager: bool = False  # enforce_eager
    spec_method: str = ""  # speculative decoding method ("" without)
    spec_tokens: int = 0  # num_speculative_tokens
    weight_nz_mode: int = 0  # vllm-ascend's AscendConfig.weight_nz_mode
    task_queue: str = ""  # TASK_QUEUE_ENABLE the rollout runs with (verl's NPU platform's rollout env)
    error: str = ""  # what the pinned code refused (the run would not start), "" if nothing

    @property
    def graphs(self) -> bool:
        return self.mode != "NONE"

    @property
    def graph_gib(self) -> float:
        """Estimated graph pool per die (GiB): :data:`GRAPH_POOL_ANCHOR_GIB` scaled by the number of
        captured sizes against vLLM's default list (floor: a quarter of the anchor); 0 without graphs."""
        if not self.graphs or not self.capture_sizes:
            return 0.0
        share = max(len(self.capture_sizes) / DEFAULT_GRAPHS_AT_256, 0.25)
        return round(GRAPH_POOL_ANCHOR_GIB * share, 2)

    @property
    def summary(self) -> str:
        """A few words for the README's recipe table: the graph mode and whether npugraph_ex is on."""
        if self.error:
            return "graphs: refused"
        if not self.graphs:
            return "eager"
        return f"{self.mode}{' + npugraph_ex' if self.npugraph_ex else ''}"

    def line(self) -> str:
        """The plan's ``rollout graphs`` line."""
        if self.error:
            return f"not resolved: {self.error}"
        if not self.graphs:
            eager = ", enforce_eager" if self.eager else ""
            return f"eager (cudagraph_mode NONE{eager}): no ACL graphs, no npugraph_ex"
        sizes = self.capture_sizes
        shown = ",".join(map(str, sizes)) if len(sizes) <= 12 else f"{','.join(map(str, sizes[:6]))},...,{sizes[-1]}"
        spec = f", drafts {self.spec_method} K={self.spec_tokens}" if self.spec_method else ""
        return (
            f"{self.mode} ({self.compilation}), npugraph_ex {'on' if self.npugraph_ex else 'OFF'}"
            f"{', static kernels' if self.static_kernel else ''}; {len(sizes)} capture size(s) [{shown}]{spec}; "
            f"graph pool ~{self.graph_gib:.2f} GiB/die (estimate; held while training); resolved for {self.device}"
        )

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping | None) -> FastPath | None:
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(**data)
        except TypeError:
            return None


def device_type(env: Mapping[str, str]) -> str:
    """The Ascend device the run targets, as vllm-ascend's ``setup.py`` (``gen_build_info``) maps
    ``SOC_VERSION``: 910b* -> A2, 310p -> _310P, anything else (910_93xx, 910c, unset) -> A3."""
    soc = env.get("SOC_VERSION", "").lower()
    if "310p" in soc:
        return "_310P"
    if soc.startswith(("910b", "ascend910b")):
        return "A2"
    return "A3"


def capture_sizes(max_seqs: int, decode_len: int = 1, cap: int = MAX_CAPTURE) -> list[int]:
    """A short capture list for one vLLM DP rank: 1, 2, 4, 8, 16, 24, 32, then steps of about a third
    (48, 64, 96, 128, 160, 192, 256, 320, 384, 512), up to ``max_seqs x decode_len`` tokens (capped at
    ``cap``), that limit itself included. The same rule as ``verl::capture_sizes`` in internal/verl.sh.

    A decode step of B requests with K drafted tokens each is ``B x (1 + K)`` tokens; the padding to the
    next size wastes at most a third of a step (vLLM's default list, every 8 up to 256, captures 35
    graphs for the same range and holds their pool while training).

    Raises:
        ValueError: ``max_seqs`` or ``decode_len`` below 1.
    """
    if max_seqs < 1 or decode_len < 1:
        raise ValueError(f"capture_sizes needs max_seqs >= 1 and decode_len >= 1, got {max_seqs}, {decode_len}")
    top = min(max_seqs * decode_len, cap)
    ladder = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512]
    sizes = [s for s in ladder if s < top]
    return [*sizes, top]


# ----------------------------------------------------------------------------------------------------------
# resolving with the pinned code
# ----------------------------------------------------------------------------------------------------------


def resolve(built, cfg, env: Mapping[str, str], device: str) -> FastPath:
    """The effective compilation settings of ``built``'s engine arguments on an Ascend ``device``:
    ``AsyncEngineArgs.create_engine_config()`` with vllm-ascend's ``NPUPlatform`` as vLLM's platform.

    ``built`` is :class:`npu_rl.preflight.libraries.Built` once the engine arguments parsed (``parsed_args``
    set; built again from them, since ``create_engine_config`` changes its arguments). A refusal by vLLM
    or vllm-ascend is returned in ``FastPath.error`` (with what was resolved up to there); a failure of the
    stand-in itself (an import the stub cannot satisfy) raises.

    Raises:
        RuntimeError: vllm-ascend could not be imported or the platform could not be swapped in here.
    """
    from vllm.usage.usage_lib import UsageContext

    from npu_rl.preflight.libraries import ASCEND_SOURCES, stub_torch_npu

    if not (ASCEND_SOURCES / "vllm_ascend" / "platform.py").is_file():
        raise RuntimeError(f"vllm-ascend's sources are not at {ASCEND_SOURCES} (bash download_sources.sh)")
    # as parsed: create_engine_config changes its AsyncEngineArgs (DP ranks, load-balancing mode)
    engine_args = copy.deepcopy(built.parsed_args)
    if not built.model_here:
        # A quantization method reads the model's own files (vllm-ascend's ModelSlim config looks for
        # quant_model_description.json), which a dry run without the model does not have; the method
        # name itself was judged by NPUPlatform.verify_quantization. It does not change graph settings.
        engine_args.quantization = None
    rollout_env = rollout_environment(cfg, env)
    fast = start(built, rollout_env, device)
    with stub_torch_npu() as stub, _npu_namespace(stub):
        os.environ.update(rollout_env)
        build_info = types.ModuleType("vllm_ascend._build_info")
        build_info.__device_type__ = device  # what setup.py writes for the SoC (gen_build_info)
        sys.modules["vllm_ascend._build_info"] = build_info
        try:
            from vllm_ascend.ascend_config import get_ascend_config
            from vllm_ascend.platform import NPUPlatform
        except Exception as e:  # noqa: BLE001 - an import failure says nothing about the recipe
            raise RuntimeError(f"vllm-ascend did not import with a stub torch_npu: {type(e).__name__}: {e}") from e

        class _Platform(NPUPlatform):
            @classmethod
            def pre_register_and_update(cls, parser=None) -> None:
                """Left out: its global patches rewrite vLLM's classes in this process (utils.adapt_patch)."""

        with _platform(_Platform()):
            try:
                vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
            except (ValueError, AssertionError, NotImplementedError, TypeError) as e:
                from npu_rl.preflight.libraries import _error_text

                fast.error = _error_text(e)
                return fast
        return read(vllm_config, fast, get_ascend_config().weight_nz_mode)


def read(vllm_config, fast: FastPath, weight_nz_mode) -> FastPath:
    """Fill ``fast`` from a ``VllmConfig`` that vllm-ascend's platform has updated (here, or for real on
    an NPU head node, where :func:`npu_rl.preflight.libraries.check_libraries` built it)."""
    cc = vllm_config.compilation_config
    ascend = (vllm_config.additional_config or {}).get("ascend_compilation_config", {})
    fast.mode = cc.cudagraph_mode.name
    fast.compilation = getattr(cc.mode, "name", str(cc.mode))
    fast.npugraph_ex = bool(ascend.get("enable_npugraph_ex", False))
    fast.static_kernel = bool(ascend.get("enable_static_kernel", False))
    fast.capture_sizes = sorted(cc.cudagraph_capture_sizes or []) if fast.graphs else []
    fast.weight_nz_mode = int(weight_nz_mode or 0)
    return fast


def start(built, rollout_env: Mapping[str, str], device: str) -> FastPath:
    """What is known before vLLM and vllm-ascend resolve anything: verl's requested mode, the drafter."""
    spec = built.engine_args.speculative_config or {}
    spec = json.loads(spec) if isinstance(spec, str) else dict(spec)
    return FastPath(
        device=device,
        requested=str(json.loads(built.args.get("compilation_config") or "{}").get("cudagraph_mode", "")),
        mode="",
        compilation="",
        npugraph_ex=False,
        static_kernel=False,
        eager=bool(built.engine_args.enforce_eager),
        spec_method=str(spec.get("method") or ""),
        spec_tokens=int(spec.get("num_speculative_tokens") or 0),
        task_queue=rollout_env.get("TASK_QUEUE_ENABLE", ""),
    )


def rollout_environment(cfg, env: Mapping[str, str]) -> dict[str, str]:
    """The variables vllm-ascend reads in the rollout's processes: the job's ``VLLM_*`` / ``ASCEND_*`` /
    ``TASK_QUEUE_ENABLE`` (``ray_kwargs.ray_init.runtime_env.env_vars`` over the job's, as main_ppo merges
    them into every actor), what verl's NPU platform adds for the rollout (``rollout_env_vars``:
    ``VLLM_ASCEND_TASK_QUEUE_ENABLE`` becomes the rollout's ``TASK_QUEUE_ENABLE``), and the defaults
    verl's worker extension sets when unset (``VLLM_ASCEND_REQUIRED_ENV_VARS``: ``VLLM_ASCEND_ENABLE_NZ=0``)."""
    from verl.workers.rollout.vllm_rollout.utils import VLLM_ASCEND_REQUIRED_ENV_VARS

    from npu_rl.preflight.libraries import environ

    merged = {**env, **{k: str(v) for k, v in (plain(sel(cfg, RUNTIME_ENV, {}) or {})).items()}}
    job = {
        k: v
        for k, v in merged.items()
        if k.startswith(("VLLM_", "ASCEND_", "PYTORCH_NPU_", "HCCL_")) or k in ("TASK_QUEUE_ENABLE", "SOC_VERSION")
    }
    with environ(job):
        from verl.plugin.platform.platform_npu import PlatformNPU

        job.update(PlatformNPU.rollout_env_vars(PlatformNPU.__new__(PlatformNPU)))
    for key, value in VLLM_ASCEND_REQUIRED_ENV_VARS.items():
        job.setdefault(key, value)
    return job


@contextlib.contextmanager
def _npu_namespace(stub: types.ModuleType) -> Iterator[None]:
    """``torch.npu`` while vllm-ascend imports (torch_npu registers it; annotations such as
    ``torch.npu.Stream | None`` are read at class creation) and the ``npu`` device name torch_npu gives
    torch's PrivateUse1 backend (vLLM's ``DeviceConfig`` builds ``torch.device("npu")``). Every attribute
    of the namespace is a class that refuses to be instantiated: nothing may run on the device here.
    The rename cannot be undone in a process (torch allows one name); ``torch.npu`` is removed after."""
    import torch

    def _missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def _refuse(cls, *args, **kwargs):
            raise RuntimeError(f"torch.npu.{name} was called in the preflight, which has no NPU")

        return type(name, (), {"__new__": _refuse, "__module__": "torch.npu"})

    npu = types.ModuleType("torch.npu", "npu-rl preflight stand-in for torch_npu's torch.npu")
    npu.__getattr__ = _missing
    backend = torch._C._get_privateuse1_backend_name()
    if backend not in ("privateuseone", "npu"):
        raise RuntimeError(f"torch's PrivateUse1 backend is already named {backend!r}: cannot stand in for torch_npu")
    if backend == "privateuseone":
        torch.utils.rename_privateuse1_backend("npu")
    had = "npu" in vars(torch)
    old = vars(torch).get("npu")
    torch.npu = npu
    stub.npu = npu
    try:
        yield
    finally:
        if had:
            torch.npu = old
        else:
            del torch.npu


@contextlib.contextmanager
def _platform(platform) -> Iterator[None]:
    """vLLM's ``current_platform`` is ``platform`` for the block: the lazy global of ``vllm.platforms`` and
    every ``vllm`` module that bound it at import (``from vllm.platforms import current_platform``)."""
    import vllm.platforms as platforms

    old = platforms.current_platform
    bound = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "vllm" or name.startswith("vllm.")) or name == "vllm.platforms":
            continue
        if vars(module).get("current_platform") is old:
            bound.append(module)
    platforms._current_platform = platform
    for module in bound:
        module.current_platform = platform
    try:
        yield
    finally:
        platforms._current_platform = old
        for module in bound:
            module.current_platform = old


# ----------------------------------------------------------------------------------------------------------
# findings
# ----------------------------------------------------------------------------------------------------------


def judge(fast: FastPath, cfg, found) -> None:
    """Findings on the resolved fast path: why npugraph_ex or the graphs are off (the key that did it and
    the fix), drafts that defeat FULL_DECODE_ONLY, combinations the pinned code or verl's Ascend guide
    refuse. ``found`` is the libraries' :class:`~npu_rl.preflight.libraries._Findings`."""
    mode_set = sel(cfg, MODE_KEY) is not None
    draft_fix = "FULL" if fast.spec_method in VARIABLE_DRAFTERS else "FULL_DECODE_ONLY"
    set_mode = f"'+{MODE_KEY}={draft_fix}'" + (f" (or {MODE_KEY}={draft_fix} where the recipe sets it)")
    if fast.error:
        key = "ASCEND_LAUNCH_BLOCKING" if "ASCEND_LAUNCH_BLOCKING" in fast.error else found.key_of(fast.error, MODE_KEY)
        fix = (
            f"unset ASCEND_LAUNCH_BLOCKING (or 0), or set {R}.enforce_eager=True while debugging"
            if key == "ASCEND_LAUNCH_BLOCKING"
            else f"change {key}"
        )
        found.add(key, f"vllm-ascend's NPUPlatform.check_and_update_config refuses it: {fast.error}", fix)
        return
    if not fast.graphs:
        if fast.eager:
            key, why = f"{R}.enforce_eager", "enforce_eager=True"
            fix = f"set {R}.enforce_eager=False and {set_mode}"
        else:
            key = MODE_KEY
            why = f"cudagraph_mode {fast.requested or 'NONE'} resolves to NONE"
            fix = set_mode
        found.add(
            key,
            f"the rollout runs eager on NPU ({why}): no ACL graphs and no npugraph_ex (the reference's Qwen3-32B "
            "first-step generate time went from 2106 s to 1621 s when graph mode was added to SAM; docs/fast_path.md)",
            fix,
            error=False,
        )
        return
    if not fast.npugraph_ex:
        if fast.mode in ("FULL", "FULL_DECODE_ONLY"):
            key = NPUGRAPH_EX_KEY
            why = "it is switched off"
            fix = f"drop {NPUGRAPH_EX_KEY} (vllm-ascend's default is True)"
        else:
            key = MODE_KEY
            origin = "set by the recipe" if mode_set else "verl's default, vllm_async_server.py:310"
            why = (
                f"cudagraph_mode {fast.mode} ({origin}) needs piecewise compilation, and vllm-ascend keeps "
                "npugraph_ex only in FULL and FULL_DECODE_ONLY (platform.py:593-643)"
            )
            fix = set_mode
        found.add(key, f"npugraph_ex is off on NPU: {why}", fix, error=False)
    if fast.mode == "FULL_DECODE_ONLY" and fast.spec_method in VARIABLE_DRAFTERS and fast.spec_tokens > 0:
        found.add(
            MODE_KEY,
            f"FULL_DECODE_ONLY replays a graph only for uniform decode batches (every request 1 + "
            f"{fast.spec_tokens} tokens, model_runner_v1.py:2956-2963), but the {fast.spec_method} drafter "
            "proposes empty or short drafts: most steps would run eager, and with DP one eager rank makes "
            "every rank eager (_post_process_cudagraph_mode)",
            f"set {MODE_KEY}=FULL (FULL captures mixed batches; recipes: ROLLOUT_GRAPH_MODE=FULL)",
            error=False,
        )
    if fast.npugraph_ex and sel(cfg, SIZES_KEY) is None:
        seqs = int(sel(cfg, f"{R}.max_num_seqs", 256) or 256)
        short = capture_sizes(seqs, 1 + fast.spec_tokens)
        if len(fast.capture_sizes) > len(short):
            found.add(
                SIZES_KEY,
                f"left to the default list: {len(fast.capture_sizes)} ACL graphs are captured at every engine start "
                f"and their pool (~{fast.graph_gib:.2f} GiB per die) stays on the die while the trainer runs",
                f"set {SIZES_KEY}='{json.dumps(short).replace(' ', '')}' ({len(short)} graphs for up to {seqs} "
                "requests per rank; recipes: verl::fast_path in internal/verl.sh sizes it from the step's batch)",
                error=False,
            )
    if fast.task_queue == "2":
        found.add(
            "TASK_QUEUE_ENABLE",
            "= 2 in the rollout while it captures ACL graphs: verl's Ascend guide says TASK_QUEUE_ENABLE=2 "
            "cannot be combined with ACL graph",
            "export VLLM_ASCEND_TASK_QUEUE_ENABLE=1 (verl's NPU platform gives it to the rollout as "
            "TASK_QUEUE_ENABLE; training keeps TASK_QUEUE_ENABLE=2), or TASK_QUEUE_ENABLE=1",
        )


def check_weight_nz(fast: FastPath, cfg, found) -> None:
    """vllm-ascend's ``NPUWorker.wake_up`` raises when ``weight_nz_mode`` is not 0 (worker.py:241-247): the
    rollout dies at its first wake-up after a weight sync. verl sets ``VLLM_ASCEND_ENABLE_NZ=0`` only when
    the variable is unset; ``additional_config.weight_nz_mode`` wins over both."""
    if fast.error or not bool(sel(cfg, f"{R}.enable_sleep_mode", True)) or not fast.weight_nz_mode:
        return
    key = f"{VLLM_KW}.additional_config.weight_nz_mode"
    if sel(cfg, key) is None:
        key = "VLLM_ASCEND_ENABLE_NZ"
    found.add(
        key,
        f"weight_nz_mode {fast.weight_nz_mode} with sleep mode on: vllm-ascend's NPUWorker.wake_up refuses "
        "FRACTAL_NZ weights in RL ('FRACTAL_NZ mode is enabled ... set weight_nz_mode=0'), so the rollout "
        "dies at its first wake-up",
        f"drop {key} (verl sets VLLM_ASCEND_ENABLE_NZ=0 when it is unset), or set it to 0",
    )


def plan_value(fast: FastPath | None, skipped: str = "") -> str:
    """The plan's ``rollout graphs`` value."""
    if fast is None:
        return f"not resolved here ({skipped})" if skipped else "not resolved here"
    return fast.line()


def as_json(fast: FastPath | None) -> Any:
    return None if fast is None else fast.to_json()
