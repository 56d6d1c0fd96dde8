"""The replication on a later checkpoint (the paper's Table 6), per cell: its divergent rows, donor recovery both
ways over the testable ones, third trajectories over the exact controls, and the strong-replication label; and each
place they are shown (an outcome module: outputs/causal.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replaytests.families.registry import CROSS, FAMILIES, TRANSPLANTS
from replaytests.inputs.contract import SCHEMA
from replaytests.inputs.gates import Gates
from replaytests.outputs.causal import Validity, not_testable_reason, validity, validity_cell, validity_text
from replaytests.outputs.findings import Findings, Group, Rows
from replaytests.outputs.records import Record
from replaytests.outputs.shapes import replicas_hold
from replaytests.outputs.stats import Proportion, fields_of, proportion
from replaytests.outputs.tables import Table, fmt_proportion

TRACKED = ("divergent", "label")  # the history keeps its divergent rows (first) and its label (last) too
REQUIRED = ("transplants",)  # what an ok record must hold for summarize


def min_exact_controls(family: str, meta: dict | None = None) -> int:
    """The registered minimum of exact controls for a strong replication: the run's (run.json `panels`), else the
    contract's default."""
    panel = FAMILIES[family].panel
    default = SCHEMA.keys["panels"].keys[panel].keys["min_exact_controls"].default
    return (((meta or {}).get("panels") or {}).get(panel) or {}).get("min_exact_controls", default)


@dataclass(frozen=True)
class ReplicationOutcome:
    """A replication's outcomes in one cell (the paper's Table 6): its rows (`rows` with `excluded` among them), the
    ok rows whose replicas held, those that diverge, the divergent rows no transplant can test ([row, reason]), the
    validity control, donor recovery per direction over the testable ones, the exact controls (and the registered
    minimum for a strong replication) with their third trajectories per direction, and the label's two findings."""

    rows: int
    excluded: int
    replicas_exact: Proportion
    divergent: Proportion
    not_testable: list[list[str]]
    validity: Validity
    donor_recovery: dict[str, Proportion]
    exact_controls: int
    min_exact_controls: int
    control_third: dict[str, Proportion]
    replicated: bool
    strong: bool

    def to_json(self) -> dict:
        return fields_of(self)

    @property
    def label(self) -> str:
        return ("strong replication" if self.strong else "replicated, not strong" if self.replicated
                else "not replicated")


def summarize(records: list[Record], family: str, meta: dict | None = None) -> ReplicationOutcome:
    """Divergence, donor recovery both ways, exact controls and the strong-replication label, over the family's
    records of one cell."""
    minimum = min_exact_controls(family, meta)
    mine = [r for r in records if r.family == family]
    ok = [r for r in mine if r.ok]
    cross = {r.row: r.comparisons[CROSS] for r in ok}
    divergent = [r for r in ok if not cross[r.row].suffix_equal]
    testable = [r for r in divergent if not not_testable_reason(cross[r.row])]
    controls = [r for r in ok if cross[r.row].suffix_equal]

    def outcome_is(name: str, wanted: str) -> Callable[[Record], bool]:
        return lambda r: r.transplants[name].outcome == wanted

    recovery = {name: proportion(testable, outcome_is(name, "follows_donor")) for name in TRANSPLANTS}
    third = {name: proportion(controls, outcome_is(name, "third")) for name in TRANSPLANTS}
    replicated = (bool(testable) and all(replicas_hold(r) for r in ok)
                  and all(p.k == p.n for p in recovery.values()) and all(p.k == 0 for p in third.values()))
    return ReplicationOutcome(
        rows=len(mine), excluded=len(mine) - len(ok), replicas_exact=proportion(ok, replicas_hold),
        divergent=proportion(ok, lambda r: not cross[r.row].suffix_equal),
        not_testable=[[r.row, not_testable_reason(cross[r.row])] for r in divergent if r not in testable],
        validity=validity(mine), donor_recovery=recovery, exact_controls=len(controls), min_exact_controls=minimum,
        control_third=third, replicated=replicated, strong=replicated and len(controls) >= minimum)


def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Nothing beyond every family's checks: a replication is judged row by row (its conformance test), and its label
    (strong or not) is a finding its report states, not a gate."""


def terminal_lines(family: str, cell: str, r: ReplicationOutcome, gates: Gates) -> list[str]:
    recovery = "; ".join(f"{name} {fmt_proportion(v)}" for name, v in r.donor_recovery.items())
    return [f"{family} ({cell}): validity control {validity_text(r.validity)}; divergent "
            f"{fmt_proportion(r.divergent)}, not testable {len(r.not_testable)}; donor recovery "
            f"{recovery}; exact controls {r.exact_controls} (registered minimum {r.min_exact_controls}): {r.label}"]


def tables(family: str, cell: str, r: ReplicationOutcome) -> list[Table]:
    rows = (("validity control", validity_cell(r.validity)),
            ("divergent rows", fmt_proportion(r.divergent)),
            ("not testable (first suffix tokens differ)",
             "; ".join(f"{row}: {reason}" for row, reason in r.not_testable) or "0"),
            ("replicas exact", fmt_proportion(r.replicas_exact)),
            *((f"donor recovery {d}", fmt_proportion(v)) for d, v in r.donor_recovery.items()),
            *((f"controls: third trajectory {d}", fmt_proportion(v)) for d, v in r.control_third.items()),
            ("exact controls (registered minimum)", f"{r.exact_controls} ({r.min_exact_controls})"),
            ("label", r.label))
    return [Table(f"{FAMILIES[family].title}, {cell}", ("measure", "value"), rows)]


def replica_rows(family: str, cell: str, r: ReplicationOutcome) -> list[tuple[str, ...]]:
    """Its replicas, both constructions at once, in the replica layer's table."""
    return [(family, cell, "both constructions", fmt_proportion(r.replicas_exact))]


def tracked(r: ReplicationOutcome) -> dict:
    """Divergent rows, donor recovery and third trajectories per direction, and the label."""
    return {"divergent": r.divergent, "follows_donor": r.donor_recovery, "control_third": r.control_third,
            "label": r.label}
