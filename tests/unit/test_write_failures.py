"""A run whose final files cannot be written (a full disk) keeps every record it finished, says so in
one line and exits with its own status, not "a check failed". A real run on a real full filesystem:
a 48 KiB tmpfs, which holds the records of one row but not the reports (skipped where this machine
does not let a test mount one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replaytests.outputs.rundir import LATEST, RECORDS
from replaytests.suite.collector import WRITE_FAILED


def _tmpfs(tmp_path: Path, size: str) -> Path:
    """A tmpfs of `size` mounted under tmp_path (skipped where this machine does not let a test mount one)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) for a small tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip() or made.returncode}")
    return mount


@pytest.fixture
def full_disk(tmp_path):
    """48 KiB: the records of one row fit, the reports do not."""
    mount = _tmpfs(tmp_path, "48k")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def tiny_disk(tmp_path):
    """12 KiB: the run's records file fills it after a record or two."""
    mount = _tmpfs(tmp_path, "12k")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_at_the_end_keeps_the_records_and_says_so(full_disk):
    root = full_disk / "reports"
    argv = [str(Path(sys.executable).with_name("replaytests")), "audit", "--rows", "1", "--precision", "fp32",
            "--workers", "1", "--report-dir", str(root), "--run-name", "full"]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"CI": "1"}, timeout=600,
                          check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert done.returncode == WRITE_FAILED, (f"exit {done.returncode}, expected {WRITE_FAILED}:\n"
                                             f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    assert len(errors) == 1 and "No space left on device" in errors[0], f"not one line naming the cause: {errors}"
    assert "Traceback" not in done.stdout + done.stderr, f"a traceback reached the user:\n{done.stderr[-3000:]}"
    kept = [json.loads(line) for line in (root / "full" / RECORDS).read_text().splitlines()]
    assert kept and {r["family"] for r in kept} >= {"live", "crossing"}, (
        f"the finished records were not kept: {[(r['family'], r['row']) for r in kept]}")
    assert f"its {len(kept)} records are kept in {root / 'full' / RECORDS}" in errors[0], errors[0]
    assert not (root / LATEST).exists(), "latest was moved to a run whose files were not written"



def test_a_disk_that_fills_during_the_appends_stops_the_run_without_tracebacks(tiny_disk):
    root = tiny_disk / "reports"
    argv = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:xdist", "-p",
            "no:cacheprovider", "--rows", "2", "--precision", "fp32", "--report-dir", str(root), "--run-name", "full"]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"CI": "1"}, timeout=600,
                          check=False)
    out = done.stdout + done.stderr
    assert done.returncode == WRITE_FAILED, f"exit {done.returncode}, expected {WRITE_FAILED}:\n{out[-3000:]}"
    assert "Traceback" not in out and "OSError" not in out, f"a traceback reached the user:\n{out[-3000:]}"
    assert "; the run stops, keeping the records appended before it" in out, out[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert len(failed) <= 2, f"the run went on after the disk filled: {failed}"
    assert not (root / LATEST).exists(), "latest was moved to a run whose records were not all kept"
