"""The selftest's result: one cell per (fault, check), its table, its JSON and Markdown files, its exit code.

No torch here: the matrix is plain data once the trials have run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from replaytests.files import dumps, write_set
from replaytests.outputs.tables import md_cell

SCHEMA = "replaytests.selftest/1"
DETECTED, MISSED, CONTROL_FAILED, NOT_RUN = "detected", "missed", "control failed", "not run"
ERROR = "error"  # the trial itself raised: neither the fault nor its control was judged
FILES = ("selftest.json", "selftest.md")


@dataclass(frozen=True)
class Cell:
    """One fault against one check: whether the check found the fault (`outcome`, with what it said in
    `detail`) and whether it passed on the same rows without the fault (`control`)."""

    fault: str
    check: str
    outcome: str  # DETECTED, MISSED, CONTROL_FAILED, NOT_RUN or ERROR
    detail: str = ""  # the check's finding on the fault, or why the cell did not run
    control: str = ""  # "passed", or the check's finding without the fault

    @property
    def failed(self) -> bool:
        return self.outcome in (MISSED, CONTROL_FAILED, ERROR)


def judged(fault: str, check: str, control: str | None, finding: str | None) -> Cell:
    """A cell from the check's finding without the fault (`control`, None when it passed) and with it
    (`finding`, None when it passed): a check that fails without the fault proves nothing by failing with it."""
    if control is not None:
        return Cell(fault, check, CONTROL_FAILED, finding or "", control)
    if finding is None:
        return Cell(fault, check, MISSED, "the check passed with the fault in place", "passed")
    return Cell(fault, check, DETECTED, finding, "passed")


def failures(cells: list[Cell]) -> list[str]:
    """One line per cell that fails the selftest."""
    return [f"{c.outcome}: {c.fault} -> {c.check}: {c.control if c.outcome == CONTROL_FAILED else c.detail}"
            for c in cells if c.failed]


def exit_code(cells: list[Cell]) -> int:
    """0 only when every fault that ran was detected with its control passing."""
    return 1 if failures(cells) else 0


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def table(cells: list[Cell], width: int = 70) -> str:
    """The matrix as printed: fault, check, outcome, control, and the finding (shortened)."""
    rows = [("fault", "check", "outcome", "control", "finding")] + [
        (c.fault, c.check, c.outcome, _shorten(c.control, 14), _shorten(c.detail, width)) for c in cells]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(v.ljust(w) for v, w in zip(row[:4], widths, strict=True)), row[4]]).rstrip()
                     for row in rows)


def markdown(cells: list[Cell], meta: dict) -> str:
    lines = ["# replaytests selftest", "", f"verdict: {'PASS' if not exit_code(cells) else 'FAIL'}", ""]
    lines += [f"- {key}: {md_cell(str(value))}" for key, value in meta.items()]  # paths the user gave
    lines += ["", "| fault | check | outcome | control | finding |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(md_cell(part) for part in (c.fault, c.check, c.outcome, c.control, c.detail)) + " |"
              for c in cells]
    return "\n".join(lines) + "\n"


def write(out: Path, cells: list[Cell], meta: dict) -> list[Path]:
    """The matrix as JSON and Markdown in `out`, written as one set (files.write_set)."""
    document = {"schema": SCHEMA, "passed": not exit_code(cells), **meta, "cells": [asdict(c) for c in cells]}
    paths = [out / name for name in FILES]
    write_set({paths[0]: dumps(document, indent=2) + "\n", paths[1]: markdown(cells, meta)})
    return paths
