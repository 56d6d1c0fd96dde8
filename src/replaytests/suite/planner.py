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
from replaytests.files import lookup
from replaytests.inputs.options import Options, parse_shard
from replaytests.outputs.records import Record

if TYPE_CHECKING:
    from replaytests.inputs.bank import BankRow

# The conformance tests' row fixtures, and the family whose rows each takes (both rollout families read
# `rollout_row`: the first registered takes it).
ROW_FIXTURES = {f.fixture: f.name for f in reversed(FAMILIES.values())}
# The replica layer's parameters: one test over every family that names the layer (suite.parameters.replica_params).
REPLICA = ("replica_family", "replica_row", "replica_pair")


@dataclass(frozen=True)
class Plan:
    rows: list[BankRow]  # the selected rows (--rows)
    panels: dict  # the contract's panels
    options: Options
    unsupported: frozenset[str] = frozenset()  # families the backend cannot serve (they run on no row)
    cells: dict[str, tuple[str, ...]] | None = None  # family -> the cells it runs on (session.family_cells)

    @property
    def sharded_rows(self) -> list[BankRow]:
        """This shard's share of the selected rows (all of them without --shard)."""
        index, count = parse_shard(self.options.shard)
        return [row for n, row in enumerate(self.rows) if n % count == index - 1]

    def panel_size(self, family: str) -> int | None:
        """The size of a family's panel (None: every selected row), where the registry says the contract holds it."""
        path = FAMILIES[family].panel_size
        return None if path is None else lookup(self.panels, *path)

    def family_rows(self, family: str) -> list[BankRow]:
        """The rows a family runs on: every selected row, or its panel of them; then this shard's share
        (panels are drawn from all selected rows, so shards together run exactly the unsharded rows)."""
        if family in self.unsupported or (FAMILIES[family].later_model and not self.options.later_model):
            return []
        share = {row.id for row in self.sharded_rows}
        return [row for row in self.panel_rows(family) if row.id in share]

    def panel_rows(self, family: str) -> list[BankRow]:
        """The selected rows a family's panel holds, in every shard: all of them, or its panel of them."""
        size = self.panel_size(family)
        return self.rows if size is None else spaced(self.rows, size)

    def audited_keys(self) -> set[tuple[str, str, str]]:
        """The (family, row, cell) of every record this run recomputes: its families, cells and rows."""
        return {(f, r.id, p) for f in FAMILIES for r in self.family_rows(f) for p in (self.cells or {}).get(f, ())}


def worker_group(params: dict) -> str | None:
    """The xdist group of a test from its parameters: the (cell, row) it reads. A test that reads
    other rows' records (the transplant's panel, its family gate) gets them from the workers that
    computed them, or computes those nobody has started (suite.claims)."""
    baseline = params.get("baseline_record") or params.get("causal_baseline_record")
    baseline = baseline if isinstance(baseline, Record) else None
    cell = params.get("cell") or params.get("causal_cell") or (baseline and baseline.precision)
    row = (baseline and baseline.row) or next((params[name].id for name in (*ROW_FIXTURES, REPLICA[1])
                                               if params.get(name)), None)
    return row and f"{cell}-{row}"
