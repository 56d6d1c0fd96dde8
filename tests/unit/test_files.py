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


def test_a_link_is_never_written_through(tmp_path):
    """report --force over a planted `report.md -> ~/.bashrc`: refused, the target and the link untouched, and
    no file of the set written (a link in the folders on the way, like reports/latest, is fine)."""
    target = tmp_path / "bashrc"
    target.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").symlink_to(target)
    (tmp_path / "latest").symlink_to(run)
    with pytest.raises(OSError, match=r"a symbolic link .*never written through"):
        write_set({tmp_path / "latest" / "report.json": "{}", tmp_path / "latest" / "report.md": "# x\n"})
    assert target.read_text() == "mine\n" and (run / "report.md").is_symlink(), "the link was followed or replaced"
    assert not (run / "report.json").exists(), "a file of the refused set was written"
    write_set({tmp_path / "latest" / "summary.md": "ok\n"})
    assert (run / "summary.md").read_text() == "ok\n", "a folder that is a link was not written through"
