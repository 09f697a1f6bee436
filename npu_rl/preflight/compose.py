"""Compose a recipe's overrides with the pinned, patched verl's own Hydra config, checking every key.

Hydra stops at the first unknown key and accepts anything written with ``+``; here every override is
checked against the composed base config first, so that all problems are reported at once, typos get
the closest existing key, a missing or superfluous ``+`` is named, and keys added under free-form
dicts are checked against the schema of the library that reads them (vLLM, megatron-core).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npu_rl.preflight.freeform import check_freeform
from npu_rl.preflight.report import Report

# Free-form dicts: the last path component -> the schema that checks keys added below it.
FREEFORM_SCHEMAS = {"vllm": "vllm", "override_transformer_config": "megatron"}

#: Dicts below a dataclass section that verl reads from the DictConfig itself, beside the dataclass
#: (neither its yaml nor its dataclass has the field, so Hydra needs a '+'): the key -> who reads it.
#: What lies below is judged by the preflight rule named here, which asks the reader itself.
READ_BESIDE_DATACLASS = {
    "reward.reward_kwargs": "verl's reward-loop DAPO reward manager (config.reward.reward_kwargs: "
    "overlong_buffer_cfg, max_resp_len; judged by checks.check_overlong)",
}


def read_beside_dataclass(key: str) -> str | None:
    """Who reads ``key`` when it lies in :data:`READ_BESIDE_DATACLASS` (the dict itself or below it), else None."""
    for prefix, reader in READ_BESIDE_DATACLASS.items():
        if key == prefix or key.startswith(prefix + "."):
            return reader
    return None


def verl_package_dir() -> Path:
    """The folder of the ``verl`` package this interpreter would import (the pinned, patched tree),
    found without importing it: ``import verl`` loads torch, Ray and tensordict (about 6 s on a
    2-core machine) and the config files need none of that.

    Raises:
        ModuleNotFoundError: verl is not installed in this interpreter.
    """
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "verl is not installed in this Python: run install_stack.sh (or set NPU_RL_TRAIN_PYTHON)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def verl_config_dir() -> Path:
    """``verl/trainer/config`` of the verl this interpreter imports (the pinned, patched tree)."""
    return verl_package_dir() / "trainer" / "config"


@dataclass
class Cli:
    """A ``main_ppo`` command line split into Hydra flags and overrides."""

    config_name: str
    config_dir: Path
    overrides: list[str]
    trainer: str = "sync"  # run_verl --trainer (npu_rl.preflight.async_trainers)
    injected: list[str] = field(default_factory=list)  # feature keys this verl lacks, composed anyway
    # check_overrides' composition of the config-group overrides alone, reused by compose_config
    base: Any = field(default=None, repr=False)
    base_groups: tuple[str, ...] = ()


def split_cli(args: list[str], trainer: str = "sync") -> Cli:
    """Separate ``--config-name``/``--config-path``/``-cn``/``-cp`` from the overrides of the entry point
    of ``trainer`` (``run_verl --trainer``: its default config and the folder a relative config path
    starts from, :mod:`npu_rl.preflight.async_trainers`).

    Raises:
        ValueError: a Hydra flag this preflight cannot follow (``--multirun``, ``--config-dir``...), or an
            unknown trainer.
    """
    from npu_rl.preflight.async_trainers import trainer as find_trainer

    entry = find_trainer(trainer)
    name, path, rest = entry.config_name, None, []
    it = iter(args)
    for a in it:
        flag, eq, val = a.partition("=")
        if flag in ("--config-name", "-cn"):
            name = val if eq else next(it)
        elif flag in ("--config-path", "-cp"):
            path = val if eq else next(it)
        elif a.startswith("-"):
            raise ValueError(f"Hydra flag {a!r} is not supported by the preflight; pass overrides only")
        else:
            rest.append(a)
    config_dir = entry.config_dir(verl_package_dir())
    if path:
        p = Path(path)
        config_dir = p if p.is_absolute() else (config_dir.parent / p).resolve()
    if name.endswith(".yaml"):  # verl's scripts write --config-name='fully_async_ppo_megatron_trainer.yaml'
        name = name[: -len(".yaml")]
    return Cli(name, config_dir, rest, trainer)


def _is_group(key: str, config_dir: Path) -> bool:
    # hydra.* (hydra.searchpath from run_verl) shapes the composition itself: composed with the groups
    # a config group of the entry point's folder, or of verl's base config (on the experimental
    # trainers' searchpath, e.g. model_engine=megatron with fully_async_ppo_trainer)
    return (
        "/" in key
        or key.startswith("hydra.")
        or ("." not in key and ((config_dir / key).is_dir() or (verl_config_dir() / key).is_dir()))
    )


def _container(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False)


def _walk(tree: Any, parts: list[str]) -> tuple[int, Any]:
    """(number of leading parts that exist, node at that depth)."""
    node = tree
    for i, p in enumerate(parts):
        if isinstance(node, dict) and p in node:
            node = node[p]
        else:
            return i, node
    return len(parts), node


def _leaf_paths(tree: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.append(path)
            out.extend(_leaf_paths(v, path))
    return out


def suggest(tree: dict, key: str) -> str | None:
    """The existing key closest to ``key``, correcting one component at a time by its nearest sibling."""
    parts = key.split(".")
    node, fixed = tree, []
    for p in parts:
        if not isinstance(node, dict):
            break
        if p in node:
            fixed.append(p)
            node = node[p]
            continue
        close = difflib.get_close_matches(p, [str(k) for k in node], n=1, cutoff=0.6)
        if not close:
            break
        fixed.append(close[0])
        node = node[close[0]]
    else:
        return ".".join(fixed)
    return None


def same_leaf(tree: dict, key: str) -> str | None:
    """An existing key elsewhere with the same last component (``actor.x`` written for ``actor.megatron.x``)."""
    leaf = key.rsplit(".", 1)[-1]
    same = [p for p in _leaf_paths(tree) if p.rsplit(".", 1)[-1] == leaf]
    return max(same, key=lambda s: difflib.SequenceMatcher(None, s, key).ratio()) if same else None


def check_overrides(cli: Cli, report: Report) -> list[str]:
    """Check every override of ``cli`` against the base config; return the overrides safe to compose.

    A missing ``+`` is added (and reported), an unknown key is reported with a suggestion and dropped,
    so composition can go on and every other check still runs.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for raw in cli.overrides:
        try:
            parsed.append((raw, parser.parse_override(raw)))
        except Exception as e:  # noqa: BLE001 - Hydra's grammar errors are many types
            hint = "write key=value (quote values with spaces)"
            if "=" not in raw and raw.endswith(".sh"):
                hint = "an ENV_SCRIPT goes right after TRAIN_SCRIPT, before any override"
            report.error(raw, f"not a valid Hydra override: {e}", hint)
    groups = [raw for raw, o in parsed if _is_group(o.key_or_group, cli.config_dir)]
    try:
        with initialize_config_dir(config_dir=str(cli.config_dir), version_base=None):
            base = compose(cli.config_name, overrides=groups)
        cli.base, cli.base_groups = base, tuple(groups)
    except Exception as e:  # noqa: BLE001
        m = re.search(r"Could not find '([\w-]+)/([\w-]+)'", str(e))
        removed = REMOVED_UPSTREAM.get(f"{m.group(1)}={m.group(2)}") if m else None
        if removed:
            report.error(m.group(1), f"{m.group(1)}={m.group(2)} does not exist in the pinned verl", removed)
        else:
            report.error(" ".join(groups) or cli.config_name, f"verl's config does not compose: {e}")
        return []
    tree = _container(base)

    alternates = _Alternates(cli, groups)
    kept = list(groups)
    added: set[str] = set()  # keys an earlier override added with '+' (a recipe's, then the user's)
    for raw, o in parsed:
        key = o.key_or_group
        if raw in groups:
            continue
        parts = key.split(".")
        depth, node = _walk(tree, parts)
        exists = depth == len(parts)
        if not exists and key in added and not o.is_delete():
            if o.is_add():  # Hydra: "Could not append to config. An item is already at ..."
                report.error(
                    key,
                    f"'+{key}' adds a key an earlier override (the recipe's) already added",
                    f"drop the '+' to change it: {key}={_value_text(raw)}",
                )
                raw = raw[1:]
            kept.append(raw)
            continue
        value = o.value() if not o.is_delete() else None
        if o.is_delete():
            if exists:
                kept.append(raw)
            else:
                report.error(key, "cannot delete a key that does not exist", _fix_unknown(tree, key))
            continue
        if exists:
            if o.is_add():
                report.error(key, f"'+{key}' adds a key that already exists", f"drop the '+': {key}={_value_text(raw)}")
                kept.append(raw[1:])
            else:
                kept.append(raw)
            continue
        # The key does not exist in the base config.
        parent_path = ".".join(parts[:depth])
        freeform = _freeform_schema(tree, parts, depth, add=o.is_add() or o.is_force_add())
        if freeform is None and _is_feature_switch(key):
            # A feature whose patch would add this key: compose it anyway so that the feature table
            # reports whether this release carries it and the feature's combination rules still run.
            kept.append("++" + raw.lstrip("+"))
            cli.injected.append(key)
            added.add(key)
            continue
        if freeform is None and _is_feature_env(key):
            report.error(
                key,
                "is an environment variable of an npu-rl feature, not a config key",
                f"export {key}={_value_text(raw)} in the ENV_SCRIPT (every node sources it before Ray starts)",
            )
            continue
        alias = _interpolated(tree, parts) if freeform is None else None
        if alias:
            # e.g. rollout.mtp is ${oc.select:actor_rollout_ref.model.mtp, null}: Hydra cannot add below it
            report.error(
                key,
                f"{alias[0]} follows {alias[1]} (an interpolation): Hydra cannot set a key below it",
                f"set {alias[2]}={_value_text(raw)} (what {alias[0]} follows)",
            )
            continue
        reader = _dataclass_reading(tree, parts) if freeform is None else None
        if reader:
            # verl's yaml leaves out some fields its dataclasses read (rollout.enable_sleep_mode), at any
            # depth below a section with a _target_: the dataclass is the judge, and Hydra needs a '+'.
            if o.is_add() or o.is_force_add():
                kept.append(raw)
                added.add(key)
            else:
                report.error(
                    key,
                    f"{reader} reads this field but verl's yaml does not list it",
                    f"write +{key}={_value_text(raw)}",
                )
            continue
        beside = read_beside_dataclass(key) if freeform is None else None
        if beside:
            if o.is_add() or o.is_force_add():
                kept.append(raw)
                added.add(key)
            else:
                report.error(
                    key, f"{beside} reads it, but verl's yaml does not list it", f"write +{key}={_value_text(raw)}"
                )
            continue
        if freeform is None:
            section = parent_path or "the root"
            hint = _speculative_hint(key) or _fix_unknown(tree, key, alternates)
            report.error(key, f"no such key in verl's config (under {section})", hint)
            continue
        schema, below = freeform
        if schema == "plain" and not _checked_elsewhere(key):
            report.warn(key, f"adds a key {parent_path} does not define; nothing checks it", "check the spelling")
        if not (o.is_add() or o.is_force_add()):
            report.error(
                key,
                f"{parent_path} is a free-form dict: new keys need a '+'",
                f"write +{key}={_value_text(raw)}",
            )
            raw = "+" + raw
        bad = None if _switches_feature_on(key, value) else check_freeform(schema, below, value)
        if bad:
            msg, name, valid = bad
            close = difflib.get_close_matches(name, valid, n=3)
            report.error(key, msg, f"did you mean: {', '.join(close)}" if close else f"valid: {', '.join(valid[:20])}")
            continue
        kept.append(raw)
        added.add(key)
    return kept


