"""The plan of a run: the rows each family runs on (its panel of the selected rows, then this shard's
share), the baseline records the run recomputes, and the xdist worker group of each test. Decided
from the inputs alone, never from outcomes (the transplant panel, which reads the BF16 crossing's
outcomes, is the session's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replaytests.families.panels import spaced
from replaytests.families.registry import FAMILIES
from replaytests.inputs.options import Options, parse_shard
from replaytests.outputs import ledger

if TYPE_CHECKING:
    from replaytests.inputs.bank import BankRow

# The conformance tests' row fixtures, and the family whose rows each takes.
ROW_FIXTURES = {"bank_row": "crossing", "live_row": "live", "panel_row": "bridge", "batch_row": "batch",
                "transplant_row": "transplant", "replication_row": "replication", "serving_row": "serving"}
CROSSING_GROUP = "bf16-crossing"
READERS = frozenset(name for name, family in FAMILIES.items() if family.reads)
# Families whose records another family reads across rows, with their readers: one worker computes them all
# (measured: handing the transplant its crossing from other workers instead made it wait at the end, slower).
READ_TOGETHER = frozenset(name for reader in READERS for name in (reader, *FAMILIES[reader].reads))


@dataclass(frozen=True)
class Plan:
    rows: list[BankRow]  # the selected rows (--rows)
    panels: dict  # the contract's panels
    options: Options
    unsupported: frozenset[str] = frozenset()  # families the backend cannot serve (they run on no row)

    @property
    def sharded_rows(self) -> list[BankRow]:
        """This shard's share of the selected rows (all of them without --shard)."""
        index, count = parse_shard(self.options.shard)
        return [row for n, row in enumerate(self.rows) if n % count == index - 1]

    def panel_size(self, family: str) -> int | None:
        """The size of a family's panel (None: every selected row)."""
        kind = FAMILIES[family].rows
        return {"bridge": self.panels["bridge"], "live": self.panels["live"],
                "replication": self.panels["replication"]["rows"]}.get(kind)

    def family_rows(self, family: str) -> list[BankRow]:
        """The rows a family runs on: every selected row, or its panel of them; then this shard's share
        (panels are drawn from all selected rows, so shards together run exactly the unsharded rows)."""
        if family in self.unsupported or (FAMILIES[family].rows == "replication" and not self.options.later_model):
            return []
        size = self.panel_size(family)
        rows = self.rows if size is None else spaced(self.rows, size)
        share = {row.id for row in self.sharded_rows}
        return [row for row in rows if row.id in share]

    def audited(self, baseline: list[dict]) -> list[dict]:
        """The baseline records this run recomputes: its families, precisions and rows."""
        wanted = {(f, r.id, p) for f in FAMILIES for r in self.family_rows(f) for p in self.options.precisions}
        return [record for record in baseline if ledger.key(record) in wanted]


def reads_across_rows(params: dict) -> bool:
    """Whether a test reads a family that reads other rows' records (the transplant: its panel is drawn
    from the whole BF16 crossing)."""
    baseline = params.get("baseline_record") or params.get("causal_baseline_record")
    return (any(params.get(name) for name, family in ROW_FIXTURES.items() if family in READERS)
            or any(params.get(f"{name}_family") for name in READERS)
            or (isinstance(baseline, dict) and baseline.get("family") in READERS))


def worker_group(params: dict, together: bool = True) -> str | None:
    """The xdist group of a test from its parameters: the (precision, row) it reads, except that, where
    `together` (the run draws the transplant panel from its own crossing and selects a test that reads
    across rows), the BF16 tests of the families read together (READ_TOGETHER: the whole BF16 crossing
    and the transplant drawn from it) share one group, so that one worker computes them."""
    baseline = params.get("baseline_record") or params.get("causal_baseline_record")
    baseline = baseline if isinstance(baseline, dict) else {}
    precision = params.get("precision") or baseline.get("precision") or "bf16"
    grouped = reads_across_rows(params) or any(params.get(name) for name, family in ROW_FIXTURES.items()
                                                 if family in READ_TOGETHER) or baseline.get("family") in READ_TOGETHER
    if together and precision == "bf16" and grouped:
        return CROSSING_GROUP
    row = baseline.get("row") or next((params[name].id for name in ROW_FIXTURES if params.get(name)), None)
    return row and f"{precision}-{row}"
