"""Model facts the preflight checks against: from the model's config.json, else shipped metadata."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from npu_rl import REPO_ROOT

MODELS_DIR = REPO_ROOT / "recipes" / "models"


@dataclass(frozen=True)
class ModelFacts:
    """Shape of a decoder-only (dense or MoE) model, from a Hugging Face config.json.

    ``source`` is the file the facts came from. ``experts`` is 0 for dense models.
    """

    source: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    intermediate: int
    vocab: int
    max_position_embeddings: int
    tied_embeddings: bool
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @classmethod
    def from_config(cls, cfg: dict, source: str) -> ModelFacts:
        """Read the fields verl/vLLM/Megatron size a model by.

        Raises:
            KeyError: a required field (named in the message) is missing.
        """
        text = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM config here
        heads = text["num_attention_heads"]
        # The field itself, as verl reads it (rollout/utils.py get_max_position_embeddings): verl's default
        # and limit for max_model_len. vLLM derives its own limit (rope scaling included); its ModelConfig
        # judges that (npu_rl.preflight.libraries).
        max_pos = cfg.get("max_position_embeddings") or text["max_position_embeddings"]
        return cls(
            source=source,
            hidden=text["hidden_size"],
            heads=heads,
            kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            layers=text["num_hidden_layers"],
            intermediate=text["intermediate_size"],
            vocab=text["vocab_size"],
            max_position_embeddings=max_pos,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            experts=text.get("num_experts") or text.get("n_routed_experts") or 0,
            experts_per_token=text.get("num_experts_per_tok") or 0,
            moe_intermediate=text.get("moe_intermediate_size") or 0,
        )

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def params(self) -> tuple[int, int]:
        """(dense parameters, expert parameters): embeddings, attention, norms and dense MLPs vs routed experts.

        Qwen3 layout (q/k/v/o projections with per-head q/k norms, SwiGLU MLP, RMSNorm); e.g. Qwen3-32B
        gives 32.8 B and Qwen3-235B-A22B 235 B, as on their model cards.
        """
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attn = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 2 * self.head_dim
        norms = 2 * self.hidden
        if self.is_moe:
            router = self.hidden * self.experts
            dense_layer = attn + norms + router
            expert_layer = self.experts * 3 * self.hidden * self.moe_intermediate
        else:
            dense_layer = attn + norms + 3 * self.hidden * self.intermediate
            expert_layer = 0
        return embed + self.hidden + self.layers * dense_layer, self.layers * expert_layer


def hub_id(model_path: str) -> str:
    """The hub id of the model a path names (``npu_rl.models download`` takes it): ``Qwen/<folder name>``
    for Qwen models, ``<org>/<folder name>`` otherwise."""
    name = Path(model_path.rstrip("/")).name or "<model>"
    return f"Qwen/{name}" if name.lower().startswith("qwen") else f"<org>/{name}"


def shipped_models() -> list[str]:
    """Names of the shipped metadata files (``recipes/models/<name>.json``)."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def find_model_config(model_path: str, env: dict[str, str]) -> Path | None:
    """The config.json to read for ``model_path``.

    Order: ``NPU_RL_MODEL_META`` (a shipped name or a file path), ``<model_path>/config.json``, the
    shipped file whose name the model directory's name starts with (longest match). None if none.
    """
    explicit = env.get("NPU_RL_MODEL_META", "").strip()
    if explicit:
        p = Path(explicit)
        if p.is_dir():
            p = p / "config.json"
        return p if p.is_file() else MODELS_DIR / f"{explicit}.json"
    local = Path(os.path.expanduser(model_path)) / "config.json"
    if local.is_file():
        return local
    base = Path(model_path.rstrip("/")).name.lower()
    matches = [n for n in shipped_models() if base.startswith(n.lower())]
    return MODELS_DIR / f"{max(matches, key=len)}.json" if matches else None


def load_model_facts(path: Path, override: dict | None = None) -> ModelFacts:
    """Read ``path`` (a config.json), with ``override`` (verl's ``model.override_config``) applied on top.

    Raises:
        OSError, ValueError, KeyError: unreadable file, bad JSON, missing field.
    """
    source = str(path) + (" + model.override_config" if override else "")
    return ModelFacts.from_config({**json.loads(path.read_text()), **(override or {})}, source)
