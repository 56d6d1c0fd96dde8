"""A reader that leaves early (`replaytests compare A B | head -1`): the command ends quietly, and a
verdict keeps its exit status, so that `set -o pipefail` still fails a failing gate. Real subprocesses
writing into a pipe whose read end is already closed, so the first write is refused (EPIPE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaytests.inputs.options import REPO

LEDGERS = REPO / "fixtures" / "ledgers"


def _into_closed_pipe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "replaytests.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=cwd, timeout=120, check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize(("args", "code"), [
    pytest.param(("compare", str(LEDGERS / "cpu-tiny"), str(LEDGERS / "cpu-tiny")), 0, id="compare-pass"),
    # the same inputs on two CPUs: every FP32 record's bits differ, so the gate at bits fails
    pytest.param(("compare", str(LEDGERS / "cpu-tiny"), str(LEDGERS / "cpu-tiny-xeon")), 1, id="compare-fail"),
    pytest.param(("models", "list"), 0, id="models-list"),
])
def test_a_closed_pipe_ends_quietly_with_the_commands_own_status(tmp_path, args, code):
    done = _into_closed_pipe(*args, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (code, ""), (
        f"replaytests {' '.join(args)} into a closed pipe: exit {done.returncode} (expected {code}), "
        f"stderr {done.stderr[-600:]!r} (expected nothing)")
