"""A failing conformance test's command to rerun it alone: the run's own inputs, that test's row and cell.

Each failing conformance test carries it in its report (a section "rerun it alone", printed under the failure),
as array-api-tests attaches its reproducer: copy it, and the one row and cell run again with the same model, bank,
contract, backend and baseline, every option spelled `--replay-<name>` (always registered). The row is selected
by its place in the bank (`--replay-rows i:i+1`); a family whose panel is read from other rows' outcomes (the
transplants) recomputes it from that row alone.
"""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from replaytests.inputs.bank import BankRow
from replaytests.inputs.options import Options
from replaytests.suite.command_line import spelled

# Options the rerun sets itself (the row and cell) or leaves to their defaults (where its reports go)
OWN = ("rows", "precision", "report_dir", "run_name", "shard")


def command(options: Options, row: int | None, cell: str | None, test: str) -> str:
    """The shell command that runs the conformance test named `test` on the bank's row `row` (its index) and the
    cell `cell` alone, with every other option of `options` that is not its default."""
    parts = ["pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider"]
    for field in dataclasses.fields(Options):
        value = getattr(options, field.name)
        if field.name in OWN or value == field.default or value in ((), frozenset()):
            continue
        flag = spelled(field.name)
        if isinstance(value, bool):
            parts.append(flag)
        elif isinstance(value, (tuple, frozenset)):
            parts += [part for item in sorted(map(str, value)) for part in (flag, item)]
        else:
            parts += [flag, str(value)]
    if row is not None:
        parts += [spelled("rows"), f"{row}:{row + 1}"]
    if cell is not None:
        parts += [spelled("precision"), cell]
    return shlex.join([*parts, "-k", test])


def bank_index(options: Options, selected: list[BankRow], row: BankRow) -> int:
    """The row's place in the whole bank, from its place in the selection `--rows` made."""
    start = (options.rows or "").partition(":")[0].strip() if ":" in (options.rows or "") else ""
    return (int(start) if start else 0) + [r.id for r in selected].index(row.id)


def for_item(item: pytest.Item, options: Options, selected: list[BankRow]) -> str:
    """The rerun command of a conformance test item, from its parameters (its row fixture and its cell)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    row = next((value for value in params.values() if isinstance(value, BankRow)), None)
    cell = params.get("cell") or params.get("causal_cell")
    index = bank_index(options, selected, row) if row is not None and row.id in {r.id for r in selected} else None
    return command(options, index, cell if isinstance(cell, str) else None, item.name)
