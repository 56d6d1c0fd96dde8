"""The causal layer read from the ledger: the outcomes of the families whose registry record names an `outcome`
module (the transplant's, the paper's Table 5; the replication on a later checkpoint, Table 6), the validity control
they share, and which divergent rows no transplant can test. Reads records only (no engine), so reports, summaries
and gates share it.

An outcome module (its family's `outcome`) holds, for a family `family` and a cell:
- `summarize(records, family, meta)`: its outcomes from the cell's records (every family's: a transplant reads the
  crossing's), with Wilson intervals, as a frozen result object whose `to_json` report.json holds (stats.as_json);
  `meta` is the run's (run.json), for the settings it was run with;
- `terminal_lines(family, cell, summary, gates)`: the terminal's and summary.md's lines;
- `tables(family, cell, summary)`: report.md's tables in the causal layer;
- `replica_rows(family, cell, summary)`: its rows of the replica layer's table;
- `tracked(summary)`: what the history keeps of it; `TRACKED`: the fields besides the per-direction outcomes
  (`follows_donor`, `control_third`) that it keeps, in the history table's order around them;
- `REQUIRED`: the record fields an ok record of the family must hold for `summarize` (ledger.headline_problem refuses
  one without, in one line);
- `compare(out, group, base, new, gates, alpha)`: its checks of one family and cell between a baseline run and a new
  one (outputs/compare.py), into the Findings `out`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from replaytests.families.registry import CROSS, FAMILIES, VALIDITY_PAIRS
from replaytests.inputs.cells import PAPER
from replaytests.outputs.records import Comparison, Record
from replaytests.outputs.stats import Proportion, fields_of, proportion
from replaytests.outputs.tables import fmt_proportion

PARTIAL = ("k_only", "v_only")  # the partial transplants (K or V alone) a transplant record holds
INVALID = "TransplantInvalid"  # the reason an excluded record begins with when the validity control failed


def outcomes() -> dict[str, ModuleType]:
    """The families with causal outcomes, in the registry's order, each with its outcome module."""
    return {name: importlib.import_module(family.outcome) for name, family in FAMILIES.items() if family.outcome}


def of(family: str) -> ModuleType | None:
    """The outcome module of a family, None for a family without one (or one the registry does not know)."""
    found = FAMILIES.get(family)
    return importlib.import_module(found.outcome) if found is not None and found.outcome else None


def by_cell(records: list[Record], meta: dict) -> dict[str, dict]:
    """cell -> family -> its outcomes (`summarize`), for each family with outcomes whose records the run holds."""
    out: dict[str, dict] = {}
    for family, outcome in outcomes().items():
        for cell in cells(records, family):
            out.setdefault(cell, {})[family] = outcome.summarize(of_cell(records, cell), family, meta)
    return out


def not_testable_reason(cross: Comparison) -> str | None:
    """Why a divergent crossing pair cannot be tested by transplant, or None where it can: the
    recipient keeps its own boundary logits, so where the first suffix tokens (the masked greedy
    choice) differ no transplant can move that choice."""
    first_token_equal = cross.first_divergence != 0 if cross.first_token_equal is None else cross.first_token_equal
    if first_token_equal:  # ledger/1 records lack the field: the first divergence says it
        return None
    argmax = "equal" if cross.argmax_equal else "different too"
    return f"first suffix tokens differ (raw boundary argmax {argmax}): a transplant cannot move that choice"


@dataclass(frozen=True)
class Validity:
    """The validity control over a family's records: the rows whose self-transplants reproduced their own trajectories,
    and the rows it excluded (decoding not a function of the cache alone)."""

    reproduced: Proportion
    invalid: tuple[str, ...]

    def to_json(self) -> dict:
        return fields_of(self)


def validity(records: list[Record], pairs: tuple[tuple[str, str], ...] = VALIDITY_PAIRS) -> Validity:
    """The validity control over a family's records (`pairs`: (self-transplant, own), the transplant's by default)."""
    carrying = [r for r in records if r.ok and all(f"{name}~{own}" in r.comparisons for name, own in pairs)]
    return Validity(proportion(carrying, lambda r: all(r.comparisons[f"{name}~{own}"].suffix_equal
                                                       for name, own in pairs)),
                    tuple(sorted(r.row for r in records if not r.ok and r.reason.startswith(INVALID))))


def cells(records: list[Record], family: str) -> list[str]:
    """The cells a family's records hold, in the paper's order first."""
    held = {r.precision for r in records if r.family == family}
    return [c for c in PAPER if c in held] + sorted(held - set(PAPER))


def of_cell(records: list[Record], cell: str) -> list[Record]:
    return [r for r in records if r.precision == cell]


def not_testable(records: list[Record], family: str) -> list[list[str]]:
    """[row, reason] of each divergent row of the family a transplant family reads (its panel's source, the
    crossing) that no transplant can test (first suffix tokens differ), in the cells of the family's records."""
    held = {r.precision for r in records if r.family == family}
    source = FAMILIES[family].reads
    return [[r.row, reason] for r in records
            if r.family in source and r.ok and r.precision in held and not r.comparisons[CROSS].suffix_equal
            and (reason := not_testable_reason(r.comparisons[CROSS]))]


def validity_text(validity: Validity) -> str:
    """The validity control in the terminal's words."""
    invalid = validity.invalid
    return fmt_proportion(validity.reproduced) + (
        f"; INVALID HERE on {len(invalid)} rows ({', '.join(invalid)}): decoding is not a function of the cache "
        "values alone, no transplant outcome counts" if invalid else "")


def validity_cell(validity: Validity) -> str:
    """The validity control in a report's words."""
    text = f"{fmt_proportion(validity.reproduced)} rows reproduce"
    if validity.invalid:
        text += (f"; INVALID HERE on {', '.join(validity.invalid)}: decoding is not a function of the cache values "
                 "alone, no transplant outcome counts")
    return text