def _checked_elsewhere(key: str) -> bool:
    """Keys added with '+' that a preflight rule checks: the sampler's (npu_rl/preflight/sampler.py), the
    legacy ``reward_model.reward_kwargs`` (``checks.check_overlong`` says which trainer reads it) and the
    V1 replay buffer's ``trainer.v1.sampler.poll_interval`` (``checks.check_poll_interval``)."""
    from npu_rl.sampler.keys import SAMPLER_KEYS

    return (
        key in {f"data.sampler.{k}" for k in SAMPLER_KEYS}
        or key.startswith("reward_model.reward_kwargs.")
        or key == "trainer.v1.sampler.poll_interval"
    )


def _is_feature_switch(key: str) -> bool:
    """Keys that switch a feature of this project: their availability is judged by the feature table."""
    from npu_rl.features import FEATURES

    return any(f.config and f.config[0] == key for f in FEATURES)


def _speculative_hint(key: str) -> str | None:
    """Short speculative-decoding names (the reference recipe's ``speculative_config.method=sam``,
    ``num_speculative_tokens=3``) point to vLLM's engine kwargs, not to verl's MTP keys."""
    from npu_rl.spec_decode.config import PREFIX

    parts = key.split(".")
    if "speculative_config" in parts:
        tail = ".".join(parts[parts.index("speculative_config") + 1 :])
    elif parts[-1] == "num_speculative_tokens" and "mtp" not in parts:
        tail = "num_speculative_tokens"
    else:
        return None
    return f"vLLM's speculative decoding is configured under {PREFIX}: write +{PREFIX}.{tail}=<value>"


