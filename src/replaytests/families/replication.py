"""Replication on another checkpoint (SPEC §7.6): the crossing and the transplant, outcome-blind.

With a new checkpoint and an existing bank, the panel is frozen from prefix lengths and row ids
alone, before any result exists. Six arms per row: incremental and prefill, a replica of each, and
the two all-layer transplants (prefill <- incremental, incremental <- prefill); plus the validity
control (each construction's cache in its replica must reproduce its own trajectory). A divergent
row is testable where the first suffix tokens agree. "Strong replication" needs at least the
registered minimum of exact controls (rows whose incremental and prefill suffixes are equal) besides
full donor recovery and no third trajectory.
"""

from __future__ import annotations

from collections.abc import Callable

from replaytests.engine import constructions
from replaytests.engine.runtime import Runtime
from replaytests.engine.transplant import direction, transplant
from replaytests.errors import TransplantInvalid
from replaytests.families import bridge, crossing
from replaytests.families.transplant import (
    DIRECTIONS,
    REPLICA_DIRECTIONS,
    SELF_TRANSPLANTS,
    TRANSPLANTS,
    VALIDITY_PAIRS,
    check_valid,
    not_testable_reason,
    outcome,
    rate,
    validity,
)
from replaytests.inputs.bank import BankRow
from replaytests.inputs.gates import replicas_exact

FAMILY = "replication"
ARMS = (*crossing.ARMS, *TRANSPLANTS, *SELF_TRANSPLANTS)
PAIRS = (*crossing.PAIRS, *((direction(r, d), d) for r, d in DIRECTIONS), *VALIDITY_PAIRS)
HEADLINE = crossing.HEADLINE
REPLICAS = crossing.REPLICAS
PANEL = 48
MIN_EXACT_CONTROLS = 6  # registered before the run (SPEC §7.6)


def panel(bank_rows: list[BankRow], size: int = PANEL) -> list[BankRow]:
    """Spaced order statistics of (prefix length, row id): reads no suffix, ledger or transplant result."""
    return bridge.panel(bank_rows, size)


def run(runtime: Runtime, row: BankRow) -> dict:
    def build():
        built = {}
        for arm in crossing.ARMS:
            built[arm] = constructions.build(runtime, arm, row.tokens)
            yield built[arm]
        for recipient, donor in (*DIRECTIONS, *REPLICA_DIRECTIONS):
            yield transplant(runtime, built[recipient], built[donor])

    record = crossing.evaluate(runtime, row, FAMILY, ARMS, PAIRS, build)
    if record["status"] != "ok":
        return record
    try:
        check_valid(record["comparisons"], f"{FAMILY} row {row.id} ({runtime.precision})")
    except TransplantInvalid as exc:
        return crossing.excluded(crossing.record_base(FAMILY, row, runtime), exc)
    suffix = {arm: fields["suffix"] for arm, fields in record["arms"].items()}
    record["transplants"] = {direction(r, d): outcome(suffix[direction(r, d)], suffix[d], suffix[r])
                             for r, d in DIRECTIONS}
    return record


def summarize(records: list[dict], min_exact_controls: int = MIN_EXACT_CONTROLS) -> dict:
    """Divergence, donor recovery both ways, exact controls and the strong-replication label."""
    mine = [r for r in records if r["family"] == FAMILY]
    ok = [r for r in mine if r["status"] == "ok"]
    cross = {r["row"]: r["comparisons"][crossing.HEADLINE[0]] for r in ok}
    divergent = [r for r in ok if not cross[r["row"]]["suffix_equal"]]
    testable = [r for r in divergent if not not_testable_reason(cross[r["row"]])]
    controls = [r for r in ok if cross[r["row"]]["suffix_equal"]]

    def outcome_is(name: str, wanted: str) -> Callable[[dict], bool]:
        return lambda r: r["transplants"][name]["outcome"] == wanted

    recovery = {name: rate(testable, outcome_is(name, "follows_donor")) for name in TRANSPLANTS}
    third = {name: rate(controls, outcome_is(name, "third")) for name in TRANSPLANTS}
    replicated = (bool(testable) and all(replicas_exact(r) for r in ok)
                  and all(p["k"] == p["n"] for p in recovery.values()) and all(p["k"] == 0 for p in third.values()))
    return {
        "rows": len(mine), "excluded": len(mine) - len(ok),
        "replicas_exact": rate(ok, replicas_exact),
        "divergent": rate(ok, lambda r: not cross[r["row"]]["suffix_equal"]),
        "not_testable": [[r["row"], not_testable_reason(cross[r["row"]])] for r in divergent if r not in testable],
        "validity": validity(mine),
        "donor_recovery": recovery,
        "exact_controls": len(controls), "min_exact_controls": min_exact_controls, "control_third": third,
        "replicated": replicated, "strong": replicated and len(controls) >= min_exact_controls,
    }
