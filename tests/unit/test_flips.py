"""outputs.flips: each flip binned by its margins, the clear-margin rows named, and the threshold a
margin-triggered verifier needs with its trigger rate. Hand-built records (no model)."""

from __future__ import annotations

import pytest
from test_report import comparison, record, typed

from replaytests.outputs.flips import ApartRow, bf16_step, bin_of, flips, pair_flips
from replaytests.outputs.records import Record

PAIR = "incremental~prefill"


@pytest.mark.parametrize(("value", "step"), [
    pytest.param(1.0, 2.0 ** -7, id="one"), pytest.param(10.0, 2.0 ** -4, id="ten"),
    pytest.param(-10.0, 2.0 ** -4, id="negative"), pytest.param(0.75, 2.0 ** -8, id="below-one"),
    pytest.param(0.0, 0.0, id="zero"),
])
def test_one_bf16_step_is_two_to_the_minus_seven_of_the_binade(value, step):
    assert bf16_step(value) == step, f"bf16_step({value})"


@pytest.mark.parametrize(("margins", "top1", "expected"), [
    pytest.param([0.0, 0.5], [10.0, 10.0], "tie", id="tie-in-one"),
    pytest.param([0.0625, 0.5], [10.0, 10.0], "bf16_step", id="one-step-in-one"),
    pytest.param([0.125, 0.5], [10.0, 10.0], "apart", id="two-steps"),
    pytest.param([0.125, 0.25], None, "unknown", id="older-ledger"),
    pytest.param([0.0, 0.25], None, "tie", id="older-ledger-tie"),
])
def test_a_flip_is_binned_by_its_margins(margins, top1, expected):
    assert bin_of(margins, top1) == expected, f"margins {margins}, top-1 logits {top1}"


def _crossing(row: str, margins: list | None = None, top1: list | None = None, steps: list | None = None) -> Record:
    diverged = margins is not None
    c = comparison(suffix_equal=not diverged, first_divergence=3 if diverged else None)
    c |= {"margins_at_divergence": margins, "top1_at_divergence": top1}
    r = record("crossing", row, "bf16", {PAIR: c})
    for arm in r["arms"].values():
        arm["margins"] = steps if steps is not None else [1.0, 2.0, None, 3.0]
    return Record.of(r)


def test_flips_name_the_clear_rows_and_the_verifier_threshold_and_rate():
    records = [_crossing("r0", [0.0, 0.25], [8.0, 8.0]), _crossing("r1", [0.5, 0.5], [8.0, 8.0]),
               _crossing("r2", [0.03125, 0.5], [8.0, 8.0]), _crossing("r3")]
    found = pair_flips(records, PAIR)
    assert found.divergent == 3 and found.rows == 4, found
    assert {name: b.k for name, b in found.bins.items()} == {"tie": 1, "bf16_step": 1, "apart": 1,
                                                             "unknown": 0}, found.bins
    assert found.apart_rows == (ApartRow("r1", (0.5, 0.5)),), found.apart_rows
    # the largest margin at which the reference (incremental) flipped: 0.5; steps with a choice at or
    # below it: none of 1.0, 2.0, 3.0 on any of the 4 rows (the forced step, null, is not counted)
    assert found.threshold == 0.5 and (found.trigger_rate.k, found.trigger_rate.n) == (0, 12)


def test_no_divergence_no_flips_and_an_older_ledger_has_no_trigger_rate():
    assert flips([_crossing("r0"), _crossing("r1")], {"crossing": (PAIR,)}) == {}
    older = _crossing("r0", [0.0, 0.25]).to_json() | {"schema": "replaytests.ledger/3"}  # before margins (4)
    del older["cell_digest"]
    for arm in older["arms"].values():
        del arm["margins"]
    del older["comparisons"][PAIR]["top1_at_divergence"]
    assert pair_flips(typed([older]), PAIR).trigger_rate is None