def _is_feature_env(key: str) -> bool:
    """``key`` names a variable of the feature table (or one with its prefixes), e.g. ROLLOUT_REBALANCE_ENABLE."""
    from npu_rl.settings import known_env, own_prefixes

    return key in known_env() or key.startswith(own_prefixes())


def _switches_feature_on(key: str, value: object) -> bool:
    """``key=value`` is a feature's own on-switch (e.g. speculative_config.method=sam): the feature table,
    not the unpatched upstream's schema, judges it. Any other value is checked like every other key."""
    from npu_rl.features import FEATURES

    return any(f.config and f.config[0] == key and str(value).lower() == f.config[1].lower() for f in FEATURES)


class _Alternates:
    """The base config under the other ``model_engine`` choices, composed on demand.

    Finds keys that exist only with another engine (``actor.megatron.*`` in an FSDP recipe).
    """

    def __init__(self, cli: Cli, groups: list[str]):
        self.cli, self.groups, self.trees = cli, groups, None

    def _load(self) -> dict[str, dict]:
        from hydra import compose, initialize_config_dir

        trees = {}
        current = {g.split("=", 1)[0]: g.split("=", 1)[1] for g in self.groups if "=" in g}.get("model_engine")
        for yaml in sorted((self.cli.config_dir / "model_engine").glob("*.yaml")):
            if yaml.stem == current:
                continue
            others = [g for g in self.groups if not g.startswith("model_engine=")]
            try:
                with initialize_config_dir(config_dir=str(self.cli.config_dir), version_base=None):
                    trees[yaml.stem] = _container(compose(self.cli.config_name, [*others, f"model_engine={yaml.stem}"]))
            except Exception:  # noqa: BLE001,S112 - an engine whose config does not compose offers no hint
                continue
        return trees

    def hint(self, key: str) -> str | None:
        if self.trees is None:
            self.trees = self._load()
        for engine, tree in self.trees.items():
            depth, _ = _walk(tree, key.split("."))
            found = key if depth == len(key.split(".")) else suggest(tree, key)
            if found:
                mean = "" if found == key else f"; did you mean {found}?"
                return f"this key exists with model_engine={engine} (the recipe's engine differs){mean}"
        return None


