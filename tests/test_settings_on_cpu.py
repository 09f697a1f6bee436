"""The declarative feature settings (npu_rl.settings): one declaration per variable, and everything
derived from it (readers, the preflight's checks, the README tables, --help) follows a new one.

Also: no module reads a feature variable itself, every bad value is one error type, and the import
circle between the feature table and rollout rebalance's settings is gone.
"""

from __future__ import annotations

import ast
import pickle
import re
import subprocess
import sys

import pytest

from npu_rl import REPO_ROOT, settings
from npu_rl.errors import NpuRlError
from npu_rl.settings import Feature, Setting, SettingsError

DEMO = Feature(
    "demo feature",
    "a feature declared by this test only",
    99,
    switch=settings.switch("NPU_RL_DEMO", "turns the demo on"),
    tuning=(
        Setting("NPU_RL_DEMO_LEVEL", int, 4, "how much demo", ge=1, le=8),
        Setting("NPU_RL_DEMO_LOG", str, "", "read by the driver only", reader="driver"),
    ),
    prefixes=("NPU_RL_DEMO",),
    patches=("verl/0002-verl-feature-random-init.patch",),  # any carried patch: the demo is "available"
)


@pytest.fixture
def demo(monkeypatch):
    monkeypatch.setattr(settings, "FEATURES", (*settings.FEATURES, DEMO))
    return DEMO


def _found(state, key, kind="errors"):
    return [(msg, fix) for k, msg, fix in getattr(state, kind) if k == key]


def test_a_new_declared_setting_reaches_the_reader_the_tables_and_help(demo, capsys):
    # the reader: typed, default when unset or blank, one error naming variable, value, allowed values
    assert settings.get("NPU_RL_DEMO_LEVEL", {}) == 4
    assert settings.get("NPU_RL_DEMO_LEVEL", {"NPU_RL_DEMO_LEVEL": " 6 "}) == 6
    assert settings.get("NPU_RL_DEMO_LEVEL", {"NPU_RL_DEMO_LEVEL": ""}) == 4
    with pytest.raises(SettingsError, match=re.escape("NPU_RL_DEMO_LEVEL=9 is not an integer in [1, 8]")):
        settings.get("NPU_RL_DEMO_LEVEL", {"NPU_RL_DEMO_LEVEL": "9"})
    assert settings.values("demo feature", {"NPU_RL_DEMO": "on"}) == {
        "NPU_RL_DEMO": True,
        "NPU_RL_DEMO_LEVEL": 4,
        "NPU_RL_DEMO_LOG": "",
    }
    # the README tables and the help text
    from npu_rl.features import features_table

    assert "| demo feature: a feature declared by this test only | `NPU_RL_DEMO=1` | `NPU_RL_DEMO_LEVEL`, " in (
        features_table()
    )
    assert "| `NPU_RL_DEMO_LEVEL` | demo feature | an integer in [1, 8] | 4 | worker | how much demo |" in (
        settings.settings_table()
    )
    with pytest.raises(SystemExit) as e:
        settings.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "NPU_RL_DEMO_LEVEL  [worker; default 4]" in out and "allowed: an integer in [1, 8]" in out
    # the launcher records the node's value of every declared variable
    assert {"NPU_RL_DEMO", "NPU_RL_DEMO_LEVEL", "NPU_RL_DEMO_LOG"} <= settings.known_env()


