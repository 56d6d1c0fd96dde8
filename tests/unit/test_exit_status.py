"""The exit status follows the verdict (docs/ci.md): a FAIL is never exit 0, whatever produced it.

The rates check against a baseline is a check of the whole run, made by the controller once every test has
reported (suite.collector.run_verdict; every changed BF16 record is "recorded", an xfail, so no test fails):
its failures are the verdict's, and the verdict is the exit status. The end-to-end runs here make their
baseline from the run's own data (no platform's numbers are written into the test): a first run's crossing,
with every BF16 headline pair marked divergent; the quick test drives the controller's end of the run on
hand-built records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import forkserver
import pytest
from test_compare import diverging, make
from test_report import typed

from replaytests.inputs.contract import default_gates
from replaytests.outputs import ledger
from replaytests.outputs.verdict import Failure, Verdict
from replaytests.suite import artifacts
from replaytests.suite.baseline import RATES_CHECK
from replaytests.suite.collector import RECORDS, RECORDS_CHECK, LedgerCollector, exit_status
from replaytests.suite.gathered import Gathered
from replaytests.suite.state import run_state

ROWS = ("--rows", "0:8", "--precision", "bf16", "-p", "no:cacheprovider")
PAIR = "incremental~prefill"
RATES = "FAILED baseline rates: divergence rate changed beyond chance: crossing/bf16"


def conformance(root: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    proc = forkserver.run([sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", *ROWS,
                           "-p", "no:xdist", "-k", "crossing", "--report-dir", str(root), "--run-name", name, *args],
                          cwd=root.parent)
    return proc, root / name


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Path:
    """A run of the BF16 crossing on 8 rows: the baseline's source and its own PASS baseline."""
    proc, run = conformance(tmp_path_factory.mktemp("first") / "r", "first")
    assert proc.returncode == 0, f"the first run failed:\n{proc.stdout[-3000:]}"
    return run