def _interpolated(tree: dict, parts: list[str]) -> tuple[str, str, str] | None:
    """(section, the key it interpolates, the key to set instead) when a section above ``parts`` is an
    interpolation of another section, else None."""
    depth, node = _walk(tree, parts)  # node: the value at parts[:depth], the deepest part that exists
    if not 0 < depth < len(parts) or not isinstance(node, str):
        return None
    m = re.fullmatch(r"\$\{(?:oc\.select:)?\s*([\w.]+)\s*(?:,[^}]*)?\}", node)
    if not m:
        return None
    section = ".".join(parts[:depth])
    return section, m.group(1), ".".join([m.group(1), *parts[depth:]])


def _dataclass_of(node: Any) -> type | None:
    """The dataclass a config section builds (its ``_target_``), or None."""
    import dataclasses
    import importlib

    target = node.get("_target_") if isinstance(node, dict) else None
    if not isinstance(target, str) or "." not in target:
        return None
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None
    return cls if dataclasses.is_dataclass(cls) else None


def _field_dataclass(cls: type, name: str) -> type | None:
    """The dataclass type of field ``name`` of ``cls`` (through ``Optional[...]``), or None."""
    import dataclasses
    import typing

    try:
        hint = typing.get_type_hints(cls).get(name)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: not followed
        return None
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def _dataclass_reading(tree: dict, parts: list[str]) -> str | None:
    """``module.Class.field`` of the verl dataclass that reads the key ``parts``, else None.

    The nearest section above the key with a ``_target_`` dataclass is the start; the components below
    it must be fields of that dataclass and of the dataclass types of its fields, the last one a field.
    The answer depends only on those ``_target_`` names and the code they import (torch included:
    seconds), so it is kept between runs (:func:`npu_rl.preflight.memo.remember`).
    """
    from npu_rl.preflight.memo import remember

    targets = []
    for i in range(len(parts) - 1, 0, -1):
        depth, node = _walk(tree, parts[:i])
        if depth == i and isinstance(node, dict) and isinstance(node.get("_target_"), str):
            targets.append((i, node["_target_"]))
    if not targets:
        return None
    return remember("dataclass_reading", [parts, targets], lambda: _dataclass_reading_now(parts, targets))