def test_the_preflight_judges_a_new_declared_setting(demo):
    def check(env, node_env=None):
        return settings.check(env, lambda _key: None, node_env)

    on = {"NPU_RL_DEMO": "1"}
    assert [f.name for f in check(on).on] == ["demo feature"] and not check(on).errors
    # out of range, and a type it is not
    (msg, fix), *_ = _found(check({**on, "NPU_RL_DEMO_LEVEL": "0"}), "NPU_RL_DEMO_LEVEL")
    assert msg == "NPU_RL_DEMO_LEVEL=0 is not an integer in [1, 8]" and "in the ENV_SCRIPT" in fix
    ((msg, _),) = _found(check({"NPU_RL_DEMO": "sometimes"}), "NPU_RL_DEMO")
    assert msg.startswith("NPU_RL_DEMO='sometimes' is not a boolean (1/0, true/false, yes/no, on/off)")
    # misspelt: under the feature's prefix but not declared
    ((msg, fix),) = _found(check({**on, "NPU_RL_DEMO_LEVLE": "3"}), "NPU_RL_DEMO_LEVLE", "warnings")
    assert "not a variable any npu-rl feature reads" in msg and fix == "did you mean NPU_RL_DEMO_LEVEL?"
    # set while the feature is off
    ((msg, fix),) = _found(check({"NPU_RL_DEMO_LEVEL": "3"}), "NPU_RL_DEMO_LEVEL", "warnings")
    assert "no effect: the demo feature is off" in msg and fix.startswith("switch it on with NPU_RL_DEMO=1")
    # set only in the train script: refused for a variable a Ray worker reads, fine for the driver's
    env = {**on, "NPU_RL_DEMO_LEVEL": "3", "NPU_RL_DEMO_LOG": "/tmp/demo.log"}
    st = check(env, node_env=on)
    ((msg, _),) = _found(st, "NPU_RL_DEMO_LEVEL")
    assert "'3' in the train script but '' in the node environment" in msg and "Ray workers" in msg
    assert not _found(st, "NPU_RL_DEMO_LOG")


def test_the_whole_preflight_reports_a_new_declared_setting(demo):
    pytest.importorskip("verl")
    from npu_rl.preflight import run_preflight
    from tests.test_preflight_on_cpu import BASE, ENV_2X16

    r = run_preflight(BASE, {**ENV_2X16, "NPU_RL_DEMO": "1", "NPU_RL_DEMO_LEVEL": "12"})
    errors = {p.key: p for p in r.report.errors}
    assert errors["NPU_RL_DEMO_LEVEL"].message == "NPU_RL_DEMO_LEVEL=12 is not an integer in [1, 8]", r.render()
    assert "demo feature" in dict(r.plan)["features on"]


def test_every_bad_value_is_one_error_type_naming_variable_value_and_allowed_values():
    garbage = "not-a-value"
    for name, (_, s) in settings.declared().items():
        if s.type is str and not s.choices:
            continue  # free text (a file path): every value is allowed
        with pytest.raises(SettingsError) as e:
            settings.get(name, {name: garbage})
        assert isinstance(e.value, NpuRlError) and isinstance(e.value, ValueError)
        assert (e.value.name, e.value.value, e.value.allowed) == (name, garbage, s.allowed())
        assert str(e.value) == f"{name}={garbage!r} is not {s.allowed()}"
    again = pickle.loads(pickle.dumps(e.value))  # what a Ray actor's error becomes on the driver
    assert (type(again), str(again), again.name) == (SettingsError, str(e.value), e.value.name)
    with pytest.raises(SettingsError, match=r"ALL_TO_ALL_RESHARD_BUCKET_MB='nan' is not a positive number of MiB"):
        settings.get("ALL_TO_ALL_RESHARD_BUCKET_MB", {"ALL_TO_ALL_RESHARD_BUCKET_MB": "nan"})
    assert settings.get("ROLLOUT_REBALANCE_DP_RANKS", {"ROLLOUT_REBALANCE_DP_RANKS": "AUTO"}) == "auto"
    assert settings.get("VLLM_SPECULATIVE_BATCH_SIZE_THRE", {"VLLM_SPECULATIVE_BATCH_SIZE_THRE": "Never"}) == "never"
    assert settings.get("VLLM_SPECULATIVE_BATCH_SIZE_THRE", {}) is None
    with pytest.raises(LookupError, match="NPU_RL_NOT_DECLARED is not a declared feature setting"):
        settings.get("NPU_RL_NOT_DECLARED", {})


def test_readme_settings_table_is_generated_from_the_declarations():
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split("<!-- settings-table:begin -->\n", 1)[1].split("\n<!-- settings-table:end -->", 1)[0]
    assert block == settings.settings_table(), "README settings table is stale: python tools/update_readme_tables.py"


# --- no feature variable is read outside the settings layer ----------------------------------------

_ENVISH = re.compile(r"(^|\.|_)(environ|env)$")


