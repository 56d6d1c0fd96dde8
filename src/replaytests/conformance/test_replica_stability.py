"""Layer 1, replica stability: two executions of the same construction are bit-exact, within a run
(replica arms) and across runs (the ledger audit against a saved baseline)."""

import pytest

from replaytests.conformance.helpers import comparison, state_differences
from replaytests.families import FAMILIES, transplant

pytestmark = pytest.mark.replica


def _check_replica(result: dict, pair: str) -> None:
    metrics = comparison(result, pair)
    problems = state_differences(metrics, pair, f"{result['family']} row {result['row']} ({result['precision']})")
    assert not problems, "\n".join(problems)


def _arms(family: str) -> list:
    return [pytest.param(pair, id=pair.partition("~")[0]) for pair in FAMILIES[family].REPLICAS]


@pytest.mark.parametrize("pair", _arms("crossing"))
def test_crossing_replica_exact(record, bank_row, precision, pair):
    _check_replica(record("crossing", bank_row, precision), pair)


@pytest.mark.parametrize("pair", _arms("live"))
def test_live_replica_exact(record, live_row, precision, pair):
    _check_replica(record("live", live_row, precision), pair)


def test_baseline_record_reproduces(audit_record, replay, baseline_record):
    """Ledger audit (SPEC §7.4): every leaf of the saved record — trajectories, answers, cache and
    logits digests, every metric — is reproduced exactly by this run."""
    family, row, precision = (baseline_record[k] for k in ("family", "row", "precision"))
    if family == transplant.FAMILY and replay.transplant_role(replay.row(row)) not in transplant.ROLES:
        pytest.skip("not in this run's transplant panel (drawn from the selected rows' BF16 crossing, "
                    "whose records are audited)")
    result = audit_record(baseline_record)
    assert result.reproduced, (
        f"{family} row {row} ({precision}): {len(result.changes)} of {result.leaves} leaves differ from the "
        f"baseline; first: {result.changes[0]}"
        + "".join(f"; platform differs: {d}" for d in replay.baseline_differences)
    )
