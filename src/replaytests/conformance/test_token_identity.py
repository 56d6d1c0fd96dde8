"""Layer 2, token identity: every arm consumed the bank row's integer tokens and roles."""

import pytest

from replaytests.families.crossing import ARMS, z_digest

pytestmark = pytest.mark.token_identity


def test_arms_consume_bank_row(record, bank_row, precision):
    result = record("crossing", bank_row, precision)
    if result["status"] != "ok":
        pytest.fail(f"row {bank_row.id} ({precision}) excluded: {result['reason']}", pytrace=False)
    expected = z_digest(bank_row.tokens, bank_row.roles)
    wrong = {arm: result["arms"][arm]["z_sha256"] for arm in ARMS if result["arms"][arm]["z_sha256"] != expected}
    assert not wrong, f"row {bank_row.id} ({precision}): arms {sorted(wrong)} consumed a z other than the bank row's"
