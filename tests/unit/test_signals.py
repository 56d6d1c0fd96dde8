"""Stopping a run from outside, as a terminal (Ctrl-C) or a CI runner (SIGTERM) does: the audit forwards
the signal to its child pytest once, waits for it, and the run keeps every record it finished, marked
interrupted, with `latest` not moved and no process left behind. Real subprocesses, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaytests.outputs.rundir import LATEST, RECORDS

INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _processes_naming(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(proc.name)
        except OSError:
            continue
    return found


def _stopped(argv: list[str], records: Path, count: int, send, env: dict | None = None) -> tuple[int, str]:
    """Start `argv` in a process group of its own, `send(process)` once `records` holds `count` records, and
    wait for it to end: its exit status and output."""
    process = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env)
    try:
        _wait_for(lambda: records.is_file() and records.read_text().count("\n") >= count, 240, f"{count} records")
        send(process)
        out, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, out.decode(errors="replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to prove no process is left")
@pytest.mark.parametrize(("workers", "how"), [
    pytest.param("2", "sigterm-to-audit", id="sigterm-xdist"),
    pytest.param("1", "ctrl-c-to-group", id="ctrl-c-one-process"),
    pytest.param(None, "sigterm-to-pytest", id="sigterm-plain-pytest"),
])
def test_a_stopped_audit_keeps_what_it_finished(tmp_path, workers, how):
    root, name = tmp_path / "reports", f"stopped-{workers}-{os.getpid()}"
    run_options = ["--rows", "4", "--precision", "fp32", "--report-dir", str(root), "--run-name", name]
    argv = ([str(Path(sys.executable).with_name("replaytests")), "audit", "--workers", workers, *run_options]
            if workers else [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:xdist",
                             "-p", "no:cacheprovider", *run_options])
    def send(audit: subprocess.Popen) -> None:
        if how.startswith("sigterm"):
            audit.send_signal(signal.SIGTERM)
        else:
            os.killpg(audit.pid, signal.SIGINT)  # the terminal's Ctrl-C: the audit's whole process group

    code, text = _stopped(argv, root / name / RECORDS, 1, send, env=os.environ | {"CI": "1"})
    assert code == INTERRUPTED, f"exit {code}, expected {INTERRUPTED}:\n{text[-3000:]}"
    assert "Traceback" not in text, f"a traceback reached the user:\n{text[-3000:]}"
    run = json.loads((root / name / "run.json").read_text())
    assert run["run"]["interrupted"] is True, f"run.json does not say interrupted: {run['run']}"
    kept = (root / name / "ledger.jsonl").read_text().splitlines()
    assert kept, "the interrupted run's ledger holds no record: the finished records were lost"
    assert not (root / LATEST).exists(), "latest was moved to an interrupted run"
    assert "verdict: INTERRUPTED" in text, f"the audit's closing verdict is missing:\n{text[-2000:]}"
    if how == "sigterm-to-pytest":
        assert "interrupted (SIGTERM)" in text, f"the stop does not name SIGTERM:\n{text[-2000:]}"
    _wait_for(lambda: not _processes_naming(name), 30, f"the processes of run {name} to end")


def test_a_stop_in_the_middle_of_a_long_test_ends_at_the_next_forward_call(tmp_path):
    """One process, the transplant first: its first test computes the whole BF16 crossing of the panel (the
    longest single test of a run). SIGTERM once two crossing records are appended: the run ends at the next
    forward call (engine.stop), not after that test (which took 58 s to end on a loaded 2-core machine before,
    5 s after; benchmarks/stop_time.py --workers 1 measures it), keeping the records it finished."""
    root, name = tmp_path / "reports", "long-test"
    argv = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:xdist", "-p",
            "no:cacheprovider", "--rows", "0:16", "--precision", "bf16", "-k", "transplant", "--report-dir", str(root),
            "--run-name", name]
    code, text = _stopped(argv, root / name / RECORDS, 2, lambda run: run.send_signal(signal.SIGTERM))
    assert code == INTERRUPTED, f"exit {code}, expected {INTERRUPTED}:\n{text[-3000:]}"
    assert "stopped between two forward calls" in text, f"the stop does not say where it stopped:\n{text[-2000:]}"
    kept = [json.loads(line) for line in (root / name / "ledger.jsonl").read_text().splitlines()]
    crossing = [r for r in kept if r["family"] == "crossing"]
    assert 2 <= len(crossing) < 16, (f"{len(crossing)} crossing records kept of the panel's 16: the test in progress "
                                     "ran on after the signal" if len(crossing) >= 16 else "finished records lost")
    assert not [r for r in kept if r["family"] == "transplant"], "a transplant record after the stop"
