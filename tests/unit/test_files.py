"""Atomic writes: a reader sees the old file or the new one, never a half-written one."""

import os
import stat

import pytest

from replaytests.files import write_atomic


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
