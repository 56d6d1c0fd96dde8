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
from replaytests.suite.plugin import WRITE_FAILED


@pytest.fixture
def full_disk(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) for a small tmpfs")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip() or made.returncode}")
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
