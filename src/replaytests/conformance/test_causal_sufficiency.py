"""Layer 4, causal state sufficiency: does the boundary K/V cache carry the divergent trajectory?

Transplant, on each cell whose crossing may diverge (bf16 in the paper's contract): rows come from that
cell's crossing. First the validity control: each construction's cache
copied into its own replica must reproduce its trajectory bit for bit (else no outcome counts). Then,
on each divergent row whose first suffix tokens agree, the prefill recipient given the incremental
donor's K/V must follow the donor's suffix, and the other way round; on exact controls a transplant
must never produce a third trajectory (gates.transplant, per row and over the family). Replication
asks the same of a later checkpoint on an outcome-blind panel. K-only, V-only and layer-range
transplants are recorded in the ledger and report; they are findings, not gates. The conversation transplant
asks it across turns, on rows drawn from the conversation records: at a turn where session and replay diverge, each
given the other's K/V over turns 1..j (by position), under the transplant's gates; the earliest carrying turn is a
finding, and a panel with nothing to transplant is recorded, never passed.
"""

import pytest

from replaytests.conformance.helpers import audit_against_baseline, judge, ok
from replaytests.families.registry import CROSS, FAMILIES
from replaytests.inputs.gates import replica_pairs
from replaytests.outputs import causal, conversation_transplant_outcome, transplant_outcome

pytestmark = pytest.mark.causal


def _role(replay, row, cell, family: str = "transplant") -> str:
    """The row's role in the family's panel (drawn from the outcomes of the family it reads); a row outside the
    panel, or one the family cannot test, is skipped with the reason."""
    role = replay.role(family, row, cell)
    if role is None:
        pytest.skip(f"not in the {family} panel (chosen from the {cell} {' and '.join(FAMILIES[family].reads)} "
                    "records' outcomes)")
    if role == "not_testable":
        pytest.skip(f"divergent, not testable: {dict(replay.panel(family, cell).not_testable)[row.id]}")
    return role


def test_transplant_validity_control(record, replay, causal_cell, transplant_row):
    """Each construction's cache copied into its replica reproduces that construction's trajectory. The family
    checks it (families.transplant.check_valid) and excludes a row where it fails (TransplantInvalid, with the
    evidence): an ok record is one whose control held, and an excluded one fails here with the reason."""
    _role(replay, transplant_row, causal_cell)
    ok(record("transplant", transplant_row, causal_cell))


def test_transplant_recipient_follows_donor(record, replay, causal_cell, transplant_row):
    role = _role(replay, transplant_row, causal_cell)
    judge(replay.contract.gates.transplant_row(ok(record("transplant", transplant_row, causal_cell)), role))


def test_transplant_family_meets_its_gates(record, replay, causal_cell, transplant_family):
    """gates.transplant over the whole panel: each direction's donor recovery and the controls' third
    trajectories (the per-row tests record a miss the gates allow a share of)."""
    family = "transplant"
    shard = replay.plan.family_rows(family)
    if not shard:
        pytest.skip(f"shard {replay.options.shard} holds none of the selected rows")
    roles = {row: role for row, role in replay.panel(family, causal_cell).rows}
    rows = [row for row in shard if row.id in roles]
    replay.records(family, rows, causal_cell)  # under -n N, computed by the workers together (suite.claims)
    summary = transplant_outcome.summarize([record(family, row, causal_cell) for row in rows], family)
    judge(*replay.contract.gates.transplant_family(family, *transplant_outcome.counts(summary)))


def test_replication_on_later_checkpoint(record, replay, causal_cell, replication_row):
    result = ok(record("replication", replication_row, causal_cell))  # the validity control held (as above)
    judge(*(replay.contract.gates.replicas(result, pair) for pair in replica_pairs(result)))
    cross = result.comparisons[CROSS]
    if not cross.suffix_equal and (reason := causal.not_testable_reason(cross)):
        pytest.skip(f"divergent, not testable: {reason}")
    judge(replay.contract.gates.transplant_row(result, "control" if cross.suffix_equal else "divergent"))


