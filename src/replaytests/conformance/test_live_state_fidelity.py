"""Layer 3, live-state fidelity: does a reconstruction preserve the state the live decoder reached?

live vs incremental must be bit-exact (bridge). live or incremental vs prefill may differ where the
contract allows it (BF16): such a divergence is recorded as an expected failure with its details,
and it fails where the contract says the precision is exact (FP32). Batch composition (pair vs
singleton) is judged the same way.
"""

import pytest

from replaytests.conformance.helpers import comparison, judge_divergence, state_differences
from replaytests.families import batch

pytestmark = pytest.mark.fidelity


def test_bridge_live_equals_incremental(record, panel_row, precision):
    pair = "live~incremental"
    metrics = comparison(record("bridge", panel_row, precision), pair)
    problems = state_differences(metrics, pair, f"bridge row {panel_row.id} ({precision})")
    assert not problems, "\n".join(problems)


def test_incremental_vs_prefill_suffix(record, replay, bank_row, precision):
    judge_divergence(replay, record("crossing", bank_row, precision), "incremental~prefill", precision)


def test_live_vs_prefill_suffix(record, replay, live_row, precision):
    judge_divergence(replay, record("live", live_row, precision), "live~prefill", precision)


@pytest.mark.parametrize("pair", [pytest.param(p, id=p.partition("_")[0]) for p in batch.HEADLINE])
def test_batch_pair_vs_singleton_suffix(record, replay, panel_row, precision, pair):
    judge_divergence(replay, record("batch", panel_row, precision), pair, precision)
