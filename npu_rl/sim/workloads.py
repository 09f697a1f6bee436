"""Real response-length workloads for the rollout simulator.

``benchmarks/data/response_lengths.json`` (committed; regenerate with ``benchmarks/make_length_tables.py
--data-dir ../shared/data``) holds, per dataset and prompt, the prompt's token count and the token counts
of its real sampled responses (Qwen3 tokenizer), with a ``capped`` flag per response (it ran into the
generation cap). Datasets: ``qwen25math_maj8`` (100 MATH prompts x 8 samples), ``skyt1_long`` and
``skyt1_short`` (30 AIME24 prompts x 11 SFT checkpoints, long and short recipes) and ``skyt1`` (both
recipes: 22 responses per prompt). Provenance (source files, upstream commits, tokenizer version) is in
the table itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npu_rl import REPO_ROOT
from npu_rl.sim.model import SimError, SimRequest

TABLE = REPO_ROOT / "benchmarks" / "data" / "response_lengths.json"
COMBINED = {"skyt1": ("skyt1_long", "skyt1_short")}


@dataclass(frozen=True)
class Workload:
    """Per-prompt real response lengths of one dataset.

    ``prompt_names[k]``, ``prompt_tokens[k]`` (int), ``responses[k]`` (int array of that prompt's response
    token counts), ``capped[k]`` (bool array: that response hit the generation cap). Prompt ids used by
    :func:`sample_step` are the positions k = 0..n_prompts-1. ``generation_cap``: the cap the responses
    were generated under (None if unknown). ``provenance``: the table's record for the dataset.
    """

    name: str
    prompt_names: tuple[str, ...]
    prompt_tokens: np.ndarray
    responses: tuple[np.ndarray, ...]
    capped: tuple[np.ndarray, ...]
    generation_cap: int | None = None
    provenance: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_names)

    def all_lengths(self) -> np.ndarray:
        """Every response length of every prompt, concatenated (tokens)."""
        return np.concatenate(self.responses) if self.responses else np.zeros(0, dtype=np.int64)

    def mean_lengths(self) -> np.ndarray:
        """Per-prompt mean response length (tokens), shape (n_prompts,)."""
        return np.array([r.mean() for r in self.responses])

    def n_capped(self) -> int:
        return int(sum(c.sum() for c in self.capped))

    def drop_capped(self) -> Workload:
        """The workload without capped responses (prompts left with none are dropped)."""
        keep = [k for k in range(self.n_prompts) if (~self.capped[k]).any()]
        return Workload(
            name=f"{self.name}-uncapped",
            prompt_names=tuple(self.prompt_names[k] for k in keep),
            prompt_tokens=self.prompt_tokens[keep],
            responses=tuple(self.responses[k][~self.capped[k]] for k in keep),
            capped=tuple(np.zeros(int((~self.capped[k]).sum()), dtype=bool) for k in keep),
            generation_cap=self.generation_cap,
            provenance=self.provenance,
        )


def _from_record(name: str, rec: dict, where: str) -> Workload:
    try:
        prompts = rec["prompts"]
        names = tuple(str(p["id"]) for p in prompts)
        ptok = np.array([int(p["prompt_tokens"]) for p in prompts], dtype=np.int64)
        resp = tuple(np.array(p["response_tokens"], dtype=np.int64) for p in prompts)
        capped = tuple(np.array(p["capped"], dtype=bool) for p in prompts)
    except (KeyError, TypeError, ValueError) as e:
        raise SimError(
            f"{where}: dataset {name!r} is malformed ({e!r}); regenerate it with make_length_tables.py"
        ) from e
    for n, r, c in zip(names, resp, capped, strict=True):
        if len(r) == 0 or len(r) != len(c) or (r < 1).any():
            raise SimError(f"{where}: dataset {name!r} prompt {n!r} has no, or bad, response lengths")
    prov = {k: v for k, v in rec.items() if k != "prompts"}
    return Workload(name, names, ptok, resp, capped, rec.get("generation_cap"), prov)


def load_workload(name: str, table: str | Path | None = None) -> Workload:
    """Load dataset ``name`` from the committed length table (or ``table``, a JSON file of the same format).

    Raises :class:`~npu_rl.sim.model.SimError` naming the available datasets if ``name`` is unknown, or the
    file if it is missing or malformed.
    """
    path = Path(table) if table is not None else TABLE
    if not path.is_file():
        raise SimError(f"length table {path} not found: run benchmarks/make_length_tables.py --data-dir <shared data>")
    try:
        data = json.loads(path.read_text())
        datasets = data["datasets"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise SimError(f"{path}: not a response-length table ({e!r}); regenerate it with make_length_tables.py") from e
    if name in COMBINED and name not in datasets:
        parts = [_from_record(p, datasets[p], str(path)) for p in COMBINED[name] if p in datasets]
        if len(parts) != len(COMBINED[name]):
            raise SimError(f"{path}: {name!r} needs datasets {COMBINED[name]}")
        first = parts[0]
        for other in parts[1:]:
            if other.prompt_names != first.prompt_names or (other.prompt_tokens != first.prompt_tokens).any():
                raise SimError(f"{path}: {COMBINED[name]} do not list the same prompts; cannot combine")
        return Workload(
            name=name,
            prompt_names=first.prompt_names,
            prompt_tokens=first.prompt_tokens,
            responses=tuple(np.concatenate(rs) for rs in zip(*(p.responses for p in parts), strict=True)),
            capped=tuple(np.concatenate(cs) for cs in zip(*(p.capped for p in parts), strict=True)),
            generation_cap=first.generation_cap,
            provenance={p.name: p.provenance for p in parts},
        )
    if name not in datasets:
        known = sorted(set(datasets) | {c for c, parts in COMBINED.items() if set(parts) <= set(datasets)})
        raise SimError(f"unknown workload {name!r} in {path}: choose one of {known}")
    return _from_record(name, datasets[name], str(path))


def load_lengths_file(path: str | Path) -> Workload:
    """A user's response lengths for the simulators and benchmarks (``--lengths FILE``).

    ``FILE`` is either a length table of :data:`TABLE`'s format (``.json`` with ``datasets``: its only
    dataset, or ``FILE.json:NAME`` for one of several), or JSONL, one prompt per line::

        {"response_tokens": [812, 1430, 95], "prompt_tokens": 120, "capped": [false, true, false], "id": "q17"}

    ``response_tokens`` (token counts of that prompt's sampled responses, each >= 1) is required;
    ``prompt_tokens`` (default 0), ``capped`` (default: none hit the cap) and ``id`` (default: the line
    number) are optional. The workload is named after the file. docs/sim.md, "Your own lengths".

    Raises:
        SimError: the file is missing or empty, or a line is not a JSON object with valid
            ``response_tokens`` (named by file and line).
    """
    text = str(path)
    name = None
    if ":" in Path(text).name and not Path(text).is_file():
        text, name = text.rsplit(":", 1)
    p = Path(text)
    if not p.is_file():
        raise SimError(f"--lengths {path}: no such file (a length table .json, or JSONL: docs/sim.md)")
    if p.suffix == ".json":
        try:
            datasets = sorted(json.loads(p.read_text())["datasets"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SimError(f"{p}: not a length table ({e!r}); give JSONL with response_tokens per line") from e
        if name is None:
            if len(datasets) != 1:
                raise SimError(f"{p} holds {len(datasets)} datasets: pass {p}:NAME with NAME one of {datasets}")
            name = datasets[0]
        return load_workload(name, p)
    names, ptok, resp, capped = [], [], [], []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            row = json.loads(line)
            r = np.array(row["response_tokens"], dtype=np.int64).reshape(-1)
            c = np.array(row.get("capped", [False] * len(r)), dtype=bool).reshape(-1)
            pt = int(row.get("prompt_tokens", 0))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise SimError(f'{where}: need a JSON object with "response_tokens": [token counts, ...] ({e!r})') from e
        if len(r) == 0 or (r < 1).any() or len(c) != len(r) or pt < 0:
            raise SimError(
                f"{where}: response_tokens must be token counts >= 1 (and capped one flag per response, "
                "prompt_tokens >= 0)"
            )
        names.append(str(row.get("id", i)))
        ptok.append(pt)
        resp.append(r)
        capped.append(c)
    if not names:
        raise SimError(f"{p}: no prompts in it")
    return Workload(
        p.stem, tuple(names), np.array(ptok, dtype=np.int64), tuple(resp), tuple(capped), None, {"source": str(p)}
    )


def sample_step(
    workload: Workload,
    prompt_ids: Sequence[int],
    n: int,
    rng: np.random.Generator,
    *,
    predicted: Mapping[int, float] | Sequence[float] | None = None,
    max_response_len: int | None = None,
    first_rid: int = 0,
) -> list[SimRequest]:
    """The requests of one generation step: n samples of each prompt in ``prompt_ids`` (batch order).

    Each prompt's n response lengths are drawn with replacement from its real samples. ``group`` is the
    position in ``prompt_ids`` (a prompt listed twice forms two groups, as two dataset rows would);
    ``prompt_id`` is the workload's prompt index. ``predicted``: optional per-prompt-id length prediction
    (mapping or sequence indexed by prompt id) copied into ``predicted_len``. ``max_response_len``: clip
    lengths to this cap (a recipe's max response length). rids run from ``first_rid``, prompt-major.
    Raises :class:`~npu_rl.sim.model.SimError` for an unknown prompt id or n < 1.
    """
    if n < 1:
        raise SimError(f"sample_step n={n}: must be >= 1 (samples per prompt)")
    if max_response_len is not None and max_response_len < 1:
        raise SimError(f"sample_step max_response_len={max_response_len}: must be >= 1")
    out: list[SimRequest] = []
    rid = first_rid
    for g, pid in enumerate(prompt_ids):
        pid = int(pid)
        if not 0 <= pid < workload.n_prompts:
            raise SimError(f"prompt id {pid} not in workload {workload.name!r} (0..{workload.n_prompts - 1})")
        lens = rng.choice(workload.responses[pid], size=n, replace=True)
        if max_response_len is not None:
            lens = np.minimum(lens, max_response_len)
        pred = None if predicted is None else float(predicted[pid])
        ptok = int(workload.prompt_tokens[pid])
        for length in lens:
            out.append(SimRequest(rid, g, ptok, int(length), predicted_len=pred, prompt_id=pid))
            rid += 1
    return out


def lengths_from_survival(
    lengths: Sequence[float],
    frac_remaining: Sequence[float],
    size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw ``size`` response lengths (int tokens >= 1) whose survival function follows a published curve.

    ``lengths`` (increasing) and ``frac_remaining`` (non-increasing, from <= 1 down to 0 at the last point)
    are points of the fraction of responses still running at each length, e.g. the curves read from
    published rollout figures (``rollout_traces/*.csv``). Between points the survival is linear (inverse
    transform sampling). Raises :class:`~npu_rl.sim.model.SimError` on a curve that is not a survival
    function.
    """
    x = np.asarray(lengths, dtype=np.float64)
    f = np.asarray(frac_remaining, dtype=np.float64)
    if x.ndim != 1 or x.shape != f.shape or len(x) < 2:
        raise SimError("lengths_from_survival: give two 1-D sequences of the same length (>= 2 points)")
    if (np.diff(x) <= 0).any() or (np.diff(f) > 0).any() or f[0] > 1 or f[-1] != 0 or (f < 0).any():
        raise SimError(
            "lengths_from_survival: lengths must increase and frac_remaining fall from <= 1 to exactly 0 "
            f"(got lengths {x.tolist()[:4]}..., fractions {f.tolist()[:4]}...{f.tolist()[-1:]})"
        )
    u = rng.uniform(0.0, 1.0, size) * f[0]  # survival level of each draw
    # survival is non-increasing: interpolate length as a function of survival on the reversed arrays
    out = np.interp(u, f[::-1], x[::-1])
    return np.maximum(1, np.round(out)).astype(np.int64)
