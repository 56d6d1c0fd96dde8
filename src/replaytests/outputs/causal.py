"""The causal layer read from the ledger: the transplant's outcomes (the paper's Table 5) and the
replication on a later checkpoint (Table 6), the validity control, and which divergent rows no
transplant can test. Reads records only (no engine), so reports, summaries and gates share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from replaytests.families.registry import CROSS, TRANSPLANTS, VALIDITY_PAIRS
from replaytests.inputs.cells import PAPER
from replaytests.inputs.contract import SCHEMA
from replaytests.outputs.records import Comparison, Outcome, Record
from replaytests.outputs.shapes import replicas_hold
from replaytests.outputs.stats import proportion

# The registered minimum of exact controls for a strong replication, where a run names none: the contract's default.
MIN_EXACT_CONTROLS = SCHEMA.keys["panels"].keys["replication"].keys["min_exact_controls"].default
PARTIAL = ("k_only", "v_only")  # the partial transplants (K or V alone) a transplant record holds
INVALID = "TransplantInvalid"  # the reason an excluded record begins with when the validity control failed


def not_testable_reason(cross: Comparison) -> str | None:
    """Why a divergent crossing pair cannot be tested by transplant, or None where it can: the
    recipient keeps its own boundary logits, so where the first suffix tokens (the masked greedy
    choice) differ no transplant can move that choice."""
    first_token_equal = cross.first_divergence != 0 if cross.first_token_equal is None else cross.first_token_equal
    if first_token_equal:  # ledger/1 records lack the field: the first divergence says it
        return None
    argmax = "equal" if cross.argmax_equal else "different too"
    return f"first suffix tokens differ (raw boundary argmax {argmax}): a transplant cannot move that choice"


def validity(records: list[Record]) -> dict:
    """The validity control over a family's records: rows whose self-transplants reproduced their own
    trajectories (Wilson), and the rows it excluded (decoding not a function of the cache alone)."""
    carrying = [r for r in records if r.ok and all(f"{name}~{own}" in r.comparisons for name, own in VALIDITY_PAIRS)]
    return {"reproduced": proportion(carrying, lambda r: all(r.comparisons[f"{name}~{own}"].suffix_equal
                                                              for name, own in VALIDITY_PAIRS)),
            "invalid": sorted(r.row for r in records if not r.ok and r.reason.startswith(INVALID))}


def cells(records: list[Record], family: str) -> list[str]:
    """The cells a family's records hold, in the paper's order first."""
    held = {r.precision for r in records if r.family == family}
    return [c for c in PAPER if c in held] + sorted(held - set(PAPER))


def of_cell(records: list[Record], cell: str) -> list[Record]:
    return [r for r in records if r.precision == cell]


def not_testable(records: list[Record]) -> list[list[str]]:
    """[row, reason] of each divergent crossing row no transplant can test (first suffix tokens differ),
    in the cell of the transplant records."""
    held = {r.precision for r in records if r.family == "transplant"}
    return [[r.row, reason] for r in records
            if r.family == "crossing" and r.ok and r.precision in held and not r.comparisons[CROSS].suffix_equal
            and (reason := not_testable_reason(r.comparisons[CROSS]))]


def transplant(records: list[Record]) -> dict:
    """Counts with Wilson intervals over the transplant records: the validity control, donor recovery
    per direction (divergent rows), third trajectories (controls), the same for K-only and V-only,
    the minimal layer ranges, and the divergent rows no transplant can test."""
    mine = [r for r in records if r.family == "transplant"]
    ok = [r for r in mine if r.ok]
    divergent = [r for r in ok if r.role == "divergent"]
    controls = [r for r in ok if r.role == "control"]

    def both(get: Callable[[Record, str], Outcome]) -> dict:
        def outcome_is(wanted: str, name: str) -> Callable[[Record], bool]:
            return lambda r: get(r, name).outcome == wanted

        return {name: {"follows_donor": proportion(divergent, outcome_is("follows_donor", name)),
                       "control_third": proportion(controls, outcome_is("third", name))} for name in TRANSPLANTS}

    n_layers = max((r.layers for r in divergent), default=0)
    # Only rows whose all-layer transplant followed the donor were searched.
    minimal = {name: [r.minimal_layers[name] for r in divergent
                      if r.transplants[name].outcome == "follows_donor"] for name in TRANSPLANTS}
    return {
        "rows": len(mine), "excluded": len(mine) - len(ok), "divergent": len(divergent), "controls": len(controls),
        "validity": validity(mine),
        "not_testable": not_testable(records),
        "full": both(lambda r, n: r.transplants[n]),
        "parts": {part: both(lambda r, n, p=part: r.parts[p][n]) for part in PARTIAL},
        "minimal_layers": {name: dict(Counter("none" if m is None else f"{m[0]}-{m[1]}" for m in ranges))
                           for name, ranges in minimal.items()},
        "layer_frequency": {name: [sum(1 for m in ranges if m is not None and m[0] <= i <= m[1])
                                   for i in range(n_layers)] for name, ranges in minimal.items()},
    }


def replication(records: list[Record], min_exact_controls: int = MIN_EXACT_CONTROLS) -> dict:
    """Divergence, donor recovery both ways, exact controls and the strong-replication label."""
    mine = [r for r in records if r.family == "replication"]
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
                  and all(p["k"] == p["n"] for p in recovery.values()) and all(p["k"] == 0 for p in third.values()))
    return {
        "rows": len(mine), "excluded": len(mine) - len(ok),
        "replicas_exact": proportion(ok, replicas_hold),
        "divergent": proportion(ok, lambda r: not cross[r.row].suffix_equal),
        "not_testable": [[r.row, not_testable_reason(cross[r.row])] for r in divergent if r not in testable],
        "validity": validity(mine),
        "donor_recovery": recovery,
        "exact_controls": len(controls), "min_exact_controls": min_exact_controls, "control_third": third,
        "replicated": replicated, "strong": replicated and len(controls) >= min_exact_controls,
    }


def replication_label(summary: dict) -> str:
    return ("strong replication" if summary["strong"] else "replicated, not strong" if summary["replicated"]
            else "not replicated")
