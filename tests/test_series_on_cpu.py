"""Series loading: naming, order, headers, CRLF; the repository's own series is valid."""

import shutil

import pytest

from npu_rl.errors import SeriesError
from npu_rl.patches.series import load_series, normalize_newlines, series_upstreams


def test_repository_series_are_valid(lock):
    for name in series_upstreams():
        assert name in lock.upstreams, f"patches/{name} has no entry in sources.lock"
        series = load_series(name)
        for p in series.patches:
            assert p.meta["Kind"] == p.kind
            assert all(f for f in p.files)


def test_tests_fields_name_files_of_the_upstream_tree(pristine_sources):
    """A ``Tests:`` path names an upstream test (run in the patched tree by run_tests.sh's upstream stage).

    Our own tests live in tests/ and are not named there: a path the tree lacks would fail the full
    tier ~40 minutes in, so it fails here, in the quick tier, naming the patch."""
    for name in series_upstreams():
        tree = pristine_sources / name
        for p in load_series(name).patches:
            for t in p.tests:
                added = any(f == t or f.startswith(t.rstrip("/") + "/") for f in p.files)
                assert added or (tree / t).exists(), (
                    f"patches/{name}/{p.name}: Tests: {t} is not in the {name} tree; name upstream tests only"
                )


def first_patch(patches):
    """The first patch file of the verl series in ``patches`` (its number is whatever the series says)."""
    return patches / "verl" / load_series("verl", patches).patches[0].name


def test_export_keeps_numbers_and_renumbers_only_what_moved():
    from npu_rl.patches.export import number_patches

    known = {("bugfix", "a"): 1, ("feature", "b"): 2, ("feature", "c"): 3}
    # 0001 dropped (contained upstream): the others keep 0002 and 0003
    assert number_patches([("feature", "b"), ("feature", "c")], known) == [2, 3]
    # a new patch between them takes the next number; the one after it moves up
    assert number_patches([("feature", "b"), ("bugfix", "new"), ("feature", "c")], known) == [2, 3, 4]
    # reordered: numbers must still increase along the series
    assert number_patches([("feature", "c"), ("feature", "b")], known) == [3, 4]
    # a kind change is a different patch
    assert number_patches([("feature", "a")], known) == [1]
    assert number_patches([("bugfix", "b")], known) == [1]


def test_unlisted_patch_is_refused(series_copy):
    src = first_patch(series_copy)
    shutil.copyfile(src, series_copy / "verl" / "0099-verl-feature-extra.patch")
    with pytest.raises(SeriesError, match="does not list 0099-verl-feature-extra.patch"):
        load_series("verl", series_copy)


def test_bad_name_is_refused(one_patch_series):
    src = first_patch(one_patch_series)
    src.rename(one_patch_series / "verl" / "1-verl-fix.patch")
    (one_patch_series / "verl" / "series").write_text("1-verl-fix.patch\n")
    with pytest.raises(SeriesError, match="NNNN-verl-<feature|bugfix>-<name>.patch"):
        load_series("verl", one_patch_series)


def test_order_must_follow_numbers(one_patch_series):
    series_copy = one_patch_series
    d = series_copy / "verl"
    src = first_patch(series_copy)
    data = src.read_text()
    (d / "0098-verl-feature-a.patch").write_text(data)
    (d / "0097-verl-feature-b.patch").write_text(data)
    (d / "series").write_text(f"{src.name}\n0098-verl-feature-a.patch\n0097-verl-feature-b.patch\n")
    with pytest.raises(SeriesError, match="0097-verl-feature-b.patch comes after 0098"):
        load_series("verl", series_copy)


def test_missing_header_field_is_named(series_copy):
    src = first_patch(series_copy)
    text = "\n".join(line for line in src.read_text().split("\n") if not line.startswith("Switch:"))
    src.write_text(text)
    with pytest.raises(SeriesError, match="missing Switch"):
        load_series("verl", series_copy)


def test_listed_but_missing_file(series_copy):
    with open(series_copy / "verl" / "series", "a") as fh:
        fh.write("0009-verl-feature-ghost.patch\n")
    with pytest.raises(SeriesError, match="lists 0009-verl-feature-ghost.patch, which does not exist"):
        load_series("verl", series_copy)


def test_crlf_file_is_read_as_lf_but_crlf_content_lines_survive():
    lf = b"Subject: x\n---\ndiff --git a/f b/f\n-a\r\n+b\r\n"
    assert normalize_newlines(lf) == lf  # LF patch carrying CRLF content: untouched
    crlf = lf.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    assert normalize_newlines(crlf) == lf.replace(b"\r\n", b"\n")
    digest_lf = load_series("verl").digest
    assert len(digest_lf) == 16
