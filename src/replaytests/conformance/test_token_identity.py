"""Layer 2, token identity: every arm consumed the bank row's integer tokens and roles, at every
cell, and live generation at the bank's cell and caps re-freezes the same z (a check on
the platform the bank was frozen on; elsewhere its finding is platform drift)."""

import pytest

from replaytests.conformance.helpers import judge, ok
from replaytests.families import sweep
from replaytests.families.skeleton import other_z
from replaytests.inputs.gates import same_platform
from replaytests.outputs.records import Record

pytestmark = pytest.mark.token_identity


def _check_consumes_bank_row(result: Record, row) -> None:
    problem = other_z(ok(result), row)
    assert problem is None, problem


def test_crossing_arms_consume_bank_row(record, bank_row, cell):
    _check_consumes_bank_row(record("crossing", bank_row, cell), bank_row)


def test_batch_arms_consume_bank_row(record, batch_row, cell):
    _check_consumes_bank_row(record("batch", batch_row, cell), batch_row)


def test_bank_made_on_this_platform(replay):
    """The bank's live boundaries are a check only where its platform is this run's (else platform drift)."""
    judge(same_platform("bank", replay.bank_platform, replay.options.strict_contract))


def test_live_generation_refreezes_bank_row(record, replay, live_row, cell):
    """At the bank's cell, caps and cache class, generating the row live again must give the same z."""
    if not replay.refreezes(cell):
        frozen, here = replay.frozen_with(), replay.run_with(cell)
        differ = "; ".join(f"{key} {frozen[key]} (bank) vs {here[key]} (run)" for key in frozen
                           if frozen[key] != here[key])
        pytest.skip(f"the bank was frozen with other settings: {differ}")
    result = ok(record("live", live_row, cell))
    difference = result.z_first_difference
    problem = None if result.z_matches_bank else (
        f"live row {live_row.id} ({cell}): live generation reached a different z than the frozen bank row: "
        f"first difference at token index {difference.index}: live {difference.live}, bank "
        f"{difference.bank} ({result.prefix_len} and {live_row.prefix_len} tokens)")
    judge(replay.judge_against_bank(problem))


def test_sweep_arms_consume_row_prefix(record, sweep_row, cell):
    """At every point of the edge sweep, every arm consumed the row's first tokens, as many as the point names."""
    problem = sweep.other_tokens(ok(record("sweep", sweep_row, cell)), sweep_row)
    assert problem is None, problem
