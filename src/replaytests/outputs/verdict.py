"""The verdict of a run, first in every output (terminal, run.json, report.json, .md, .html).

It says whether the run passed, names each failing check with its row, cell and reason, the
platform the numbers were made on and what they were checked against (the bank, the baseline), and
the drift from the contract. Findings recorded as data (allowed divergences, platform drift against
an artifact made elsewhere) are counted apart from failures.
"""

from __future__ import annotations

from replaytests.errors import Exit
from replaytests.outputs.tables import first

OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")
# The order a verdict's counts are said in: pytest's own (its last line), whatever order the counts were stored in (a
# run's in OUTCOMES order, its run.json's sorted), so that a run's terminal, summary.md and report agree with a later
# `replaytests report` of its directory.
SAID = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")


def build(tests: dict[str, int], failures: list[dict], context: dict, interrupted: bool = False) -> dict:
    """`tests`: outcome counts; `failures`: {check, message} per failing test; `context`: the
    platform, cpu_isa, bank, baseline, drift and platform_drift lines of the run. An interrupted run
    (Ctrl-C, -x) is neither a pass nor a fail: its records are what it finished."""
    failed = bool(failures) or tests.get("failed", 0) > 0 or tests.get("error", 0) > 0
    result = "interrupted" if interrupted else "fail" if failed else "pass"
    return {"result": result, "tests": {k: tests.get(k, 0) for k in OUTCOMES}, "failures": failures, **context}


def exit_status(verdict: dict | None) -> Exit:
    """The exit status a verdict gives (docs/ci.md); records collated from ledgers carry none: 0."""
    result = (verdict or {}).get("result")
    return {"fail": Exit.FAIL, "interrupted": Exit.INTERRUPTED}.get(result, Exit.PASS)


def headline(verdict: dict) -> str:
    """`PASS (48 passed)`; a pass the records contradict (report.checked_verdict) says both."""
    tests = verdict["tests"]
    said = [name for name in SAID if name in tests] + sorted(set(tests) - set(SAID))
    counts = ", ".join(f"{tests[name]} {name}" for name in said if tests[name]) or "no tests ran"
    if verdict.get("contradicted"):
        return f"{verdict['result'].upper()} (run.json said PASS: {counts}; {verdict['contradicted']})"
    return f"{verdict['result'].upper()} ({counts})"


def lines(verdict: dict | None) -> list[str]:
    """The verdict as plain lines: the result, each failure, then the platform, inputs and drift."""
    if not verdict:
        return ["verdict: not recorded (these records were collated from ledgers: no test outcomes)"]
    out = [f"verdict: {headline(verdict)}"]
    if verdict["result"] == "interrupted":
        out.append("  the run stopped before it finished: these are the records it completed (latest not moved)")
    out += [f"  FAILED {f['check']}: {f['message']}" for f in verdict["failures"]]
    out += [f"{name}: {verdict[name]}" for name in ("platform", "cpu_isa", "bank", "baseline") if verdict.get(name)]
    out += [f"platform drift: {line}" for line in verdict.get("platform_drift", [])]
    out += [f"skipped cell, not checked: {cell}" for cell in verdict.get("skipped_cells", [])]
    drift = verdict.get("drift") or []
    out.append(f"drift from the contract: {'; '.join(drift)}" if drift else "drift from the contract: none")
    return out


def failure(nodeid: str, message: str) -> dict:
    """A failing test as the verdict lists it: its name and parameters (not its file) and the first
    line of its message."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return {"check": nodeid.rpartition("::")[2] or nodeid, "message": first.removeprefix("Failed: ")}


def artifact(name: str, platform_differences: list[str], finding: str, drift: str,
             rows: list[str]) -> tuple[str, str | None]:
    """An artifact's verdict line (where it was made, what the run found against it) and, when it was
    made on another platform and the run's numbers differ from it, the platform-drift line."""
    made = ("made on this platform" if not platform_differences
            else f"made on another platform ({'; '.join(platform_differences)})")
    shown = first(rows)
    return f"{name}, {made}: {finding}", (f"{drift} ({shown})" if platform_differences and rows else None)
