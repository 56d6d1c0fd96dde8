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


def test_live_generation_refreezes_bank_row(record, replay, bridge_row, precision):
    """At the bank's precision and caps, generating the row live again must give the same z."""
    frozen = replay.manifest["contract"]
    if precision != replay.manifest["precision"] or frozen["caps"] != vars(replay.contract.caps):
        pytest.skip(f"bank frozen at {replay.manifest['precision']} with caps {frozen['caps']}; "
                    f"this run is {precision} with caps {vars(replay.contract.caps)}")
    result = record("bridge", bridge_row, precision)
    if result["status"] != "ok":
        pytest.fail(f"bridge row {bridge_row.id} ({precision}) excluded: {result['reason']}", pytrace=False)
    assert result["z_matches_bank"], (
        f"bridge row {bridge_row.id} ({precision}): live generation reached a different z "
        f"({result['prefix_len']} tokens) than the frozen bank row ({bridge_row.prefix_len} tokens)"
    )
