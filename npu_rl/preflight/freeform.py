"""Schemas for the free-form dicts Hydra does not check (``engine_kwargs.vllm.*``, ``override_transformer_config.*``).

vLLM's fields are read from the pinned vLLM source with ``ast`` (no import: importing vLLM costs
seconds and pulls optional dependencies); Megatron's from its ``TransformerConfig`` dataclass.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from functools import cache
from pathlib import Path

# the SAM keys whose values this module checks itself (npu_rl.spec_decode.config rules: "always"/"never"
# thresholds, MiB); sam_adaptive_k and sam_history_mb are left to the patched vLLM's field types (its
# pydantic check of a bool and an int), and npu_rl.preflight.spec_decode checks them all together
SAM_KEYS = ("sam_batch_size_threshold", "sam_group_corpus_mb", "sam_min_match")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # top-level: locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _class_fields(tree: ast.Module, name: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                st.target.id
                for st in node.body
                if isinstance(st, ast.AnnAssign)
                and isinstance(st.target, ast.Name)
                and not st.target.id.startswith("_")
            }
    raise LookupError(name)


def _literal_values(tree: ast.Module, name: str) -> set[str]:
    """Strings of ``name = Literal[...]`` in ``tree``, following other Literal aliases of the module."""
    aliases = {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    }

    def walk(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name) and node.id in aliases:
            return walk(aliases[node.id])
        if isinstance(node, ast.Subscript):  # Literal[...]
            return walk(node.slice)
        if isinstance(node, ast.Tuple):
            return set().union(*(walk(e) for e in node.elts))
        if isinstance(node, ast.BinOp):  # A | B
            return walk(node.left) | walk(node.right)
        return set()

    if name not in aliases:
        raise LookupError(name)
    return walk(aliases[name])


@cache
def vllm_engine_fields() -> frozenset[str] | None:
    """Field names of vLLM's ``EngineArgs`` (what verl passes ``engine_kwargs.vllm`` to); None if unknown."""
    root = _package_dir("vllm")
    try:
        tree = ast.parse((root / "engine" / "arg_utils.py").read_text())  # type: ignore[operator]
        return frozenset(_class_fields(tree, "EngineArgs"))
    except (OSError, TypeError, LookupError, SyntaxError):
        return None


@cache
def vllm_speculative() -> tuple[frozenset[str], frozenset[str]] | None:
    """(``SpeculativeConfig`` field names, accepted ``method`` values) of the installed vLLM; None if unknown."""
    root = _package_dir("vllm")
    try:
        tree = ast.parse((root / "config" / "speculative.py").read_text())  # type: ignore[operator]
        return frozenset(_class_fields(tree, "SpeculativeConfig")), frozenset(
            _literal_values(tree, "SpeculativeMethod")
        )
    except (OSError, TypeError, LookupError, SyntaxError):
        return None


def _check_sam_key(key: str, value: object) -> tuple[str, str, list[str]] | None:
    """A SAM key's value (npu_rl.spec_decode.config rules); None if fine, else (message, value, valid values)."""
    from npu_rl.spec_decode.config import resolve

    arg, valid = {
        "sam_batch_size_threshold": ("threshold", ["always", "never", "<integer >= 1>"]),
        "sam_group_corpus_mb": ("group_corpus_mb", ["<MiB >= 0>"]),
        "sam_min_match": ("min_match", ["<integer >= 1>"]),
    }[key]
    try:
        resolve(3, **{arg: value}, env={})
    except ValueError as e:
        return str(e), str(value), valid
    return None


@cache
def megatron_transformer_fields() -> frozenset[str] | None:
    """Field names of megatron-core's ``TransformerConfig`` (with its ``ModelParallelConfig`` base).

    Importing it imports torch (seconds): the list is kept between runs while megatron-core and what the
    import read are unchanged (:func:`npu_rl.preflight.memo.remember`)."""
    from npu_rl.preflight.memo import remember

    names = remember("megatron_transformer_fields", None, _megatron_transformer_fields)
    return None if names is None else frozenset(names)


def _megatron_transformer_fields() -> list[str] | None:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
            from megatron.core.transformer.transformer_config import TransformerConfig
    except Exception:  # noqa: BLE001 - any import failure means "cannot check", reported by the caller
        return None
    return sorted(f.name for f in dataclasses.fields(TransformerConfig) if not f.name.startswith("_"))


def check_freeform(section: str, rest: list[str], value: object) -> tuple[str, str, list[str]] | None:
    """Check a key under a free-form section; None if fine or unknown, else (message, bad name, valid names).

    ``section`` is the schema name ("vllm" or "megatron"); ``rest`` the key's components below it.
    """
    if section == "vllm":
        fields = vllm_engine_fields()
        if fields is None or not rest:
            return None
        if rest[0] not in fields:
            return f"'{rest[0]}' is not an argument of vLLM's EngineArgs", rest[0], sorted(fields)
        if rest[0] == "speculative_config" and len(rest) > 1:
            spec = vllm_speculative()
            if spec is None:
                return None
            spec_fields, methods = spec
            if rest[1] in SAM_KEYS:  # our patch's keys: known even to an unpatched vLLM, values checked here
                return _check_sam_key(rest[1], value)
            if rest[1] not in spec_fields:
                return f"'{rest[1]}' is not a field of vLLM's SpeculativeConfig", rest[1], sorted(spec_fields)
            if rest[1] == "method" and str(value) not in methods:
                return f"speculative method '{value}' is not one this vLLM knows", str(value), sorted(methods)
        return None
    if section == "megatron":
        fields = megatron_transformer_fields()
        if fields is None or not rest or rest[0] in fields:
            return None
        return f"'{rest[0]}' is not a field of megatron-core's TransformerConfig", rest[0], sorted(fields)
    return None
