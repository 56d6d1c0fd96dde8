"""Transplant, the fourth fidelity layer: does the boundary K/V cache carry the divergence?

Rows come from a finished BF16 crossing (`panel`). Each row's incremental and prefill, and a replica
of each, are the crossing's own arms where this process still holds them (engine.arms), else rebuilt;
either way they are checked against the crossing record (a contemporaneous baseline), then each
recipient is given a storage-isolated copy of the donor's K/V — all layers, K and V — and continued
by the shared decoder: the prefill recipient with the incremental donor's cache, and the other way
round. Each direction either follows its donor's suffix, keeps its own, or produces a third trajectory.

A row is testable only where both constructions choose the same first suffix token (the masked
greedy choice at the boundary, made from the recipient's own logits): a transplant moves the cache,
not those logits. The validity control comes first: each construction's cache copied into its own
replica must reproduce that construction's trajectory bit for bit, or decoding here is not a
function of the cache values alone and the row fails closed (TransplantInvalid).

Beyond the paper: K-only and V-only transplants in both directions, and for divergent rows the
narrowest contiguous layer range whose K/V transplant alone makes the recipient follow the donor.
With at most EXHAUSTIVE_MAX_LAYERS layers every proper contiguous range is tried by increasing width
(the first hit is minimal); above that a bisection assumes that a wider range never does worse.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Boundary, Suffix, check_same_state, check_storage_isolated
from replaytests.engine.comparisons import first_divergence
from replaytests.errors import FailClosed, NotContemporaneous, TransplantInvalid
from replaytests.families.panels import spaced
from replaytests.families.registry import (
    CROSS,
    DIRECTIONS,
    FAMILIES,
    REPLICA_DIRECTIONS,
    ROLES,
    TRANSPLANT_CONSTRUCTIONS,
    TRANSPLANTS,
    VALIDITY_PAIRS,
    Panel,
)
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base
from replaytests.inputs.bank import BankRow
from replaytests.inputs.blocks import PARTS, direction
from replaytests.inputs.contract import SCHEMA
from replaytests.outputs.causal import not_testable_reason
from replaytests.outputs.records import Record, as_written, title

FAMILY = FAMILIES["transplant"]
BUILT = (*TRANSPLANT_CONSTRUCTIONS, *(replica for replica, _ in REPLICA_DIRECTIONS))  # in the order they are built
PARTIAL = {"k_only": ("k",), "v_only": ("v",)}
EXHAUSTIVE_MAX_LAYERS = 8
LAYER_FIELDS = ("layer_search", "minimal_layers", "layer_ranges")  # null for controls
_PANEL = SCHEMA.keys["panels"].keys["transplant"].keys  # the contract's defaults, one copy of them
DIVERGENT, CONTROLS = _PANEL["divergent"].default, _PANEL["exact_controls"].default


class _Ref(NamedTuple):
    """What panels.spaced reads of a row, taken from a crossing record."""

    id: str
    prefix_len: int


def _spaced(records: list[Record], size: int) -> list[str]:
    return [ref.id for ref in spaced([_Ref(r.row, r.prefix_len) for r in records], size)]


def panel(crossing_records: list[Record], cell: str, divergent: int = DIVERGENT, controls: int = CONTROLS) -> Panel:
    """Rows for the transplant in one cell, from that cell's finished crossing records only (nothing else
    is read).

    Divergent: incremental and prefill suffixes differ while their first suffix tokens agree; where
    those differ the row is not testable by transplant (the recipient keeps its own logits) and is
    reported with the reason. Controls: rows whose suffixes are equal, the cache-exact ones first
    (the strictest controls), topped up with suffix-equal ones. Each group at spaced order statistics
    of prefix length.
    """
    finished = [r for r in crossing_records if r.family == "crossing" and r.precision == cell and r.ok]
    cross = {r.row: r.comparisons[CROSS] for r in finished}
    split = [r for r in finished if not cross[r.row].suffix_equal]
    equal = [r for r in finished if cross[r.row].suffix_equal]
    exact = [r for r in equal if cross[r.row].cache_exact]
    chosen = _spaced(exact, controls)
    chosen += _spaced([r for r in equal if not cross[r.row].cache_exact], controls - len(chosen))
    testable = _spaced([r for r in split if not not_testable_reason(cross[r.row])], divergent)
    by_length = {r.row: (r.prefix_len, r.row) for r in finished}
    return Panel([(row, "divergent") for row in testable]
                 + [(row, "control") for row in sorted(chosen, key=by_length.__getitem__)],
                 sorted((r.row, reason) for r in split if (reason := not_testable_reason(cross[r.row]))))


def outcome(suffix: list[int], donor: list[int], own: list[int]) -> dict:
    """Classify a transplanted suffix. Where donor and own coincide (a control) following one is
    following both: a control is a third trajectory only when it matches neither."""
    name = "follows_donor" if suffix == donor else "keeps_own" if suffix == own else "third"
    return {"outcome": name, "first_divergence_vs_donor": first_divergence(suffix, donor),
            "first_divergence_vs_own": first_divergence(suffix, own)}


def minimal_range(follows: Callable[[int, int], bool], n_layers: int) -> tuple[list[int] | None, str]:
    """The narrowest proper contiguous range [lo, hi] for which follows(lo, hi), or None; and the method.

    Called once the all-layer transplant follows the donor."""
    if n_layers <= EXHAUSTIVE_MAX_LAYERS:
        for width in range(1, n_layers):
            for lo in range(n_layers - width + 1):
                if follows(lo, lo + width - 1):
                    return [lo, lo + width - 1], "exhaustive"
        return None, "exhaustive"
    # Monotone assumption: the smallest hi with [0, hi] sufficient, then the largest lo with [lo, hi].
    hi = bisect.bisect_left(range(n_layers), True, key=lambda h: follows(0, h))
    if hi == n_layers:  # the assumption failed: even [0, n_layers - 1] was never found sufficient
        return None, "bisection"
    lo = bisect.bisect_left(range(hi + 1), True, key=lambda low: not follows(low, hi)) - 1
    return (None if [lo, hi] == [0, n_layers - 1] else [lo, hi]), "bisection"


@dataclass
class _Trial:
    """A row's own incremental and prefill boundaries and suffixes, and transplants between them."""

    runtime: Backend
    row: BankRow
    boundaries: dict[str, Boundary]
    suffixes: dict[str, Suffix]

    @classmethod
    def build(cls, runtime: Backend, row: BankRow) -> _Trial:
        where = title(FAMILY.name, row.id, runtime.cell)
        boundaries = {c: runtime.build(c, row.tokens) for c in BUILT}
        check_same_state(list(boundaries.values()), where)
        check_storage_isolated(list(boundaries.values()), where)
        return cls(runtime, row, boundaries, {c: runtime.suffix(b) for c, b in boundaries.items()})

    def attempt(self, recipient: str, donor: str, layers: range | None = None,
                parts: tuple[str, ...] = PARTS) -> tuple[Boundary, Suffix, dict]:
        moved = self.runtime.transplant(self.boundaries[recipient], self.boundaries[donor], layers, parts)
        suffix = self.runtime.suffix(moved)
        return moved, suffix, outcome(suffix.tokens, self.suffixes[donor].tokens, self.suffixes[recipient].tokens)

    def arm_records(self) -> dict[str, dict]:
        return {c: arm_record(self.boundaries[c], self.suffixes[c], self.row.expected_answer) for c in BUILT}

    def layer_search(self, recipient: str, donor: str) -> tuple[list[int] | None, list[list]]:
        tried: list[list] = []

        @functools.cache
        def follows(lo: int, hi: int) -> bool:
            result = self.attempt(recipient, donor, range(lo, hi + 1))[2]["outcome"]
            tried.append([lo, hi, result])
            return result == "follows_donor"

        return minimal_range(follows, len(self.boundaries[recipient].layers))[0], tried