def _dataclass_reading_now(parts: list[str], targets: list[tuple[int, str]]) -> str | None:
    import dataclasses

    for i, target in targets:
        cls = _dataclass_of({"_target_": target})
        if cls is None:
            continue
        for p in parts[i:-1]:
            cls = _field_dataclass(cls, p)
            if cls is None:
                return None
        if any(f.name == parts[-1] for f in dataclasses.fields(cls)):
            return f"{cls.__module__}.{cls.__qualname__}"
        return None
    return None


def _freeform_schema(tree: dict, parts: list[str], depth: int, add: bool = False) -> tuple[str, list[str]] | None:
    """(schema, components below the free-form dict) if the key lies under a free-form dict, else None.

    A dict is free-form when the config gives it no fields (``{}``) or it is a known free-form section;
    a section with a ``_target_`` dataclass is never free-form (an unknown key would crash verl).
    """
    for i in range(depth, 0, -1):
        _, node = _walk(tree, parts[:i])
        name = parts[i - 1]
        if name in FREEFORM_SCHEMAS:
            # MindSpeed extends megatron-core's TransformerConfig with its own fields: not checkable here.
            schema = "any" if name == "override_transformer_config" and "mindspeed" in parts[:i] else None
            return schema or FREEFORM_SCHEMAS[name], parts[i:]
        if isinstance(node, dict) and "_target_" in node:
            return None
        if isinstance(node, dict) and i == depth and (not node or add):
            # {} is free-form; a plain dict without a dataclass (ray_kwargs.ray_init, ...) accepts
            # keys added with '+', which verl passes on unchecked.
            return ("any" if not node else "plain"), parts[i:]
    return None


def _value_text(raw: str) -> str:
    return raw.split("=", 1)[1] if "=" in raw else ""


#: Keys the pinned verl removed without a successor (the ones it moved are found by ``suggest`` /
#: ``same_leaf`` in its own config). From the diff of the generated trainer yamls of verl 0.9.0 and
#: 0.9.1 (docs/maintaining.md); matched as a key's tail.
REMOVED_UPSTREAM = {
    "megatron.grad_offload": "verl 0.9.1 removed it: megatron.param_offload=True now also releases the "
    "gradient buffers while the engine is idle; delete the key",
    "data.continuous_token": "verl 0.9.1 removed data.continuous_token.* (no successor); delete the key",
    "model_engine=mindspeed": "verl 0.9.1 removed the MindSpeed-Megatron engine: use model_engine=megatron and "
    "actor_rollout_ref.actor.megatron.* (on NPU verl runs the megatron engine through MindSpeed)",
}


def _fix_unknown(tree: dict, key: str, alternates: _Alternates | None = None) -> str:
    for tail, why in REMOVED_UPSTREAM.items():
        if f".{tail}." in f".{key}.":  # the key is, ends with, or lies under the removed one
            return why
    s = suggest(tree, key)
    if s:
        return f"did you mean {s}?"
    other = alternates.hint(key) if alternates else None
    if other:
        return other
    s = same_leaf(tree, key)
    return f"did you mean {s}?" if s else "check the key against verl's _generated_ppo_*_trainer.yaml"


def compose_config(cli: Cli, overrides: list[str]):
    """Compose ``overrides`` with verl's config (raises Hydra's errors).

    Composed once: when :func:`check_overrides` already composed the config-group overrides
    (``cli.base``) and the others are plain values, those are applied to a copy of that config with
    Hydra's own ``ConfigLoaderImpl._apply_overrides_to_config``, the step ``compose`` itself ends
    with (hydra/_internal/config_loader_impl.py, ``load_configuration``): the same result, without
    reading and merging the whole defaults tree a second time (about 0.8 s on a 2-core machine).
    """
    import copy

    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if cli.base is not None:
        parsed = OverridesParser.create().parse_overrides(overrides)
        groups = tuple(o.input_line for o in parsed if _is_group(o.key_or_group, cli.config_dir))
        values = [o for o in parsed if o.input_line not in groups]
        if groups == cli.base_groups and not any(o.is_hydra_override() or o.package is not None for o in values):
            cfg = copy.deepcopy(cli.base)
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
            return cfg
    with initialize_config_dir(config_dir=str(cli.config_dir), version_base=None):
        return compose(cli.config_name, overrides=overrides)
