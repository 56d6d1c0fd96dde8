"""Run directories: a run never writes over another run or an input; `latest` moves only when a run
completes; a second concurrent run into one root stops at once; an interrupted run keeps its records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import forkserver
import pytest

from replaytests.errors import ConfigError
from replaytests.outputs import rundir, verdict
from replaytests.outputs.report import REPORT_FILES


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.parametrize(("root", "message"), [
    pytest.param(lambda t: t, r"holds the run's bank \(.*bank\.jsonl\); a run never writes beside its inputs",
                 id="root-holds-the-bank"),
    pytest.param(lambda t: t / "model" / "reports", r"holds the run's model", id="root-inside-the-model"),
    pytest.param(lambda t: t / "model", r"holds the run's model", id="root-is-the-model"),
    pytest.param(lambda t: t / "file.txt", r"exists and is not a directory", id="root-is-a-file"),
    pytest.param(lambda t: t / "notes", r"a non-empty directory that is not a replaytests report root", id="foreign"),
    pytest.param(lambda t: t / "old-run", r"a run directory, not a report root: pass its parent", id="a-run-dir"),
    pytest.param(lambda t: t / "legacy", r"its latest/ is a directory an earlier replaytests wrote", id="legacy"),
])
def test_a_root_that_would_lose_or_mix_files_is_refused(tmp_path, model, root, message):
    (tmp_path / "bank.jsonl").write_text("{}\n")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    (tmp_path / "old-run").mkdir()
    (tmp_path / "old-run" / "ledger.jsonl").write_text("")
    (tmp_path / "legacy" / "latest").mkdir(parents=True)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=rf"^--report-dir {root(tmp_path)}: {message}"):
        rundir.check_root(root(tmp_path), {"bank": tmp_path / "bank.jsonl", "model": model})
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "a refused root changed the files"


@pytest.mark.parametrize("name", ["latest", ".hidden", "a/b", "-x", "x" * 101, "sp ace"])
def test_a_bad_run_name_is_refused(tmp_path, name):
    with pytest.raises(ConfigError, match=r"^--run-name .*: expected letters, digits"):
        rundir.check_name(tmp_path, name)


def test_a_run_never_reuses_a_directory(tmp_path):
    (tmp_path / "nightly").mkdir()
    with pytest.raises(ConfigError, match=r"^--run-name nightly: .* exists already; runs never write over each other$"):
        rundir.check_name(tmp_path, "nightly")


def test_a_second_lock_on_one_root_is_refused_naming_the_holder(tmp_path):
    first = rundir.Root(tmp_path / "reports")
    first.lock()
    try:
        with pytest.raises(ConfigError, match=rf"^--report-dir {tmp_path / 'reports'}: another replaytests run is "
                                              rf"writing here \(pid {os.getpid()}, since .*\); wait for it"):
            rundir.Root(tmp_path / "reports").lock()
    finally:
        first.release()
    again = rundir.Root(tmp_path / "reports")
    again.lock()  # free again once released
    again.release()


def test_a_run_of_other_tests_does_not_wait_for_the_root(pytester, tmp_path):
    """Only a run that selects conformance tests takes the lock: unit tests beside a running audit run."""
    root = rundir.Root(tmp_path / "reports")
    root.lock()
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")
    try:
        result = pytester.runpytest("test_plain.py", "--report-dir", str(tmp_path / "reports"))
    finally:
        root.release()
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


def test_latest_moves_to_each_published_run(tmp_path):
    root = rundir.Root(tmp_path / "reports")
    first, second = root.new_run("first"), root.new_run()
    root.publish(first)
    assert (tmp_path / "reports" / "latest").resolve() == first.resolve()
    root.publish(second)
    assert os.readlink(tmp_path / "reports" / "latest") == second.name, "latest is not a relative link to the run"
    root.release()


def test_ledger_of_a_file_a_run_and_a_root(tmp_path):
    run = tmp_path / "root" / "r1"
    run.mkdir(parents=True)
    (run / "ledger.jsonl").write_text("")
    (tmp_path / "root" / "latest").symlink_to("r1")
    found = [rundir.ledger_of(p) for p in (run / "ledger.jsonl", run, tmp_path / "root")]
    assert found == [run / "ledger.jsonl", run / "ledger.jsonl", tmp_path / "root" / "latest" / "ledger.jsonl"], found


# ---------------------------------------------------------------------------------------------
# Whole runs in child processes: an interrupted run, and two runs into one root at once.

QUICK = ("--precision", "fp32", "-p", "no:xdist", "-p", "no:cacheprovider", "-k", "replica_exact and crossing")


def run_args(root: Path, name: str, rows: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "--report-dir", str(root),
            "--run-name", name, "--rows", rows, *QUICK]


def started(root: Path, name: str, tmp_path: Path) -> subprocess.Popen:
    """A longer run, returned once its first test has passed (it holds the root's lock by then)."""
    proc = subprocess.Popen([*run_args(root, name, "24"), "-v"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if " PASSED" in line:
            return proc
    proc.wait()
    pytest.fail(f"the run ended before a test passed (exit {proc.returncode})")


@pytest.fixture(scope="module")
def completed(tmp_path_factory) -> Path:
    """A report root holding one completed run, `first` (the tests add runs of other names beside it)."""
    root = tmp_path_factory.mktemp("completed") / "reports"
    proc = forkserver.run(run_args(root, "first", "1"), cwd=root.parent)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert os.readlink(root / "latest") == "first"
    return root


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
            and p.name != rundir.LOCK}


class Busy(NamedTuple):
    before: dict[str, bytes]  # the completed run's files before the longer run started
    stopped: subprocess.Popen  # the longer run, `second`, after Ctrl-C
    output: str  # what it printed after its first test passed
    refused: subprocess.CompletedProcess  # another run into the root while `second` ran


@pytest.fixture(scope="module")
def busy(completed, tmp_path_factory) -> Busy:
    """A longer run, `second`, started in the completed root; while it runs, another run into that root (`other`);
    then `second` stopped by Ctrl-C. One longer run for both tests that need one (each a fresh interpreter)."""
    before = snapshot(completed / "first")
    cwd = tmp_path_factory.mktemp("busy")
    proc = started(completed, "second", cwd)
    try:
        refused = forkserver.run(run_args(completed, "other", "1"), cwd=cwd, timeout=120)
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[0]
    return Busy(before, proc, rest, refused)


@pytest.mark.e2e  # spawns a whole run
def test_an_interrupted_run_keeps_its_records_and_leaves_latest(completed, busy):
    assert busy.stopped.returncode == pytest.ExitCode.INTERRUPTED, busy.output[-3000:]
    assert os.readlink(completed / "latest") == "first", "an interrupted run moved latest"
    assert snapshot(completed / "first") == busy.before, "an interrupted run changed the previous run's files"
    run = json.loads((completed / "second" / "run.json").read_text())
    assert (run["run"]["name"], run["run"]["interrupted"], run["verdict"]["result"]) == ("second", True,
                                                                                          "interrupted"), run["run"]
    assert run["run"]["started"] <= run["run"]["finished"], f"start and finish out of order: {run['run']}"
    assert (completed / "second" / "ledger.jsonl").read_text().strip(), "the records it finished are not kept"
    first_lines = (completed / "second" / "report.md").read_text().splitlines()[:4]
    assert first_lines[2].startswith("## INTERRUPTED ("), first_lines


@pytest.mark.e2e  # spawns a whole run
def test_a_second_run_into_a_root_in_use_stops_at_once(completed, busy):
    second = busy.refused
    assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout[-2000:]
    errors = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: --report-dir {completed}: another replaytests run is "
                                                     f"writing here (pid {busy.stopped.pid}, since "), second.stderr
    assert not (completed / "other").exists(), "the refused run wrote a directory"
    assert snapshot(completed / "first") == busy.before, "the completed run's files changed"


@pytest.mark.e2e  # spawns a whole run (the module's)
def test_a_runs_report_is_the_report_replaytests_report_writes_of_its_directory(completed, tmp_path):
    """The report a run writes at its end is, byte for byte, the one `replaytests report RUN` writes later of the
    directory it names: both built from the run.json and ledger the run wrote (run.json's sorted keys, its JSON
    types), not one of them from the run's objects in memory. And summary.md says the report's verdict."""
    run = completed / "first"
    again = tmp_path / "again"
    proc = forkserver.run([sys.executable, "-m", "replaytests.cli", "report", str(run), "--out", str(again)],
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    differ = {name: next(n for n, (a, b) in enumerate(zip((run / name).read_text().splitlines(),
                                                         (again / name).read_text().splitlines(), strict=False))
                         if a != b) + 1
              for name in REPORT_FILES if (run / name).read_bytes() != (again / name).read_bytes()}
    assert not differ, f"the run's report and `replaytests report {run}` differ (file: first line): {differ}"
    said = (run / "report.md").read_text().splitlines()[2].removeprefix("## ")
    assert f"    verdict: {said}" in (run / "summary.md").read_text().splitlines(), "summary.md says another verdict"


def test_a_verdicts_counts_are_said_in_pytests_order_however_they_were_stored():
    """A run's verdict holds its counts in OUTCOMES order, its run.json sorted: both are said as pytest says them."""
    counts = {"passed": 3, "failed": 1, "error": 2, "xfailed": 4, "xpassed": 0, "skipped": 5}
    assert list(counts) == list(verdict.OUTCOMES), "premise: the counts in the order a run stores them"
    said = "FAIL (1 failed, 3 passed, 5 skipped, 4 xfailed, 2 error)"
    for tests in (counts, dict(sorted(counts.items()))):
        assert verdict.headline(verdict.Verdict("fail", tests)) == said, list(tests)