def check_contemporaneous(rebuilt: dict[str, dict], crossing_record: Record, row: BankRow, cell: str) -> None:
    """The rebuilt arms (as the ledger holds them) must reproduce the crossing record's (digests, suffix,
    answer, z)."""
    where = f"{title(FAMILY.name, row.id, cell)}: not contemporaneous"
    found = (*crossing_record.key, crossing_record.status)
    if found != ("crossing", row.id, cell, "ok"):
        raise NotContemporaneous(f"{where}: expected the ok crossing record of this row and cell, got "
                                 f"{'/'.join(found)}")
    for arm, fields in rebuilt.items():
        held = crossing_record.arms[arm].to_json() if arm in crossing_record.arms else {}
        for field, value in fields.items():
            if held.get(field) != value:
                raise NotContemporaneous(f"{where}: rebuilt {arm} {field} differs from the crossing record")


def check_valid(comparisons: dict, where: str) -> None:
    """The validity control: every self-transplant reproduced its construction's own trajectory bit for
    bit; else TransplantInvalid with the evidence."""
    for name, own in VALIDITY_PAIRS:
        metrics = comparisons[f"{name}~{own}"]
        if not metrics["suffix_equal"]:
            raise TransplantInvalid(
                f"{where}: transplant invalid here: decoding is not a function of the cache values alone: "
                f"{own}'s cache copied into its replica ({name}) diverges from {own}'s own suffix at index "
                f"{metrics['first_divergence']} (cache {'bit-exact' if metrics['cache_exact'] else 'not bit-exact'}, "
                f"boundary logits {'bit-equal' if metrics['logits_exact'] else 'different'})")