def _conversation_role(replay, row, cell) -> str:
    if not replay.contract.cell(cell).kv_cache.native:
        pytest.skip(f"{cell}: a position splice of a quantized K/V cache is not defined (its stored codes quantize "
                    "positions together)")
    return _role(replay, row, cell, "conversation_transplant")


def test_conversation_transplant_validity_control(record, replay, causal_cell, conversation_transplant_row):
    """At the row's turn, session's and replay's whole K/V spliced into their replicas reproduce their own
    assistant turns bit for bit; the family excludes a row where not (TransplantInvalid, with the evidence)."""
    _conversation_role(replay, conversation_transplant_row, causal_cell)
    ok(record("conversation_transplant", conversation_transplant_row, causal_cell))


def test_conversation_transplant_recipient_follows_donor(record, replay, causal_cell, conversation_transplant_row):
    """Given the donor's K/V over the whole turn-k history the recipient writes the donor's assistant turn
    (divergent rows); no splice between agreeing constructions takes a third trajectory (controls). The curve
    over turns and the earliest turn whose K/V carries the divergence are in the record."""
    role = _conversation_role(replay, conversation_transplant_row, causal_cell)
    result = ok(record("conversation_transplant", conversation_transplant_row, causal_cell))
    judge(replay.contract.gates.conversation_transplant_row(result, role))


def _conversation_panel(replay, cell) -> tuple:
    """The conversation transplant's panel in a cell, its roles (row -> role) and its rows in this run's shard;
    skipped where the backend cannot serve it or the cell's K/V cache is quantized."""
    family = "conversation_transplant"
    if reason := replay.unavailable(family):
        pytest.skip(reason)
    if not replay.contract.cell(cell).kv_cache.native:
        pytest.skip(f"{cell}: a position splice of a quantized K/V cache is not defined")
    panel = replay.panel(family, cell)
    roles = dict(panel.rows)
    return panel, roles, [row for row in replay.plan.family_rows(family) if row.id in roles]


def test_conversation_transplant_has_something_to_transplant(record, replay, causal_cell):
    """A panel without a testable divergent row checked nothing: "nothing to transplant", recorded, never a pass;
    with one, its divergent rows in this shard are transplanted (their validity controls held)."""
    panel, roles, rows = _conversation_panel(replay, causal_cell)
    for row in rows:
        if roles[row.id] == "divergent":
            ok(record("conversation_transplant", row, causal_cell))
    candidates = min(replay.plan.panel_size("conversation"), len(replay.rows))
    divergent = sum(role == "divergent" for role in roles.values())
    judge(replay.contract.gates.conversation_transplant_panel(causal_cell, divergent, panel.not_testable,
                                                              candidates))


def test_conversation_transplant_family_meets_its_gates(record, replay, causal_cell):
    """gates.transplant over the conversation transplant's rows in this shard: per direction, the divergent
    conversations whose recipient given the donor's whole turn-k K/V follows it (transplant.donor_recovery), and the
    controls whose splice that moved no differing K/V took a third trajectory (transplant.controls_third_trajectory).
    The per-row tests record a miss the gates allow a share of; this judges the share (a direction with no such row
    establishes nothing: recorded, never met)."""
    _, _, rows = _conversation_panel(replay, causal_cell)
    if not rows:
        pytest.skip(f"no row of the {causal_cell} conversation transplant panel in this run's rows (an empty panel is "
                    "recorded by test_conversation_transplant_has_something_to_transplant)")
    family = "conversation_transplant"
    summary = conversation_transplant_outcome.summarize([record(family, row, causal_cell) for row in rows], family)
    judge(*replay.contract.gates.transplant_family(family, *conversation_transplant_outcome.counts(summary)))


def test_causal_baseline_record_reproduces(audit_record, replay, causal_baseline_record):
    """The ledger audit (test_replica_stability) of the transplant's and the replication's records."""
    audit_against_baseline(audit_record, replay, causal_baseline_record)
