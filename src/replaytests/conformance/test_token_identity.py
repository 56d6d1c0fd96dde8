"""Layer 2, token identity: every arm consumed the bank row's integer tokens and roles, at every
precision, and live generation at the bank's precision and caps re-freezes the same z."""

import pytest

from replaytests.conformance.helpers import ok
from replaytests.families import FAMILIES
from replaytests.families.crossing import z_digest

pytestmark = pytest.mark.token_identity


def _check_consumes_bank_row(result: dict, row) -> None:
    expected = z_digest(row.tokens, row.roles)
    arms = ok(result)["arms"]
    wrong = sorted(arm for arm in FAMILIES[result["family"]].ARMS if arms[arm]["z_sha256"] != expected)
    assert not wrong, (f"{result['family']} row {row.id} ({result['precision']}): arms {wrong} consumed a z "
                       f"other than the bank row's")


def test_crossing_arms_consume_bank_row(record, bank_row, precision):
    _check_consumes_bank_row(record("crossing", bank_row, precision), bank_row)


def test_batch_arms_consume_bank_row(record, panel_row, precision):
    _check_consumes_bank_row(record("batch", panel_row, precision), panel_row)


def test_live_generation_refreezes_bank_row(record, replay, live_row, precision):
    """At the bank's precision and caps, generating the row live again must give the same z."""
    frozen = replay.manifest["contract"]
    if precision != replay.manifest["precision"] or frozen["caps"] != vars(replay.contract.caps):
        pytest.skip(f"bank frozen at {replay.manifest['precision']} with caps {frozen['caps']}; "
                    f"this run is {precision} with caps {vars(replay.contract.caps)}")
    result = ok(record("live", live_row, precision))
    assert result["z_matches_bank"], (
        f"live row {live_row.id} ({precision}): live generation reached a different z "
        f"({result['prefix_len']} tokens) than the frozen bank row ({live_row.prefix_len} tokens)"
    )
