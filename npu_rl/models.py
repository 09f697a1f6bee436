"""Model download (ModelScope by default, the Hugging Face hub as alternative) and completeness checks.

``python -m npu_rl.models download Qwen/Qwen3-32B [--hub hf] [--config-only] [--dest DIR]`` puts the
files in ``$MODELS_DIR/<name>`` (default ``~/models/<name>``, the recipes' ``MODEL_PATH``).
``--config-only`` fetches the config and tokenizer only: what a random-init or dry run needs.
``python -m npu_rl.models verify DIR [--config-only]`` lists what a recipe would miss; the preflight
runs the same check on ``actor_rollout_ref.model.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from npu_rl.errors import NpuRlError

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CONFIG_ONLY_PATTERNS = (*CONFIG_FILES, *TOKENIZER_FILES, "vocab.json", "merges.txt")


class ModelError(NpuRlError):
    """A model cannot be downloaded, or a model directory is incomplete."""

    exit_code = 1


def missing_files(model_dir: Path, config_only: bool = False) -> list[str]:
    """Files a training run needs that ``model_dir`` lacks (empty when complete).

    Needs ``config.json``, the tokenizer (``tokenizer.json`` or ``vocab.json`` + ``merges.txt``, and
    ``tokenizer_config.json``), and unless ``config_only`` the weights: every shard named by
    ``model.safetensors.index.json``, or a single ``model.safetensors``.
    """
    if not model_dir.is_dir():
        return [f"{model_dir} ({'not a directory' if model_dir.exists() else 'no such directory'})"]
    missing = []
    if not (model_dir / "config.json").is_file():
        missing.append("config.json")
    if not (model_dir / "tokenizer.json").is_file() and not all(
        (model_dir / f).is_file() for f in ("vocab.json", "merges.txt")
    ):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    if not (model_dir / "tokenizer_config.json").is_file():
        missing.append("tokenizer_config.json")
    if config_only:
        return missing
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            return [*missing, f"model.safetensors.index.json (unreadable: {e!r})"]
        for shard in shards:
            path = model_dir / shard
            if not path.is_file():
                missing.append(shard)
            elif path.stat().st_size == 0:
                missing.append(f"{shard} (empty: an interrupted download?)")
    elif not (model_dir / "model.safetensors").is_file():
        missing.append("model.safetensors.index.json or model.safetensors (the weights)")
    return missing


def download(repo: str, dest: Path, hub: str = "modelscope", config_only: bool = False) -> Path:
    """Download ``repo`` into ``dest`` with the hub's own client library (its mirror settings apply).

    Raises:
        ModelError: the library is missing (with the pip command) or the download failed.
    """
    patterns = list(CONFIG_ONLY_PATTERNS) if config_only else None
    try:
        if hub == "modelscope":
            from modelscope import snapshot_download

            snapshot_download(repo, local_dir=str(dest), allow_patterns=patterns)
        else:
            from huggingface_hub import snapshot_download

            snapshot_download(repo, local_dir=str(dest), allow_patterns=patterns)
    except ImportError as e:
        lib = "modelscope" if hub == "modelscope" else "huggingface_hub"
        raise ModelError(f"--hub {hub} needs the {lib} library: {sys.executable} -m pip install {lib} ({e})") from None
    except Exception as e:  # noqa: BLE001 - network/auth errors differ per library
        raise ModelError(f"downloading {repo} from {hub} failed: {e}") from None
    return dest


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m npu_rl.models", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="download a model (ModelScope by default)")
    d.add_argument("repo", help="model id, e.g. Qwen/Qwen3-32B")
    d.add_argument("--hub", choices=("modelscope", "hf"), default="modelscope")
    d.add_argument("--config-only", action="store_true", help="config and tokenizer only (random init, dry runs)")
    d.add_argument("--dest", type=Path, help="default: $MODELS_DIR/<name> or ~/models/<name>")
    v = sub.add_parser("verify", help="list the files a run would miss")
    v.add_argument("model_dir", type=Path)
    v.add_argument("--config-only", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "download":
            dest = (
                a.dest or Path(os.environ.get("MODELS_DIR", Path.home() / "models")) / a.repo.rstrip("/").split("/")[-1]
            )
            download(a.repo, dest, a.hub, a.config_only)
            model_dir = dest
        else:
            model_dir = a.model_dir
        missing = missing_files(model_dir, a.config_only)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if missing:
        print(f"{model_dir} is incomplete; missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(f"{model_dir}: complete ({'config and tokenizer' if a.config_only else 'config, tokenizer, weights'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
