"""The verdict of a run, first in every output (terminal, run.json, report.json, .md, .html).

It says whether the run passed, names each failing check with its row, cell and reason, the
platform the numbers were made on and what they were checked against (the bank, the baseline), and
the drift from the contract. Findings recorded as data (allowed divergences, platform drift against
an artifact made elsewhere) are counted apart from failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from replaytests.errors import Exit, got, short
from replaytests.outputs.tables import first

OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")
# The order a verdict's counts are said in: pytest's own (its last line), whatever order the counts were stored in (a
# run's in OUTCOMES order, its run.json's sorted), so that a run's terminal, summary.md and report agree with a later
# `replaytests report` of its directory.
SAID = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")
LINES = ("platform", "cpu_isa", "bank", "baseline")  # a line each: where the numbers were made, what they were checked
LISTS = ("platform_drift", "drift", "skipped_cells")  # against; then lines each: the findings recorded as data


class VerdictError(ValueError):
    """A recorded verdict (run.json's) that cannot be read: the message names the field and what was expected."""


@dataclass(frozen=True)
class Failure:
    """A failing check as the verdict lists it: its name and parameters, and the first line of its message."""

    check: str
    message: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """A run's verdict, built once (`build`, or `from_json` of a run.json's) and read by every output: the
    terminal, summary.md, report.json, .md and .html, and the exit status.

    `context` holds what the run was checked against, as written: LINES' strings and LISTS' lists of lines
    (a verdict written by another version may lack some, or hold keys this one does not know: kept as read,
    written back as read). `contradicted` is the report's: what the records show against a recorded pass
    (report.checked_verdict); run.json never holds it."""

    result: str
    tests: Mapping[str, int]
    failures: tuple[Failure, ...] = ()
    context: Mapping[str, object] = field(default_factory=dict)
    contradicted: str | None = None

    @property
    def failed(self) -> bool:
        return self.result == "fail"

    def line(self, name: str) -> str | None:
        """One of LINES, where the verdict holds it."""
        return self.context.get(name) or None

    def lines_of(self, name: str) -> list[str]:
        """One of LISTS (none where the verdict lacks it)."""
        return list(self.context.get(name) or [])

    def to_json(self) -> dict:
        """As run.json holds it (keys sorted, as it writes them), and report.json: a contradiction last."""
        fields = {"result": self.result, "tests": dict(self.tests),
                  "failures": [failure.to_json() for failure in self.failures], **self.context}
        return dict(sorted(fields.items())) | ({"contradicted": self.contradicted} if self.contradicted else {})

    @classmethod
    def from_json(cls, value: dict) -> Verdict:
        """A recorded verdict; a VerdictError names the field that every output would fail to read."""
        if not isinstance(value.get("result"), str):
            raise VerdictError(f"field 'verdict.result' must be a string, {got(value, 'result')}")
        tests = value.get("tests")
        if not isinstance(tests, dict) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                  for n in tests.values()):
            raise VerdictError(f"field 'verdict.tests' must be an object of test counts per outcome, "
                               f"{got(value, 'tests')}")
        failures = value.get("failures")
        if not isinstance(failures, list):
            raise VerdictError(f"field 'verdict.failures' must be a list, {got(value, 'failures')}")
        for index, item in enumerate(failures):
            if not (isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("check", "message"))):
                raise VerdictError(f"field 'verdict.failures[{index}]' must be an object with the strings check and "
                                   f"message, got {short(item)}")
        for name in LISTS:
            lines = value.get(name, [])
            if not (isinstance(lines, list) and all(isinstance(line, str) for line in lines)):
                raise VerdictError(f"field 'verdict.{name}' must be a list of strings, got {short(lines)}")
        for name in LINES:
            if not isinstance(value.get(name, ""), str | None):
                raise VerdictError(f"field 'verdict.{name}' must be a string, got {short(value[name])}")
        contradicted = value.get("contradicted")
        if not isinstance(contradicted, str | None):
            raise VerdictError(f"field 'verdict.contradicted' must be a string, got {short(contradicted)}")
        return cls(value["result"], dict(tests), tuple(Failure(f["check"], f["message"]) for f in failures),
                   {k: v for k, v in value.items() if k not in ("result", "tests", "failures", "contradicted")},
                   contradicted)


def build(tests: dict[str, int], failures: list[Failure], context: dict, interrupted: bool = False) -> Verdict:
    """`tests`: outcome counts; `failures`: each failing test's and run-level check's; `context`: the
    platform, cpu_isa, bank, baseline, drift and platform_drift lines of the run. An interrupted run
    (Ctrl-C, -x) is neither a pass nor a fail: its records are what it finished."""
    failed = bool(failures) or tests.get("failed", 0) > 0 or tests.get("error", 0) > 0
    result = "interrupted" if interrupted else "fail" if failed else "pass"
    return Verdict(result, {k: tests.get(k, 0) for k in OUTCOMES}, tuple(failures), dict(context))


def exit_status(verdict: Verdict | None) -> Exit:
    """The exit status a verdict gives (docs/ci.md); records collated from ledgers carry none: 0."""
    result = verdict.result if verdict is not None else None
    return {"fail": Exit.FAIL, "interrupted": Exit.INTERRUPTED}.get(result, Exit.PASS)


def headline(verdict: Verdict) -> str:
    """`PASS (48 passed)`; a pass the records contradict (report.checked_verdict) says both."""
    tests = verdict.tests
    said = [name for name in SAID if name in tests] + sorted(set(tests) - set(SAID))
    counts = ", ".join(f"{tests[name]} {name}" for name in said if tests[name]) or "no tests ran"
    if verdict.contradicted:
        return f"{verdict.result.upper()} (run.json said PASS: {counts}; {verdict.contradicted})"
    return f"{verdict.result.upper()} ({counts})"


def lines(verdict: Verdict | None) -> list[str]:
    """The verdict as plain lines: the result, each failure, then the platform, inputs and drift."""
    if verdict is None:
        return ["verdict: not recorded (these records were collated from ledgers: no test outcomes)"]
    out = [f"verdict: {headline(verdict)}"]
    if verdict.result == "interrupted":
        out.append("  the run stopped before it finished: these are the records it completed (latest not moved)")
    out += [f"  FAILED {f.check}: {f.message}" for f in verdict.failures]
    out += [f"{name}: {line}" for name in LINES if (line := verdict.line(name))]
    out += [f"platform drift: {line}" for line in verdict.lines_of("platform_drift")]
    out += [f"skipped cell, not checked: {cell}" for cell in verdict.lines_of("skipped_cells")]
    drift = verdict.lines_of("drift")
    out.append(f"drift from the contract: {'; '.join(drift)}" if drift else "drift from the contract: none")
    return out


def failure(nodeid: str, message: str) -> Failure:
    """A failing test as the verdict lists it: its name and parameters (not its file) and the first
    line of its message."""
    first_line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return Failure(nodeid.rpartition("::")[2] or nodeid, first_line.removeprefix("Failed: "))


def artifact(name: str, platform_differences: list[str], finding: str, drift: str,
             rows: list[str]) -> tuple[str, str | None]:
    """An artifact's verdict line (where it was made, what the run found against it) and, when it was
    made on another platform and the run's numbers differ from it, the platform-drift line."""
    made = ("made on this platform" if not platform_differences
            else f"made on another platform ({'; '.join(platform_differences)})")
    shown = first(rows)
    return f"{name}, {made}: {finding}", (f"{drift} ({shown})" if platform_differences and rows else None)
