"""The collector: gathers the records' key facts and the test outcomes from the test reports (this
process's or the xdist workers'), shows the run's progress, and at the end judges the run (its verdict,
from the tests' outcomes and the check of the whole run, which the exit status follows), writes the run's
directory from the records appended to it (suite.artifacts) and the summary on the terminal. suite.plugin
registers one per pytest process; only the controller (or the one process) gathers and writes.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from replaytests.errors import Exit, ReplaytestsError
from replaytests.families.registry import FAMILIES
from replaytests.outputs import ledger, rundir, verdict
from replaytests.outputs.verdict import Failure, Verdict
from replaytests.suite.command_line import selects_conformance
from replaytests.suite.fixtures import AUDIT_PROPERTY, RECORD_PROPERTY
from replaytests.suite.gathered import Gathered
from replaytests.suite.properties import properties
from replaytests.suite.state import replay_session, run_state

if TYPE_CHECKING:
    from replaytests.suite.session import ReplaySession

RECORDS = rundir.RECORDS
WRITE_FAILED = Exit.WRITE_FAILED


def _outcome(report: pytest.TestReport) -> str | None:
    """The test outcome a report settles (as pytest counts them), or None for a phase that settles none."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed" if report.when == "call" else None


# The line xdist puts first in the text of a report a worker sent ("[gw0] linux -- Python 3.11.7 /path/python"):
# it says which worker, not what failed.
_WORKER_LINE = re.compile(r"\[[^\]\s]+\] \S+ -- Python \d+\.\d+\.\d+ ")


