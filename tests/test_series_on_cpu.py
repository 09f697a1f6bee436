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


def test_first_patch_is_the_hccl_backport():
    series = load_series("verl")
    first = series.patches[0]
    assert first.name == "0001-verl-bugfix-hccl-weight-update-broadcast.patch"
    assert first.files == ("verl/checkpoint_engine/hccl_checkpoint_engine.py",)
    assert "7487" in first.meta["Upstream"]
    assert first.tests  # CI runs the upstream tests it names


def test_unlisted_patch_is_refused(series_copy):
    src = next((series_copy / "verl").glob("0001-*.patch"))
    shutil.copyfile(src, series_copy / "verl" / "0002-verl-feature-extra.patch")
    with pytest.raises(SeriesError, match="does not list 0002-verl-feature-extra.patch"):
        load_series("verl", series_copy)


def test_bad_name_is_refused(one_patch_series):
    src = next((one_patch_series / "verl").glob("0001-*.patch"))
    src.rename(one_patch_series / "verl" / "1-verl-fix.patch")
    (one_patch_series / "verl" / "series").write_text("1-verl-fix.patch\n")
    with pytest.raises(SeriesError, match="NNNN-verl-<feature|bugfix>-<name>.patch"):
        load_series("verl", one_patch_series)


def test_order_must_follow_numbers(one_patch_series):
    series_copy = one_patch_series
    d = series_copy / "verl"
    src = next(d.glob("0001-*.patch"))
    data = src.read_text()
    (d / "0003-verl-bugfix-a.patch").write_text(data)
    (d / "0002-verl-bugfix-b.patch").write_text(data)
    (d / "series").write_text(f"{src.name}\n0003-verl-bugfix-a.patch\n0002-verl-bugfix-b.patch\n")
    with pytest.raises(SeriesError, match="0002-verl-bugfix-b.patch comes after 0003"):
        load_series("verl", series_copy)


def test_missing_header_field_is_named(series_copy):
    src = next((series_copy / "verl").glob("0001-*.patch"))
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
