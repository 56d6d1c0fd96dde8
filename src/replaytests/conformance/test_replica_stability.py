"""Layer 1, replica stability: two executions of the same construction are bit-exact."""

import pytest

from replaytests.conformance.helpers import comparison, state_differences

pytestmark = pytest.mark.replica


@pytest.mark.parametrize("construction", ["incremental", "prefill"])
def test_replica_exact(record, bank_row, precision, construction):
    pair = f"{construction}~{construction}_replica"
    metrics = comparison(record("crossing", bank_row, precision), pair)
    problems = state_differences(metrics, pair, f"row {bank_row.id} ({precision})")
    assert not problems, "\n".join(problems)
