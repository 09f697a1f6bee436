"""Turn math/reasoning datasets into the parquet layout verl 0.9.1's ``RLHFDataset`` reads.

Each row: ``data_source`` (chooses verl's reward function, ``verl/utils/reward_score/__init__.py``
``default_compute_score``), ``prompt`` (chat messages; verl applies the tokenizer's chat template),
``ability``, ``reward_model = {style: rule, ground_truth}``, ``extra_info = {index, split, dataset,
question}`` with ``index`` unique per row (the stable key the length-aware resampler needs).

The prompt's instruction and the reward function must agree, so each dataset has one of three
styles: GSM8K's ``#### answer`` (verl ``gsm8k`` scorer), ``\\boxed{}`` (verl ``math_reward`` via the
MATH data sources), and DAPO's ``Answer: ...`` last line (verl ``math_dapo``, which also reports the
``acc`` that DAPO's dynamic sampling filters on).

Inputs: local files (jsonl, json list, parquet; the field names of the common releases are
recognised), or online through the Hugging Face ``datasets`` library or ModelScope's ``MsDataset``
(both honour their own mirror settings, e.g. ``HF_ENDPOINT``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from npu_rl.errors import NpuRlError


class DataError(NpuRlError):
    """An input file or dataset cannot be converted; the message names the file, row and field."""

    exit_code = 1


GSM8K = '{q} Let\'s think step by step and output the final answer after "####".'
BOXED = "{q} Let's think step by step and output the final answer within \\boxed{{}}."
# The DAPO paper's template (DAPO-Math-17k); verl's math_dapo scorer reads the "Answer:" line.
DAPO = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


@dataclass(frozen=True)
class Spec:
    """One dataset: the verl ``data_source`` that routes its reward, its prompt template, its hub id.

    ``repo``/``config``/``split`` name it on the Hugging Face hub; ModelScope is asked for the same id
    unless ``--repo`` gives another (ids are not verified from this project's machines).
    """

    name: str
    data_source: str
    template: str
    repo: str
    config: str | None = None
    split: str = "train"


SPECS = {
    s.name: s
    for s in (
        Spec("gsm8k", "openai/gsm8k", GSM8K, "openai/gsm8k", "main"),
        Spec("math500", "HuggingFaceH4/MATH-500", BOXED, "HuggingFaceH4/MATH-500", split="test"),
        Spec("aime2024", "aime2024", DAPO, "Maxwell-Jia/AIME_2024"),
        Spec("aime2025", "aime2025", DAPO, "yentinglin/aime_2025"),
        Spec("dapo-math-17k", "math_dapo", DAPO, "BytedTsinghua-SIA/DAPO-Math-17k"),
        # DeepScaleR asks for \boxed{} answers: verl's MATH scorer (a MATH data source) grades them.
        Spec("deepscaler", "lighteval/MATH", BOXED, "agentica-org/DeepScaleR-Preview-Dataset"),
    )
}

_QUESTION_KEYS = ("question", "problem", "Problem", "prompt", "input")
_ANSWER_KEYS = ("ground_truth", "answer", "Answer", "expected_answer", "target")
# Instructions the common releases already wrapped around the question, removed before ours is added.
_KNOWN_WRAPPERS = (
    re.compile(
        r"^Solve the following math problem step by step\..*?\n\n(?P<q>.*)\n\nRemember to put your answer.*$", re.S
    ),
    re.compile(
        r"^(?P<q>.*?)\s*Let's think step by step and output the final answer "
        r"(within \\boxed\{\}|after \"####\")\.?\s*$",
        re.S,
    ),
    re.compile(r"^(?P<q>.*?)\s*Please reason step by step, and put your final answer within \\boxed\{\}\.?\s*$", re.S),
)


def read_rows(path: Path) -> list[dict]:
    """Rows of a local ``.jsonl``, ``.json`` (a list, or ``{"data": [...]}``) or ``.parquet`` file.

    Raises:
        DataError: unknown extension, or a line/file that is not valid JSON (named with its line).
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        return data["data"] if isinstance(data, dict) and "data" in data else list(data)
    raise DataError(f"{path}: unsupported file type {suffix!r}; give .jsonl, .json or .parquet")


def _question(row: dict) -> str | None:
    for key in _QUESTION_KEYS:
        value = row.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if _is_messages(value):  # verl parquet: a chat list
            users = [m["content"] for m in value if m.get("role") == "user"]
            if users:
                return users[-1]
    messages = row.get("messages")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            messages = None
    if _is_messages(messages):
        users = [m["content"] for m in messages if m.get("role") == "user"]
        return users[-1] if users else None
    return None


def _is_messages(value) -> bool:
    try:
        return len(value) > 0 and all(isinstance(m, dict) and "content" in m for m in value)
    except TypeError:
        return False


def _answer(row: dict, spec: Spec) -> str | None:
    reward = row.get("reward_model")
    text = None
    if isinstance(reward, dict) and str(reward.get("ground_truth", "")).strip():
        text = str(reward["ground_truth"])
    else:
        for key in _ANSWER_KEYS:
            value = row.get(key)
            if value is not None and str(value).strip():
                text = str(value)
                break
    if text is None:
        return None
    if spec.name == "gsm8k":
        if "####" in text:  # GSM8K: worked solution, then "#### 72"
            text = text.rsplit("####", 1)[1]
        text = text.strip()
        return text.replace(",", "") if re.fullmatch(r"-?[\d,]+(\.\d+)?", text) else text
    if re.search(r"\n#### ", text):
        raise DataError(f"the answer looks like GSM8K's ('... #### N'), not {spec.name}'s: convert it as gsm8k")
    text = text.strip()
    if spec.name.startswith("aime") and re.fullmatch(r"0*\d+", text):
        text = str(int(text))  # AIME answers are 0-999; "025" would not match "Answer: 25"
    return text


def strip_wrapper(question: str) -> str:
    """The bare question without an instruction a release already wrapped around it."""
    for pattern in _KNOWN_WRAPPERS:
        m = pattern.match(question.strip())
        if m:
            return m.group("q").strip()
    return question.strip()


def convert(
    rows: Iterable[dict], spec: Spec, split: str, source: str = "", skip_invalid: bool = False
) -> tuple[list[dict], list[str]]:
    """verl rows for ``rows`` (dicts in any recognised layout) and the reasons rows were skipped.

    Output rows are indexed 0, 1, ... in input order (``extra_info.index``, unique).

    Raises:
        DataError: a row without a question or an answer (named by position and ``source``),
            unless ``skip_invalid``, which drops it and lists it in the second return value.
    """
    out, skipped = [], []
    for i, row in enumerate(rows):
        try:
            q, a = _question(row), _answer(row, spec)
        except DataError as e:
            raise DataError(f"{source or spec.name} row {i}: {e}") from None
        if not q or a is None:
            missing = "question" if not q else "answer (empty or absent ground truth)"
            msg = (
                f"{source or spec.name} row {i}: no {missing}; looked for "
                f"{_QUESTION_KEYS if not q else _ANSWER_KEYS}, fields: {sorted(row)}"
            )
            if not skip_invalid:
                raise DataError(msg + " (--skip-invalid drops such rows and counts them)")
            skipped.append(msg)
            continue
        q = strip_wrapper(q)
        out.append(
            {
                "data_source": spec.data_source,
                "prompt": [{"role": "user", "content": spec.template.format(q=q)}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"index": len(out), "split": split, "dataset": spec.name, "question": q},
            }
        )
    return out, skipped


def write_parquet(rows: list[dict], out: Path) -> Path:
    """Write ``rows`` to ``out`` atomically (a temporary file renamed into place)."""
    import pandas as pd

    if not rows:
        raise DataError(f"nothing to write to {out}: the input had no rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def load_online(spec: Spec, hub: str, repo: str | None = None) -> list[dict]:
    """Rows of ``spec`` from the Hugging Face hub (``datasets``) or ModelScope (``modelscope``).

    Raises:
        DataError: the library is missing (with the pip command) or the download failed.
    """
    repo = repo or spec.repo
    try:
        if hub == "hf":
            from datasets import load_dataset

            ds = load_dataset(repo, spec.config, split=spec.split)
        else:
            from modelscope.msdatasets import MsDataset

            ds = MsDataset.load(repo, subset_name=spec.config, split=spec.split)
    except ImportError as e:
        lib = "datasets" if hub == "hf" else "modelscope"
        raise DataError(f"--hub {hub} needs the {lib} library: {sys.executable} -m pip install {lib} ({e})") from None
    except Exception as e:  # noqa: BLE001 - network and hub errors vary by library
        raise DataError(f"downloading {repo} from {hub} failed: {e}; convert a local copy with --input") from None
    return [dict(r) for r in ds]


def build_parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m npu_rl.data",
        description="Write <out>/<dataset>/<split>.parquet for verl's RLHFDataset from a local file or a hub.",
    )
    p.add_argument("dataset", choices=sorted([*SPECS, "toy"]), help="toy: the learning runs' task (npu_rl.toy)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", type=Path, nargs="+", help="local .jsonl/.json/.parquet file(s), concatenated")
    src.add_argument("--hub", choices=("modelscope", "hf"), help="download with the hub's library")
    p.add_argument("--repo", help="dataset id on the hub (default: the well-known one for DATASET)")
    p.add_argument("--split", default=None, help="name of the output split (default: train; AIME/MATH-500: test)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("DATA_DIR", Path.home() / "data")))
    p.add_argument("--skip-invalid", action="store_true", help="drop rows without question/answer (counted)")
    toy = p.add_argument_group("toy (no input: the rows are drawn here)")
    toy.add_argument("--train-rows", type=int, default=2048, help="toy: training prompts (default 2048)")
    toy.add_argument("--val-rows", type=int, default=128, help="toy: validation prompts (default 128)")
    toy.add_argument("--seed", type=int, default=0, help="toy: seed of the prompts (default 0)")
    toy.add_argument("--repeat", type=int, default=1, help="toy: the answer is the digit this many times (default 1)")
    return p


def write_toy(out: Path, train_rows: int, val_rows: int, seed: int, repeat: int = 1) -> tuple[Path, Path, bool]:
    """``out/toy/train.parquet`` and ``out/toy/val.parquet``: the toy task (:mod:`npu_rl.toy`), prompts
    drawn with ``seed``, no validation prompt among the training ones. ``out/toy/made.json``, written
    last, records what was made (task, rows, seed); when it matches and both files are there nothing is
    written (the third item, ``written``, is then False), so a recipe can call this on every start.

    ``repeat``: the answer is the digit this many times (:func:`npu_rl.toy.rows`).

    Raises:
        DataError: fewer than 1 row asked for a split, or ``repeat`` < 1.
    """
    from npu_rl import toy

    if train_rows < 1 or val_rows < 1:
        raise DataError(f"toy: --train-rows and --val-rows must be >= 1 (got {train_rows}, {val_rows})")
    if repeat < 1:
        raise DataError(f"toy: --repeat must be >= 1 (got {repeat})")
    paths = (out / "toy" / "train.parquet", out / "toy" / "val.parquet")
    stamp = out / "toy" / "made.json"
    want = {"task": toy.DATA_SOURCE, "words": toy.WORDS, "train_rows": train_rows, "val_rows": val_rows, "seed": seed}
    if repeat > 1:  # a stamp of the one-digit task stays as it was
        want["repeat"] = repeat
    try:
        if json.loads(stamp.read_text()) == want and all(p.is_file() for p in paths):
            return (*paths, False)
    except (OSError, ValueError):
        pass  # no stamp, or not ours: make the files
    stamp.unlink(missing_ok=True)  # a run cut short below leaves no stamp that claims its files
    train = toy.rows(train_rows, "train", seed, repeat)
    seen = {r["extra_info"]["question"] for r in train}
    val = [r for r in toy.rows(4 * val_rows + 64, "val", seed, repeat) if r["extra_info"]["question"] not in seen]
    val = val[:val_rows]
    for i, r in enumerate(val):
        r["extra_info"]["index"] = i
    write_parquet(train, paths[0])
    write_parquet(val, paths[1])
    stamp.write_text(json.dumps(want, indent=1) + "\n")
    return (*paths, True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.dataset == "toy":
        if a.input or a.hub:
            parser.error("toy takes no --input or --hub: its rows are drawn here (--train-rows, --val-rows, --seed)")
        try:
            train, val, written = write_toy(a.out, a.train_rows, a.val_rows, a.seed, a.repeat)
        except (DataError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        what = "written" if written else "up to date, kept"
        task = "the toy task" if a.repeat == 1 else f"the toy task, answers repeated {a.repeat} times"
        print(f"{train}, {val}: {a.train_rows} + {a.val_rows} rows of {task} (seed {a.seed}): {what}")
        return 0
    if not (a.input or a.hub):
        parser.error(f"{a.dataset}: give --input FILE... or --hub modelscope|hf")
    spec = SPECS[a.dataset]
    split = a.split or ("test" if a.dataset in ("math500", "aime2024", "aime2025") else "train")
    try:
        if a.input:
            rows = [r for path in a.input for r in read_rows(path)]
            source = ", ".join(map(str, a.input))
        else:
            rows, source = load_online(spec, a.hub, a.repo), f"{a.hub}:{a.repo or spec.repo}"
        converted, skipped = convert(rows, spec, split, source, a.skip_invalid)
        out = write_parquet(converted, a.out / a.dataset / f"{split}.parquet")
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for reason in skipped:
        print(f"skipped: {reason}", file=sys.stderr)
    questions = [r["extra_info"]["question"] for r in converted]
    if len(set(questions)) < len(questions):
        print(
            f"warning: {len(questions) - len(set(questions))} duplicate question(s) (same file twice?)", file=sys.stderr
        )
    sources = sorted({str(r.get("source") or r.get("tag")) for r in rows if r.get("source") or r.get("tag")})
    if len(sources) > 1:
        print(
            f"warning: the input mixes sources {sources}: split it if only one belongs to {a.dataset}", file=sys.stderr
        )
    print(f"{out}: {len(converted)} rows ({len(skipped)} skipped), data_source={spec.data_source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
