"""sources.lock: the real lock is complete and strict loading names the bad key."""

import re

import pytest

from npu_rl.errors import LockError
from npu_rl.lock import load_lock

STACK = {
    "verl": "0.9.1",
    "vllm": "0.23.0",
    "vllm-ascend": "0.23.0.post1",
    "megatron-core": "0.16.1",
    "mbridge": "0.15.1",
    "mindspeed": "0.16.0",
}


def test_real_lock_pins_the_whole_stack(lock):
    assert {n: u.version for n, u in lock.upstreams.items()} == STACK
    for up in lock.upstreams.values():
        # verl 0.9.1's tag could not be resolved when it was bumped (docs/maintaining.md): the note says so
        assert re.fullmatch(r"[0-9a-f]{40}", up.commit) or (up.name == "verl" and "not resolved" in up.note), up.name
        assert up.git.startswith("https://"), up.name
        assert up.patch_root == "."
    # every upstream but MindSpeed (git only) has an index archive with a full sha256
    assert {n for n, u in lock.upstreams.items() if u.pypi is None} == {"mindspeed"}
    for up in lock.upstreams.values():
        if up.pypi:
            assert re.fullmatch(r"[0-9a-f]{64}", up.pypi.sha256)
            assert up.version in up.pypi.filename


def _write(tmp_path, body):
    p = tmp_path / "sources.lock"
    p.write_text("schema = 1\n" + body)
    return p


GOOD = """
[[upstream]]
name = "demo"
version = "1.0"
git = "https://example.invalid/demo"
ref = "v1.0"
commit = "0123456789abcdef0123456789abcdef01234567"
"""


def test_minimal_lock_loads(tmp_path):
    lock = load_lock(_write(tmp_path, GOOD))
    assert lock.get("demo").identity == "demo 1.0 0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(LockError, match="no upstream named 'nope'.*known: demo"):
        lock.get("nope")


@pytest.mark.parametrize(
    "change, message",
    [
        (('commit = "0123456789abcdef0123456789abcdef01234567"', 'commit = "0123456"'), "commit .* full 40"),
        (('ref = "v1.0"', 'ref = "v1.0"\nsha = "x"'), "unknown key.*sha"),
        (('name = "demo"', 'name = "Demo_X"'), "name 'Demo_X'"),
        (('git = "https://example.invalid/demo"\n', ""), "missing key.*git"),
    ],
)
def test_bad_entries_name_the_key(tmp_path, change, message):
    with pytest.raises(LockError, match=message):
        load_lock(_write(tmp_path, GOOD.replace(*change)))


def test_bad_pypi_digest_is_refused(tmp_path):
    body = GOOD + '[upstream.pypi]\nproject = "demo"\nfilename = "demo-1.0.tar.gz"\nsha256 = "abc"\n'
    with pytest.raises(LockError, match="pypi.sha256 'abc'"):
        load_lock(_write(tmp_path, body))


def test_duplicate_and_missing_schema(tmp_path):
    with pytest.raises(LockError, match="appears twice"):
        load_lock(_write(tmp_path, GOOD + GOOD))
    p = tmp_path / "other.lock"
    p.write_text(GOOD)
    with pytest.raises(LockError, match="schema = 1"):
        load_lock(p)


def test_readme_stack_table_is_generated_from_the_lock(lock):
    from npu_rl import REPO_ROOT
    from npu_rl.lock import stack_table

    readme = (REPO_ROOT / "README.md").read_text()
    begin, end = "<!-- stack-table:begin -->\n", "\n<!-- stack-table:end -->"
    assert begin in readme and end in readme
    block = readme.split(begin, 1)[1].split(end, 1)[0]
    assert block == stack_table(lock), "README table is stale: python -m npu_rl.lock > paste it between the markers"
