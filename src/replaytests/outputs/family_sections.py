"""The report sections of the families that have one of their own instead of a headline table (the rollout
families, the conversation family, the edge sweep): each family's registry record names its module
(`Family.report_section`), and every renderer reads a built report through those modules, in the registry's order,
so that none names those families.

A report section module holds, each reading a built report (report.json's content, its statistics as result
objects: report.py):
- `build(records, runtime, cells, pairs)`: its report.json keys (each only where the run holds something for it),
  from the run's records, its runtime, the cells in their order and the contract's pairs of cells;
- `replica_rows(report)`: its rows of the replica layer's table (family, cell, pair, bit exact);
- `fidelity(report)`: its tables in the fidelity layer, those folded away, and its lines;
- `summary_table(report)`: its table in summary.md (None where it has nothing), printed after a run too where
  `TERMINAL`;
- `headline_comparisons(record, pair)`: the comparisons of a headline pair the headline table counts in a record (a
  conversation's at every turn), `HEADLINE_SCOPE` what the table's note says of that (None: nothing) and
  `HEADLINE_DIVERGENCES` whether it counts their divergences (a rollout's replays cannot diverge: "-");
- `figures(report)`: its figures in report.html;
- `failing(record, gates)`: the names of the checks an ok record of its families fails under the gates (the
  report's check of its run's pass, report.checked_verdict);
- `compare(out, group, base, new, gates, alpha)`: its checks of one family and cell between a baseline run and a new
  one (outputs/compare.py): its gates on the new run and its measures at the rates level, into the Findings `out`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from replaytests.families.registry import FAMILIES
from replaytests.outputs.records import Record


def modules() -> list[ModuleType]:
    """Each report section module once, in the registry's order of the families that name it."""
    return [importlib.import_module(name)
            for name in dict.fromkeys(family.report_section for family in FAMILIES.values() if family.report_section)]


def of(family: str) -> ModuleType | None:
    """The report section module of a family, None for a family without one (or one the registry does not know)."""
    found = FAMILIES.get(family)
    return importlib.import_module(found.report_section) if found is not None and found.report_section else None


def build(records: list[Record], runtime: str, cells: tuple[str, ...], pairs: list[tuple[str, str]]) -> dict:
    """Every report section's report.json keys, in the registry's order."""
    return {key: value for module in modules() for key, value in module.build(records, runtime, cells, pairs).items()}
