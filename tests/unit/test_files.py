"""Atomic writes: a reader sees the old file or the new one, never a half-written one."""

import os
import stat

import pytest

from replaytests.files import write_atomic, write_set


def test_written_file_has_the_mode_open_would_give(tmp_path):
    path = tmp_path / "out.json"
    write_atomic(path, "{}\n")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, oct(path.stat().st_mode)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "ledger.jsonl"
    write_atomic(path, "old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "new \ud800\n")  # a lone surrogate cannot be encoded as UTF-8
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl"]


def test_a_set_is_written_whole_or_not_at_all(tmp_path):
    # report --force, a bank and its manifest: one file that cannot be written leaves every file as it was.
    old = {tmp_path / "report.json": "old json", tmp_path / "report.md": "old md"}
    for path, text in old.items():
        path.write_text(text)
    (tmp_path / "report.html").mkdir()
    with pytest.raises(IsADirectoryError):
        write_set({path: "new" for path in (*old, tmp_path / "report.html")})
    now = {path: path.read_text() for path in old}
    assert now == old, f"a set that failed changed files: {now}"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert not left, f"temporary files left behind: {left}"


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    # history append --into a link to a shared file: the shared file gains the line, the link stays.
    shared = tmp_path / "shared" / "history.jsonl"
    shared.parent.mkdir()
    shared.write_text("night 1\n")
    link = tmp_path / "mine.jsonl"
    link.symlink_to(shared)
    write_set({link: "night 1\nnight 2\n"})
    assert link.is_symlink(), "the link was replaced by a private file"
    assert shared.read_text() == "night 1\nnight 2\n", f"the link's target holds {shared.read_text()!r}"