def _message(report: pytest.TestReport) -> str:
    """Why a test failed: its exception's message, else its report's text without xdist's worker line (a worker
    that died has only "worker 'gw0' crashed while running '...'", which the verdict must say)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    lines = report.longreprtext.splitlines()
    return "\n".join(lines[1:] if lines and _WORKER_LINE.match(lines[0]) else lines)


class LedgerCollector:
    """Gathers the test outcomes and the key facts of the records the tests read from the test reports
    (local or from xdist workers); the controller writes the run's directory from the records appended
    to it (suite.artifacts) and its summary on the terminal."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.gathered = None
        self.verdict: Verdict | None = None
        self.built: dict = {}  # the run's statistics, computed once when its files are written (report.build_report)
        self.run: Path | None = None
        self.progress = None  # suite.progress.Progress, in the controller of a conformance run
        self.started = datetime.now(UTC)

    @pytest.hookimpl(trylast=True)  # after the plugin's sessionstart opened the session and the report root
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        mode = self.config.getoption("replay_progress", "off")
        if mode != "off" and run_state(self.config).root is not None and selects_conformance(self.config):
            from replaytests.suite.progress import Progress

            self.progress = Progress(planned_rows(replay_session(self.config)))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.progress is not None:
            self.progress.tests = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if self.progress is not None:
            self.progress.tests = len(ids)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        """Under a progress bar, tests print no letters (the bar counts them; failures are listed after)."""
        result = yield
        if self.progress is not None and config.getoption("replay_progress") == "bar" and result[0]:
            return result[0], "", ""
        return result

    @pytest.hookimpl(tryfirst=True)  # before junitxml reads the report's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if run_state(self.config).session is None or hasattr(self.config, "workerinput"):
            return  # not a replay run, or a worker (its controller gathers)
        self.gathered = self.gathered or Gathered()
        if report.when == "call":
            before = len(self.gathered.facts)
            self.gathered.add(report.user_properties, RECORD_PROPERTY, AUDIT_PROPERTY)
            self._show_progress(self.gathered.facts[before:], finished=False)
        elif report.when == "teardown":
            self._show_progress([], finished=True)
        # The key facts rode here as JSON (fixtures.record); a JUnit XML or JSON report gets them as properties.
        report.user_properties = properties(report.user_properties, RECORD_PROPERTY, AUDIT_PROPERTY)
        outcome = _outcome(report)
        if outcome:
            self.gathered.count(outcome)
        if outcome in ("failed", "error"):
            self.gathered.failures.append(verdict.failure(report.nodeid, _message(report)))
        if outcome == "skipped" and isinstance(report.longrepr, tuple):
            self.gathered.skips.add(str(report.longrepr[2]).removeprefix("Skipped: "))

    def _show_progress(self, records: list[dict], finished: bool) -> None:
        progress = self.progress
        if progress is None:
            return
        completed = [r for r in records if progress.record(*r["key"])]
        if finished:
            progress.finish()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if self.config.getoption("replay_progress") == "bar":
            reporter.rewrite(progress.bar(), erase=True)
            if progress.finished == progress.tests:
                reporter.ensure_newline()
        elif progress.due() or completed:
            if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):  # after test letters (xdist
                reporter.write("\n")  # leaves ensure_newline nothing to go by)
            reporter.write_line(progress.line())

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Write the run's directory from the records appended to it; move `latest` to it only if the run
        completed. A run that computed no record leaves no directory."""
        state = run_state(self.config)
        root, run = state.root, state.run_dir
        try:
            appended, torn = ledger.read_appended(run / RECORDS) if run is not None else ([], [])
            if torn:  # a worker died, or the disk filled, while writing those: the rest of the run is kept
                sys.stderr.write(f"WARNING: {run / RECORDS}: line(s) {', '.join(map(str, torn))} torn (a worker "
                                 "died or the disk filled while writing them): left out, so the run is written "
                                 "as interrupted (latest not moved)\n")
            records = ledger.merge(appended)
            if records and self.gathered:
                from replaytests.suite.artifacts import write_run

                replay = replay_session(self.config)
                self.gathered.records, self.gathered.computed = records, len(appended)
                stopped = bool(session.shouldstop or session.shouldfail)  # -x, --maxfail: it did not finish either
                interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or stopped or bool(torn)
                self.run = run
                try:
                    outcome = run_verdict(replay, self.gathered, interrupted)
                    self.built = write_run(replay, self.gathered, outcome, run, interrupted, self.started)
                except (OSError, ReplaytestsError) as exc:  # a full disk, a quota: the records stay appended
                    self.write_failed(session, run, exc)
                    return
                self.verdict = outcome
                (run / RECORDS).unlink()  # every one of them is in the ledger now
                if not interrupted:
                    root.publish(run)
                session.exitstatus = exit_status(self.verdict, session.exitstatus)
            elif run is not None and not records:
                (run / RECORDS).unlink(missing_ok=True)
                run.rmdir()
        finally:
            if root is not None:
                root.release()

    def write_failed(self, session: pytest.Session, run: Path, exc: OSError | ReplaytestsError) -> None:
        """One line, exit WRITE_FAILED (not "a check failed"); `latest` not moved; the records finished
        are in RUN/records.jsonl (one JSON record per line)."""
        kept = len(ledger.read_appended(run / RECORDS)[0])
        why = exc.strerror or exc if isinstance(exc, OSError) else str(exc).rpartition(": ")[2]
        sys.stderr.write(f"ERROR: cannot write the run's files in {run}: {why}; its {kept} "
                         f"records are kept in {run / RECORDS} (latest not moved)\n")
        session.exitstatus = WRITE_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.gathered and set(self.gathered.outcomes) == {"skipped"}:  # say why nothing ran
            terminalreporter.write_sep("=", "replaytests: every selected test was skipped")
            for reason in sorted(self.gathered.skips):
                terminalreporter.write_line(f"skipped: {reason}")
        if self.verdict is None:
            return
        from replaytests.suite.artifacts import terminal_lines

        terminalreporter.write_sep("=", "replaytests summary")
        for line in terminal_lines(replay_session(self.config), self.gathered, self.built, self.verdict, self.run):
            terminalreporter.write_line(line)
        outcomes = self.gathered.outcomes
        if self.verdict.failed and not outcomes.get("failed") and not outcomes.get("error"):
            terminalreporter.write_line("exit status 1: the verdict is FAIL although no test failed (a check of the "
                                        "whole run, listed above)", red=True)


RECORDS_CHECK = "the run's records"  # the check of what no selected test checked, by its name in the verdict


def run_verdict(replay: ReplaySession, gathered: Gathered, interrupted: bool) -> Verdict:
    """The run's verdict, which the exit status follows: the tests' outcomes and failures, and the failures of
    the checks of the whole run, made here once every test has reported, on the run's records: the baseline's
    rates (suite.baseline.baseline_rates), which need every row of a family at once, so no one test (on one
    xdist worker, under a -k that selects part of the run) can make them; and, where the rest passes, the checks
    its report makes of the records (outputs.report.failing_checks: replicas, a family's control, exact-cell
    suffixes), which a -k or -m can leave to no selected test while the records were computed: a report that
    says FAIL of a run that exited 0 would let a CI gate pass."""
    from replaytests.outputs.report import failing_checks
    from replaytests.suite.artifacts import verdict_context
    from replaytests.suite.baseline import baseline_rates

    rates = baseline_rates(replay, gathered.records)
    context = verdict_context(replay, gathered)
    context["platform_drift"] += rates.drift
    outcome = verdict.build(gathered.outcomes, gathered.failures + rates.failures, context, interrupted)
    if outcome.result != "pass" or (shown := failing_checks(gathered.records, replay.contract.gates)) is None:
        return outcome
    unchecked = Failure(RECORDS_CHECK, f"{shown}, which no selected test checked")
    return verdict.build(gathered.outcomes, [*outcome.failures, unchecked], context, interrupted)


def exit_status(outcome: Verdict, status: int) -> int:
    """The exit status follows the verdict (docs/ci.md): a FAIL is never 0, whatever produced it (a test, or
    a run-level check the controller makes after the tests, such as the baseline's rates); a run the verdict
    calls interrupted (a torn records file) exits 2 where pytest saw nothing wrong. A status pytest already
    set for a reason of its own (an error, -x, Ctrl-C) is kept."""
    return status if status != Exit.PASS else verdict.exit_status(outcome)


def planned_rows(replay: ReplaySession) -> dict[tuple[str, str], int | None]:
    """(family, cell) -> the rows the plan gives it (None: a panel read from another family's outcomes)."""
    planned = {}
    for name, family in FAMILIES.items():
        if name in replay.plan.unsupported:
            continue
        rows = None if family.reads else len(replay.plan.family_rows(name))
        for cell in replay.family_cells(name):
            if rows != 0:
                planned[(name, cell)] = rows
    return planned
