"""Layer 3, live-state fidelity: does a reconstruction preserve the state the live decoder reached?

live vs incremental must be bit-exact (bridge, gates.bridge.exact). live or incremental vs prefill
may differ where the contract allows it (BF16): such a divergence is recorded as an expected failure
with its details, and it fails where the contract says the cell is exact (FP32). Batch
composition (pair vs singleton) is judged the same way, and so is each construction of a serving
engine (prefix hit, fresh, chunked and batched prefill), once its premise holds.

A rollout's teacher-forced replay on the live schedule must reproduce every live log-probability bit for bit
(the control: without it no mismatch below means anything); the trainer's recompute (one prefill call) is
judged against the contract's rollout bounds, and recorded where it sets none.
"""

import pytest

from replaytests.conformance.helpers import judge, ok
from replaytests.families.registry import FAMILIES, SWEEP_HEADLINE

pytestmark = pytest.mark.fidelity


def test_bridge_live_equals_incremental(record, replay, panel_row, cell):
    judge(replay.contract.gates.control(ok(record("bridge", panel_row, cell))))


def test_incremental_vs_prefill_suffix(record, replay, bank_row, cell):
    judge(replay.contract.gates.divergence(ok(record("crossing", bank_row, cell)), "incremental~prefill"))


def test_live_vs_prefill_suffix(record, replay, live_row, cell):
    judge(replay.contract.gates.divergence(ok(record("live", live_row, cell)), "live~prefill"))


@pytest.mark.parametrize("pair", [pytest.param(p, id=p.partition("_")[0]) for p in FAMILIES["batch"].headline])
def test_batch_pair_vs_singleton_suffix(record, replay, batch_row, cell, pair):
    judge(replay.contract.gates.divergence(ok(record("batch", batch_row, cell)), pair))


@pytest.mark.parametrize("pair", [pytest.param(p, id=p.replace("~", "-vs-")) for p in FAMILIES["serving"].headline])
def test_serving_construction_vs_live(record, replay, serving_row, cell, pair):
    """A serving engine's reconstruction (prefix hit, fresh prefill, chunked, batched) against the live
    request or the fresh prefill, judged only where the engine's counters show the premise held."""
    result = ok(record("serving", serving_row, cell))
    gates = replay.contract.gates
    judge(gates.served(result, pair), gates.divergence(result, pair))


def test_rollout_teacher_forcing_equals_live(record, replay, rollout_row, cell):
    judge(replay.contract.gates.control(ok(record("rollout", rollout_row, cell))))


def test_rollout_sampled_teacher_forcing_equals_live(record, replay, rollout_row, cell):
    judge(replay.contract.gates.control(ok(record("rollout_sampled", rollout_row, cell))))


def test_rollout_trainer_recompute(record, replay, rollout_row, cell):
    judge(replay.contract.gates.rollout_recompute(ok(record("rollout", rollout_row, cell))))


def test_rollout_sampled_trainer_recompute(record, replay, rollout_row, cell):
    judge(replay.contract.gates.rollout_recompute(ok(record("rollout_sampled", rollout_row, cell))))


def test_conversation_control(record, replay, conversation_row, cell):
    judge(replay.contract.gates.conversation_control(ok(record("conversation", conversation_row, cell))))


@pytest.mark.parametrize("pair", ["session~replay", "session~incremental", "session~rerendered"])
def test_conversation_turns(record, replay, conversation_row, cell, pair):
    """Turn k of a cached chat against the same turn rebuilt: one call over the token history, one token per
    call, or the messages rendered and tokenized again."""
    judge(replay.contract.gates.conversation_turns(ok(record("conversation", conversation_row, cell)), pair))


def test_conversation_rerendered_ids(record, replay, conversation_row, cell):
    judge(replay.contract.gates.conversation_rerendered(ok(record("conversation", conversation_row, cell))))


def test_sweep_reference_vs_edge(record, replay, sweep_row, cell):
    """At every point of the edge sweep, the continuation from the edge construction against the reference's:
    a divergence is recorded where the contract allows the cell to diverge (gate sweep.suffix_divergence_allowed),
    a failure where it does not."""
    judge(replay.contract.gates.sweep_divergence(ok(record("sweep", sweep_row, cell)), SWEEP_HEADLINE))


def test_sweep_premise(record, replay, sweep_row, cell):
    """At every point of the edge sweep, the engine's own counters: each arm counted what the construction it names
    requires (else the measurement is broken: a failure), and the point crossed its edge (a hit that read the blocks,
    a prefill in more than one chunk: else vacuous, recorded with the engine's numbers, never a pass)."""
    judge(replay.contract.gates.sweep_premise(ok(record("sweep", sweep_row, cell))))