def all_divergent(run: Path, out: Path) -> Path:
    """A copy of `run` whose BF16 crossing diverges on every row; fails unless the run's own crossing
    held on at least 6 of its 8 rows (else no McNemar test on 8 pairs can find the change)."""
    lines = (run / "ledger.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    crossing = [r for r in records if (r["family"], r["precision"]) == ("crossing", "bf16") and r["status"] == "ok"]
    held = sum(r["comparisons"][PAIR]["suffix_equal"] for r in crossing)
    assert held >= 6, f"premise: the run's BF16 crossing held on {held}/{len(crossing)} rows; 6 are needed"
    for record in crossing:
        record["comparisons"][PAIR]["suffix_equal"] = False
    out.mkdir()
    (out / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "run.json").write_text((run / "run.json").read_text())
    return out


@pytest.mark.e2e
def test_a_rates_fail_found_after_the_tests_exits_1_from_pytest(first, tmp_path):
    baseline = all_divergent(first, tmp_path / "baseline")
    proc, _ = conformance(tmp_path / "r", "rates", "--baseline", str(baseline), "--gate", "rates")
    out = proc.stdout
    assert RATES in out, f"the rates check did not fail:\n{out[-3000:]}"
    assert " failed" not in out.splitlines()[-1], f"premise: a test failed, not only the run-level check: {out[-600:]}"
    assert proc.returncode == 1, f"verdict FAIL but exit {proc.returncode}:\n{out[-3000:]}"


@pytest.mark.e2e
def test_the_same_run_against_its_own_baseline_passes_with_exit_0(first, tmp_path):
    proc, run = conformance(tmp_path / "r", "own", "--baseline", str(first), "--gate", "rates")
    verdict = json.loads((run / "run.json").read_text())["verdict"]
    assert (verdict["result"], proc.returncode) == ("pass", 0), f"{verdict['failures']}\n{proc.stdout[-2000:]}"


@pytest.mark.e2e
def test_a_rates_fail_exits_1_from_replaytests_audit(first, tmp_path):
    baseline = all_divergent(first, tmp_path / "baseline")
    proc = forkserver.run([sys.executable, "-m", "replaytests.cli", "audit", "--rows", "0:8", "--precision", "bf16",
                           "--workers", "1", "--baseline", str(baseline), "--gate", "rates",
                           "--report-dir", str(tmp_path / "r"), "--", "-k", "crossing"], cwd=tmp_path)
    assert RATES in proc.stdout, proc.stdout[-3000:]
    assert proc.returncode == 1, f"verdict FAIL but exit {proc.returncode}:\n{proc.stdout[-3000:]}"


TORN = '''
import pytest
from replaytests.suite.state import run_state

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    """A worker that died while writing: half a record at the end of the records file."""
    with open(run_state(session.config).run_dir / "records.jsonl", "a") as f:
        f.write('{"family": "crossing", "row": ')
'''


@pytest.mark.e2e
def test_a_torn_records_file_is_interrupted_and_exits_2(tmp_path):
    (tmp_path / "tear.py").write_text(TORN)
    proc = forkserver.run([sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "tear",
                           "-p", "no:cacheprovider", "-p", "no:xdist", "--rows", "1", "--precision", "fp32",
                           "-k", "replica and crossing", "--report-dir", str(tmp_path / "r")],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert "verdict: INTERRUPTED" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 2, f"verdict INTERRUPTED but exit {proc.returncode}:\n{proc.stdout[-2000:]}"
    runs = [p for p in (tmp_path / "r").iterdir() if p.is_dir()]
    assert len(runs) == 1 and not (tmp_path / "r" / "latest").exists(), "an interrupted run moved latest"
    assert ledger.read_ledger(runs[0] / "ledger.jsonl"), "the whole records around the torn line were lost"


@pytest.mark.parametrize(("result", "status", "expected"), [
    pytest.param("pass", 0, 0, id="pass-0"),
    pytest.param("fail", 0, 1, id="fail-found-after-the-tests-1"),
    pytest.param("fail", 1, 1, id="fail-of-a-test-1"),
    pytest.param("interrupted", 0, 2, id="torn-records-2"),
    pytest.param("interrupted", 2, 2, id="ctrl-c-2"),
    pytest.param("interrupted", 1, 1, id="stopped-by-x-after-a-failure-1"),
    pytest.param("fail", 6, 6, id="write-failed-keeps-6"),
])
def test_exit_status_follows_the_verdict(result, status, expected):
    assert exit_status(Verdict(result, {}), status) == expected


def end_of_run(tmp_path, monkeypatch, records: list[dict], gate: str | None, failures: list[Failure] = ()):
    """The controller's end of a run (suite.collector) whose every test passed, besides `failures`, on `records`,
    against a baseline whose BF16 crossing diverges on none of 20 rows: its collector and the session whose exit
    status it leaves. The files are not written here (artifacts.write_run; the end-to-end tests above write
    them)."""
    replay = SimpleNamespace(options=SimpleNamespace(gate=gate), baseline=typed(diverging("crossing", 20, 0)),
                             contract=SimpleNamespace(gates=default_gates()),
                             plan=SimpleNamespace(audited=lambda records: records), baseline_platform=[])
    config = SimpleNamespace(stash=pytest.Stash())
    state = run_state(config)
    state.session, state.run_dir = replay, tmp_path
    state.root = SimpleNamespace(publish=lambda run: None, release=lambda: None)
    for record in typed(records):
        ledger.append_record(tmp_path / RECORDS, record)
    monkeypatch.setattr(artifacts, "verdict_context", lambda replay, gathered: {"platform_drift": []})
    monkeypatch.setattr(artifacts, "write_run", lambda *args: {})
    collector = LedgerCollector(config)
    collector.gathered = Gathered(outcomes={"passed": len(records)} | ({"failed": 1} if failures else {}),
                                  failures=list(failures))
    session = SimpleNamespace(shouldstop=False, shouldfail=False, exitstatus=pytest.ExitCode.OK)
    collector.pytest_sessionfinish(session, pytest.ExitCode.OK)
    return collector, session


@pytest.mark.parametrize(("divergent", "status", "failures"), [
    pytest.param(10, pytest.ExitCode.TESTS_FAILED, [RATES_CHECK], id="rates-changed-exits-1"),
    pytest.param(0, pytest.ExitCode.OK, [], id="rates-held-exits-0"),
])
def test_the_rates_check_of_the_whole_run_decides_the_exit_status(tmp_path, monkeypatch, divergent, status, failures):
    """A run at --gate rates whose every test passed: its BF16 crossing diverges on `divergent` of 20 rows, the
    baseline's on none. Only the check of the whole run can fail it, and the status pytest exits with is the one
    the collector leaves on the session."""
    collector, session = end_of_run(tmp_path, monkeypatch, diverging("crossing", 20, divergent), "rates")
    assert [f.check for f in collector.verdict.failures] == failures, collector.verdict.failures
    assert session.exitstatus == status, f"verdict {collector.verdict.result}, exit {session.exitstatus}"


@pytest.mark.parametrize(("replica", "failed", "status", "failures"), [
    pytest.param({"cache_exact": False}, False, pytest.ExitCode.TESTS_FAILED, [RECORDS_CHECK],
                 id="unchecked-replica-fails-exits-1"),
    pytest.param({}, False, pytest.ExitCode.OK, [], id="replicas-exact-exits-0"),
    pytest.param({"cache_exact": False}, True, pytest.ExitCode.TESTS_FAILED, ["test_replica_exact[...]"],
                 id="a-test-that-failed-says-it-alone"),
])
def test_what_the_records_show_failing_and_no_selected_test_checked_fails_the_run(tmp_path, monkeypatch, replica,
                                                                                    failed, status, failures):
    """A run whose selected tests passed (a -k or -m that left out the replica tests) while the records it computed
    show a replica inexact: its report would say FAIL (report.checked_verdict), so its verdict does, and it exits 1
    (it exited 0 with PASS on the terminal while its report.md said FAIL); the control: exact replicas, exit 0; where
    the replica test ran and failed, its failure is the verdict's alone."""
    records = [make("crossing", "r00", replica=replica), *diverging("crossing", 3, 0)[1:]]
    tested = [Failure("test_replica_exact[...]", "replicas differ")] if failed else []
    collector, session = end_of_run(tmp_path, monkeypatch, records, None, tested)
    assert [f.check for f in collector.verdict.failures] == failures, collector.verdict.failures
    assert session.exitstatus == status, f"verdict {collector.verdict.result}, exit {session.exitstatus}"
    if failures == [RECORDS_CHECK]:
        (found,) = collector.verdict.failures
        assert found.message == ("the records show replicas failing in 1 row (crossing/r00/bf16), which no selected "
                                 "test checked"), found.message


def test_a_worker_that_died_is_named_in_the_verdict_not_xdists_header(tmp_path):
    """A worker killed mid-test (the OOM killer) leaves xdist's report of the crash, whose text starts with the
    worker's header line ("[gw0] linux -- Python ..."); the verdict says the crash (a committed vLLM baseline's
    verdict said only the header)."""
    config = SimpleNamespace(stash=pytest.Stash())
    run_state(config).session = SimpleNamespace()
    nodeid = "test_sweep.py::test_sweep_reference_vs_edge[fp32-smollm2-000]"
    report = pytest.TestReport(nodeid, ("test_sweep.py", None, "test_sweep.py"), {}, "failed",
                               f"worker 'gw0' crashed while running {nodeid!r}", "???")  # as xdist.dsession builds it
    report.node = SimpleNamespace(workerinfo={"id": "gw0", "sysplatform": "linux", "version_info": (3, 11, 7),
                                              "executable": "/venv/bin/python3"})
    assert report.longreprtext.startswith("[gw0] linux -- Python 3.11.7 /venv/bin/python3\n"), \
        f"premise: pytest writes xdist's worker line first: {report.longreprtext!r}"
    collector = LedgerCollector(config)
    collector.pytest_runtest_logreport(report)
    assert collector.gathered.outcomes == {"error": 1}, collector.gathered.outcomes
    assert collector.gathered.failures == [Failure("test_sweep_reference_vs_edge[fp32-smollm2-000]",
                                                   f"worker 'gw0' crashed while running {nodeid!r}")]
