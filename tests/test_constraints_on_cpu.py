"""constraints/npu.txt (the full NPU pins, tools/lock_npu_env.py) against cpu.txt, npu.in and the installers.

No network: the generator's resolution is not run here; its rules (check_constraints) and the pieces
that feed it are, on the real files and on small made-up ones that must fail.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from npu_rl import REPO_ROOT

CONSTRAINTS = REPO_ROOT / "constraints"


def _load_tool():
    path = REPO_ROOT / "tools" / "lock_npu_env.py"
    spec = importlib.util.spec_from_file_location("lock_npu_env", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


lock = _load_tool()


@pytest.fixture(scope="module")
def real():
    return {
        "cpu": (CONSTRAINTS / "cpu.txt").read_text(),
        "npu": (CONSTRAINTS / "npu.txt").read_text(),
        "npu_in": (CONSTRAINTS / "npu.in").read_text(),
    }


def _text(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _npu(base: list[str], pins: list[str]) -> str:
    return _text("# header", lock.BASE_BEGIN, *base, lock.BASE_END, *pins)


# ------------------------------------------------------------------- the real files


def test_npu_txt_keeps_every_rule(real):
    assert lock.check_constraints(real["cpu"], real["npu"], real["npu_in"]) == []


def test_shared_packages_have_the_cpu_version_outside_the_allow_list(real):
    cpu = lock.parse_constraints(real["cpu"]).versions()
    npu = lock.parse_constraints(real["npu"]).versions()
    shared = set(cpu) & set(npu)
    assert len(shared) > 150  # a full file, not the six pins of old
    differ = {name for name in shared if cpu[name] != npu[name]}
    assert differ == set(lock.ALLOW_DIFFERENT)
    assert all(reason.strip() for reason in lock.ALLOW_DIFFERENT.values())


def test_ray_is_pinned_identically(real):
    cpu = lock.parse_constraints(real["cpu"]).versions()
    npu = lock.parse_constraints(real["npu"]).versions()
    assert npu["ray"] is not None and npu["ray"] == cpu["ray"]
    assert "ray" not in lock.ALLOW_DIFFERENT


def test_every_package_npu_in_names_is_pinned_within_its_window(real):
    pins = lock.parse_constraints(real["npu"]).versions()
    for req in lock.requirement_lines(real["npu_in"]):
        version = pins.get(lock.canon(req.name))
        assert version is not None, f"npu.txt does not pin {req.name}"
        assert req.specifier.contains(version, prereleases=True), f"{req} vs {version}"


def test_outside_the_base_section_every_line_is_an_exact_pin(real):
    parsed = lock.parse_constraints(real["npu"])
    assert {name: str(req) for name, req in parsed.pins.items() if lock.exact_version(req) is None} == {}
    assert set(parsed.base) == set(lock.BASE_IMAGE) and not set(parsed.base) & set(parsed.pins)


def test_base_section_is_the_images_torch_stack_and_matches_the_dockerfile(real):
    parsed = lock.parse_constraints(real["npu"])
    assert {name: lock.exact_version(req) for name, req in parsed.base.items()} == lock.BASE_IMAGE
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    (step1,) = [line for line in dockerfile.splitlines() if line.startswith("RUN") and "torch-npu==" in line]
    assert "-c constraints/npu.txt" in step1
    assert dict(re.findall(r"([a-z-]+)==(\S+)", step1)) == lock.BASE_IMAGE


def test_header_says_how_and_when_it_was_generated(real):
    head = [line for line in real["npu"].splitlines() if line.startswith("#")][:8]
    assert any("tools/lock_npu_env.py" in line for line in head)
    assert any(re.match(r"# Generated on \d{4}-\d{2}-\d{2} with uv \d", line) for line in head)
    assert "uv pip compile" in real["npu"] and f"--python-platform {lock.PYTHON_PLATFORM}" in real["npu"]
    m = re.search(r"^# (\d+) pins\.", real["npu"], re.MULTILINE)
    parsed = lock.parse_constraints(real["npu"])
    assert m and int(m[1]) == len(parsed.pins) + len(parsed.base)


def test_every_dependency_resolving_pip_call_of_the_npu_path_takes_the_constraints():
    script = (REPO_ROOT / "install_stack.sh").read_text()
    calls = []
    functions = ("install::npu", "install::upstreams", "install::vllm_requirements", "install::vllm_ascend")
    for function in (*functions, "install::build_tools"):
        body = re.search(rf"^{re.escape(function)}\(\) {{\n(.*?)^}}", script, re.MULTILINE | re.DOTALL)[1]
        joined = re.sub(r"\\\n\s*", " ", body)
        calls += [line.strip() for line in joined.splitlines() if re.search(r"\binstall::pip\b", line)]
    assert len(calls) >= 8
    unconstrained = [call for call in calls if not re.search(r'-c "\$(constraints|1)"', call)]
    # Only the build tools go without: --target outside the venv, pinned by constraints/build-tools.txt.
    assert len(unconstrained) == 1 and "--target" in unconstrained[0] and "build-tools.txt" in unconstrained[0]
    assert re.search(r'install::upstreams "\$constraints"', script)
    assert 'local constraints="$NPU_RL_ROOT/constraints/npu.txt"' in script


def test_the_generator_reads_vllms_requirements_as_install_stack_filters_them():
    script = (REPO_ROOT / "install_stack.sh").read_text()
    assert f"grep -v -E '{lock.VLLM_FILTER}'" in script
    common = _text("# c", "-r other.txt", "", "torch == 2.9", "torchvision", "triton>=3", "regex # x", "tqdm")
    assert lock.vllm_requirements(common) == _text("regex # x", "tqdm")
    assert lock.transferqueue_pin(script) == lock.parse_constraints(
        (CONSTRAINTS / "npu.txt").read_text()
    ).versions().get("transferqueue")


# ------------------------------------------------------------------- the checks themselves


def test_disagreements_on_made_up_pins():
    assert lock.disagreements({"ray": "2.60.0", "a": "1"}, {"ray": "2.60.0", "a": "1", "b": "3"}, {}) == []
    (problem,) = lock.disagreements({"ray": "2.60.0", "a": "1"}, {"ray": "2.61.0", "a": "1"}, {})
    assert problem.startswith("ray:") and "2.60.0" in problem and "2.61.0" in problem
    assert lock.disagreements({"torch": "2.11.0"}, {"torch": "2.10.0"}, {"torch": "why"}) == []


def test_stale_allowances_on_made_up_pins():
    assert lock.stale_allowances({"torch": "2.11.0"}, {"torch": "2.10.0"}, {"torch": "why"}) == []
    assert "both files pin 1" in lock.stale_allowances({"a": "1"}, {"a": "1"}, {"a": "why"})[0]
    assert "not pinned by both" in lock.stale_allowances({"a": "1"}, {}, {"a": "why"})[0]


CPU = _text("# cpu", "ray==2.60.0", "GitPython==3.2.1", "torch==2.11.0", "numpy==2.3.5")
NPU_IN = _text("numpy>=2,<2.5", "gitpython", "ray")


def test_check_constraints_agreeing_made_up_files():
    npu = _npu(["torch==2.10.0"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.60.0", "extra==1.0"])
    assert lock.check_constraints(CPU, npu, NPU_IN, {"torch": "the image's"}) == []


@pytest.mark.parametrize(
    ("base", "pins", "allow", "expected"),
    [
        # a shared package at another version
        (["torch==2.10.0"], ["gitpython==3.2.0", "numpy==2.3.5", "ray==2.60.0"], {"torch": "x"}, "gitpython: cpu.txt"),
        # ... and torch without its allow-list entry
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.60.0"], {}, "torch: cpu.txt"),
        # ray differs
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.61.0"], {"torch": "x"}, "ray: cpu.txt"),
        # ray missing from npu.txt
        (
            ["torch==2.10.0"],
            ["gitpython==3.2.1", "numpy==2.3.5"],
            {"torch": "x"},
            "ray: cpu.txt pins 2.60.0, npu.txt None",
        ),
        # ray allowed to differ
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.61.0"], {"torch": "x", "ray": "x"}, "never"),
        # an unpinned line outside the base section
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy>=2", "ray==2.60.0"], {"torch": "x"}, "not an exact '==' pin"),
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy==2.*", "ray==2.60.0"], {"torch": "x"}, "not an exact '==' pin"),
        # a package npu.in names, missing
        (["torch==2.10.0"], ["numpy==2.3.5", "ray==2.60.0"], {"torch": "x"}, "npu.in names gitpython"),
        # pinned outside npu.in's window
        (["torch==2.10.0"], ["gitpython==3.2.1", "numpy==1.26.4", "ray==2.60.0"], {"torch": "x"}, "npu.in asks numpy"),
        # a stale allow-list entry
        (["torch==2.11.0"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.60.0"], {"torch": "x"}, "both files pin"),
    ],
)
def test_check_constraints_catches_each_broken_rule(base, pins, allow, expected):
    problems = lock.check_constraints(CPU, _npu(base, pins), NPU_IN, allow)
    assert any(expected in p for p in problems), problems


def test_only_the_base_section_may_hold_loose_lines():
    npu = _npu(["torch>=2.10", "triton-ascend"], ["gitpython==3.2.1", "numpy==2.3.5", "ray==2.60.0"])
    assert lock.check_constraints(CPU, npu, NPU_IN, {"torch": "x"}) == []


def test_parse_canonicalizes_names_and_refuses_broken_files():
    parsed = lock.parse_constraints(_text("GitPython==3.2.1", "docstring_parser==0.18.0  # c", "Ruamel.Yaml==1"))
    assert parsed.versions() == {"gitpython": "3.2.1", "docstring-parser": "0.18.0", "ruamel-yaml": "1"}
    with pytest.raises(lock.LockError, match="listed twice"):
        lock.parse_constraints(_text("GitPython==3.2.1", "gitpython==3.2.1"))
    with pytest.raises(lock.LockError, match="not closed"):
        lock.parse_constraints(_text(lock.BASE_BEGIN, "torch==2.10.0"))
    with pytest.raises(lock.LockError, match="options"):
        lock.parse_constraints(_text("-r other.txt"))
    with pytest.raises(lock.LockError, match="line 2"):
        lock.parse_constraints(_text("a==1", "not a requirement!"))


def test_uv_gets_pips_index_and_the_no_wheel_message_is_read():
    config = _text(
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "global.index-url='https://mirror.invalid/simple'",
        ":env:.find-links='/opt/wheels'",
        "global.cert='/etc/ssl/certs/ca.crt'",
    )
    opts = lock.pip_index_options(config, {"PIP_INDEX_URL": "https://other.invalid/simple"})
    assert opts == [
        "--index-url",
        "https://other.invalid/simple",
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--find-links",
        "/opt/wheels",
        "--index-strategy",
        "unsafe-best-match",
    ]
    assert lock.pip_index_options("", {}) == ["--index-strategy", "unsafe-best-match"]
    message = (
        "cause: Because llguidance{platform_machine == 'aarch64' or platform_machine == 'x86_64'}==1.7.6 has no "
        "usable wheels and you require llguidance{platform_machine == 'aarch64'}==1.7.6, we can conclude ..."
    )
    m = lock.NO_WHEEL.search(message)
    assert m and (m[1], m[2]) == ("llguidance", "1.7.6")


def _reqs(*lines):
    from packaging.requirements import Requirement

    return [Requirement(line) for line in lines]


def test_review_upstreams_wants_a_decision_for_every_gap():
    declared = {"vllm-ascend": _reqs("fastapi<0.124.0", "quart", "scipy", "torch==2.10.0", "pip")}
    pins = {"fastapi": "0.165.0", "torch": "2.10.0"}
    review = lock.review_upstreams(
        declared, pins, {"pip"}, left_out={}, accepted={}, expected=["vllm-ascend", "mindspeed"]
    )
    assert review.not_checked == ["mindspeed"]
    assert len(review.problems) == 3
    assert any("declares quart" in p and "LEFT_OUT" in p for p in review.problems)
    assert any("declares scipy" in p for p in review.problems)
    assert any(p.startswith("fastapi==0.165.0 is outside vllm-ascend's declared <0.124.0") for p in review.problems)
    # decided: left out with a reason, the window accepted with a reason, scipy pinned
    decided = lock.review_upstreams(
        declared,
        {**pins, "scipy": "1.17.1"},
        {"pip"},
        left_out={"vllm-ascend": {"quart": "not imported"}},
        accepted={("vllm-ascend", "fastapi"): ("<0.124.0", "why")},
    )
    assert decided.problems == []


@pytest.mark.parametrize(
    ("left_out", "accepted", "pins", "expected"),
    [
        # a left-out name the upstream no longer declares
        ({"vllm-ascend": {"quart": "x", "gone": "x"}}, {}, {}, "lists gone, which vllm-ascend no longer declares"),
        # a left-out name that is pinned after all
        ({"vllm-ascend": {"quart": "x"}}, {}, {"quart": "0.20.0"}, "lists quart, yet npu.txt pins it"),
        # an accepted window that the upstream changed
        (
            {"vllm-ascend": {"quart": "x"}},
            {("vllm-ascend", "fastapi"): ("<0.120", "x")},
            {},
            "now declares fastapi<0.124.0",
        ),
        # an accepted window that the pin no longer leaves
        (
            {"vllm-ascend": {"quart": "x"}},
            {("vllm-ascend", "fastapi"): ("<0.124.0", "x")},
            {"fastapi": "0.123.10"},
            "yet the pin is inside",
        ),
    ],
)
def test_review_upstreams_flags_stale_decisions(left_out, accepted, pins, expected):
    declared = {"vllm-ascend": _reqs("fastapi<0.124.0", "quart")}
    review = lock.review_upstreams(declared, {"fastapi": "0.165.0", **pins}, set(), left_out, accepted)
    assert any(expected in p for p in review.problems), review.problems


def test_the_decision_tables_agree_with_npu_txt(real):
    pins = lock.parse_constraints(real["npu"]).versions()
    for upstream, names in lock.LEFT_OUT.items():
        assert upstream in lock.NO_DEPS_TREES
        for name, why in names.items():
            assert lock.canon(name) == name and why.strip(), (upstream, name)
            assert name not in pins, f"LEFT_OUT[{upstream}] lists {name}, yet npu.txt pins it"
    for (upstream, name), (window, why) in lock.ACCEPTED_OUTSIDE.items():
        assert upstream in lock.NO_DEPS_TREES and why.strip()
        assert pins.get(name) and not lock.SpecifierSet(window).contains(pins[name], prereleases=True)
    # the header says what the tables say
    for line in lock.decision_lines(pins):
        assert line in real["npu"].splitlines(), line
    # what the stack needs of vllm-ascend's and MindSpeed's requirements (constraints/npu.in)
    assert {"scipy", "decorator"} <= {lock.canon(r.name) for r in lock.requirement_lines(real["npu_in"])}


def test_the_pinned_trees_declare_nothing_undecided(real):
    """The upstreams in sources/ (MindSpeed is git only: often absent) against npu.txt: every gap decided."""
    if not (REPO_ROOT / "sources" / "vllm-ascend" / "PKG-INFO").is_file():
        pytest.skip("sources/vllm-ascend is not downloaded")
    parsed = lock.parse_constraints(real["npu"])
    pins = {name: lock.exact_version(req) for name, req in {**parsed.pins, **parsed.base}.items()}
    declared = lock.declared_requirements(REPO_ROOT, None)
    skip = set(lock.BASE_IMAGE) | lock.editable_names((REPO_ROOT / "sources.lock").read_text()) | {"pip"}
    review = lock.review_upstreams(declared, pins, skip | {"transferqueue"})
    assert review.problems == []
