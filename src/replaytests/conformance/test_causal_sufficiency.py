"""Layer 4, causal state sufficiency: does the boundary K/V cache carry the divergent trajectory?

Transplant (SPEC §7.5): on each divergent row of the BF16 crossing (boundary argmax agreeing), the
prefill recipient given the incremental donor's K/V must follow the donor's suffix, and the other way
round; on exact controls a transplant must never produce a third trajectory. Replication (SPEC §7.6)
asks the same of a later checkpoint on an outcome-blind panel. K-only, V-only and layer-range
transplants are recorded in the ledger and report; they are findings, not gates.
"""

import pytest

from replaytests.conformance.helpers import ok
from replaytests.families import crossing, transplant

pytestmark = pytest.mark.causal


def _judge(result: dict, role: str) -> None:
    outcomes = {name: result["transplants"][name]["outcome"] for name in transplant.TRANSPLANTS}
    where = f"{result['family']} row {result['row']} ({role})"
    if role == "divergent":
        wrong = {name: o for name, o in outcomes.items() if o != "follows_donor"}
        assert not wrong, f"{where}: the recipient did not follow its donor: {wrong}"
    else:
        third = {name: result["transplants"][name] for name, o in outcomes.items() if o == "third"}
        assert not third, f"{where}: a transplant between exact arms produced a third trajectory: {third}"


def test_transplant_recipient_follows_donor(record, replay, transplant_row):
    role = replay.transplant_role(transplant_row)
    if role is None:
        pytest.skip("not in the transplant panel (chosen from the BF16 crossing's outcomes)")
    if role == "not_testable":
        pytest.skip("divergent, but the boundary argmax differs: not testable by transplant")
    _judge(ok(record("transplant", transplant_row, "bf16")), role)


def test_replication_on_later_checkpoint(record, replication_row):
    result = ok(record("replication", replication_row, "bf16"))
    replicas = [p for p in crossing.REPLICAS if not (result["comparisons"][p]["cache_exact"]
                                                     and result["comparisons"][p]["suffix_equal"])]
    assert not replicas, f"replication row {replication_row.id}: replicas not exact on the later checkpoint: {replicas}"
    cross = result["comparisons"][crossing.HEADLINE[0]]
    if not cross["suffix_equal"] and not cross["argmax_equal"]:
        pytest.skip("divergent, but the boundary argmax differs: not testable by transplant")
    _judge(result, "control" if cross["suffix_equal"] else "divergent")