def _constants(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level names bound to string literals, or to dicts/tuples of them."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            walk = ast.walk(node.value)
            strings = {n.value for n in walk if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if strings:
                out[node.targets[0].id] = strings
    return out


def _names(node: ast.AST, consts: dict[str, set[str]]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        return consts.get(node.id, set())
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):  # ENV["factor"]
        return consts.get(node.value.id, set())
    return set()  # f-strings (f"{PREFIX}ENABLE") are not resolved: no reader builds names that way


def _python_reads(path, declared: set[str]) -> list[str]:
    """``env.get(NAME)``, ``os.getenv(NAME)``, ``environ[NAME]``, ``NAME in env`` of a declared variable,
    where NAME is a literal, a module constant or an entry of a module-level dict/tuple of them."""
    tree = ast.parse(path.read_text(), str(path))
    consts = _constants(tree)
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "getenv" or (
                node.func.attr in ("get", "pop") and _ENVISH.search(ast.unparse(node.func.value))
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _ENVISH.search(ast.unparse(node.value)):
            key = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            if _ENVISH.search(ast.unparse(node.comparators[0])):
                key = node.left
        if key is not None and _names(key, consts) & declared:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def feature_reads_outside_the_layer() -> list[str]:
    declared = set(settings.declared())
    found = []
    for path in sorted((REPO_ROOT / "npu_rl").rglob("*.py")):
        if path != REPO_ROOT / "npu_rl" / "settings.py":
            found += [f"{path.parent.relative_to(REPO_ROOT)}/{r}" for r in _python_reads(path, declared)]
    for patch in sorted((REPO_ROOT / "patches").rglob("*.patch")):
        for n, line in enumerate(patch.read_text().splitlines(), 1):
            if line.startswith("+") and re.search(r"environ|getenv", line) and any(d in line for d in declared):
                found.append(f"{patch.relative_to(REPO_ROOT)}:{n}: {line}")
    return found


def test_no_feature_variable_is_read_outside_the_settings_layer():
    assert feature_reads_outside_the_layer() == []


def test_the_grep_finds_reads_outside_the_layer(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n"
        'SWITCH = "NPU_RL_ENGINE_GC"\n'
        'ENV = {"factor": "VLLM_ROLLOUT_EARLY_STOP_FACTOR"}\n'
        'a = os.environ.get(SWITCH, "0")\n'
        'b = float(env[ENV["factor"]])\n'
        'c = os.getenv("ROLLOUT_REBALANCE_ORDER")\n'
        'd = "USE_ALLTOALL_OVERLAP" in node_env\n'
        "e = settings.get(SWITCH, env)\n"  # the layer's own reader: fine
        'f = os.environ.get("NPU_RL_CACHE")\n'  # not a feature variable
    )
    lines = sorted(r.split(": ", 1)[0] for r in _python_reads(probe, set(settings.declared())))
    assert lines == ["probe.py:4", "probe.py:5", "probe.py:6", "probe.py:7"]


# --- the import circle ------------------------------------------------------------------------------


def test_the_settings_layer_imports_no_feature_module():
    tree = ast.parse((REPO_ROOT / "npu_rl" / "settings.py").read_text())
    ours = {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("npu_rl")
    }
    assert ours == {"npu_rl", "npu_rl.errors"}


@pytest.mark.parametrize("first", ["npu_rl.rebalance.settings", "npu_rl.features", "npu_rl.settings"])
def test_each_module_imports_first_in_a_fresh_interpreter(first):
    code = f"import {first}, npu_rl.features, npu_rl.rebalance.settings; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_cli_checks_this_environment_and_prints_the_tables(monkeypatch, capsys):
    for name in settings.known_env():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NPU_RL_ENGINE_GC", "1")
    assert settings.main(["--check"]) == 0
    assert "features switched on here: no GC pauses in decode steps" in capsys.readouterr().out
    monkeypatch.setenv("ROLLOUT_REBALANCE_ORDER", "shortest")
    monkeypatch.setenv("NPU_RL_ENGINE_GC_EVRY", "3")
    assert settings.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "error: ROLLOUT_REBALANCE_ORDER: ROLLOUT_REBALANCE_ORDER='shortest' is not one of 'longest', 'fifo'" in err
    assert "warning: NPU_RL_ENGINE_GC_EVRY:" in err and "did you mean NPU_RL_ENGINE_GC_EVERY?" in err
    assert settings.main(["--table", "settings"]) == 0
    assert capsys.readouterr().out == settings.settings_table() + "\n"
