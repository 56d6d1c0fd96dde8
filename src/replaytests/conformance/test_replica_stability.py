"""Layer 1, replica stability: two executions of the same construction are bit-exact, within a run
(replica arms) and across runs (the ledger audit against a saved baseline)."""

import pytest

from replaytests.conformance.helpers import comparison, state_differences
from replaytests.families import FAMILIES

pytestmark = pytest.mark.replica


@pytest.mark.parametrize(("family", "pair"), [
    pytest.param(family, pair, id=f"{family}-{pair.partition('~')[0]}")
    for family in ("crossing", "live") for pair in FAMILIES[family].REPLICAS
])
def test_replica_exact(record, bank_row, precision, family, pair):
    metrics = comparison(record(family, bank_row, precision), pair)
    problems = state_differences(metrics, pair, f"{family} row {bank_row.id} ({precision})")
    assert not problems, "\n".join(problems)


def test_baseline_record_reproduces(audit_record, replay, baseline_record):
    """Ledger audit (SPEC §7.4): every leaf of the saved record — trajectories, answers, cache and
    logits digests, every metric — is reproduced exactly by this run."""
    result = audit_record(baseline_record)
    family, row, precision = (baseline_record[k] for k in ("family", "row", "precision"))
    assert result.reproduced, (
        f"{family} row {row} ({precision}): {len(result.changes)} of {result.leaves} leaves differ from the "
        f"baseline; first: {result.changes[0]}"
        + "".join(f"; platform differs: {d}" for d in replay.baseline_differences)
    )