def run(runtime: Backend, row: BankRow, crossing_record: Record, role: str) -> Record:
    """The ledger record of one panel row (`role` "divergent" or "control") at the runtime's cell."""
    if role not in ROLES:
        raise ValueError(f"transplant role must be one of {ROLES}, got {role!r}")
    base = record_base(FAMILY.name, row, runtime) | {"role": role}
    runtime.activate()
    try:
        trial = _Trial.build(runtime, row)
        arms = as_written(trial.arm_records())  # as the crossing record holds them
        check_contemporaneous(arms, crossing_record, row, runtime.cell)
        full = {direction(r, d): trial.attempt(r, d) for r, d in (*DIRECTIONS, *REPLICA_DIRECTIONS)}
        boundaries = trial.boundaries | {name: moved for name, (moved, _, _) in full.items()}
        suffixes = trial.suffixes | {name: suffix for name, (_, suffix, _) in full.items()}
        arms |= {name: arm_record(moved, suffix, row.expected_answer) for name, (moved, suffix, _) in full.items()}
        comparisons = compare_arms(FAMILY.pairs, boundaries, suffixes, arms)
        check_valid(comparisons, title(FAMILY.name, row.id, runtime.cell))
        parts = {name: {direction(r, d): _partial(trial.attempt(r, d, parts=selected)) for r, d in DIRECTIONS}
                 for name, selected in PARTIAL.items()}
        layers = _layer_search(trial, full) if role == "divergent" else dict.fromkeys(LAYER_FIELDS)
    except FailClosed as exc:
        return excluded(base, exc)
    return Record.of(base | {"status": "ok", "arms": arms, "comparisons": comparisons,
                             "transplants": {name: full[name][2] for name in TRANSPLANTS}, "parts": parts,
                             "layers": len(trial.boundaries["prefill"].layers)} | layers)


def _layer_search(trial: _Trial, full: dict[str, tuple]) -> dict:
    """Per direction whose all-layer transplant follows the donor: the minimal range and every range tried."""
    n_layers = len(trial.boundaries["prefill"].layers)
    found = {direction(r, d): trial.layer_search(r, d) if full[direction(r, d)][2]["outcome"] == "follows_donor"
             else (None, []) for r, d in DIRECTIONS}
    return {"layer_search": "exhaustive" if n_layers <= EXHAUSTIVE_MAX_LAYERS else "bisection",
            "minimal_layers": {name: minimal for name, (minimal, _) in found.items()},
            "layer_ranges": {name: tried for name, (_, tried) in found.items()}}


def _partial(attempt: tuple[Boundary, Suffix, dict]) -> dict:
    moved, suffix, result = attempt
    return {"suffix": suffix.tokens, "cache_digest": moved.cache_digest()} | result
