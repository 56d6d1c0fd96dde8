"""Layer 1, replica stability: two executions of the same construction are bit-exact, within a run
(replica arms) and across runs (the ledger audit against a saved baseline)."""

import pytest

from replaytests.conformance.helpers import audit_against_baseline, judge, ok
from replaytests.families.registry import FAMILIES
from replaytests.inputs.gates import same_platform

pytestmark = pytest.mark.replica


def _arms(family: str) -> list:
    return [pytest.param(pair, id=pair.partition("~")[0]) for pair in FAMILIES[family].replicas]


@pytest.mark.parametrize("pair", _arms("crossing"))
def test_crossing_replica_exact(record, replay, bank_row, cell, pair):
    judge(replay.contract.gates.replicas(ok(record("crossing", bank_row, cell)), pair))


@pytest.mark.parametrize("pair", _arms("live"))
def test_live_replica_exact(record, replay, live_row, cell, pair):
    judge(replay.contract.gates.replicas(ok(record("live", live_row, cell)), pair))


@pytest.mark.parametrize("pair", _arms("serving"))
def test_serving_replica_exact(record, replay, serving_row, cell, pair):
    judge(replay.contract.gates.replicas(ok(record("serving", serving_row, cell)), pair))


def test_baseline_made_on_this_platform(replay):
    """The baseline's numbers are a check only where its platform is this run's (else platform drift)."""
    if replay.options.baseline_ledger is None:
        pytest.skip("no baseline ledger: pass --baseline LEDGER")
    judge(same_platform("baseline", replay.baseline_platform, replay.options.strict_contract))


def test_baseline_record_reproduces(audit_record, replay, baseline_record):
    """Ledger audit: every leaf of the saved record — trajectories, answers, cache and logits digests,
    every metric — is reproduced exactly by this run (gates.audit.reproduce). The causal families'
    records are audited in their own layer (test_causal_sufficiency)."""
    audit_against_baseline(audit_record, replay, baseline_record)


@pytest.mark.parametrize("pair", _arms("rollout"))
def test_rollout_replica_exact(record, replay, rollout_row, cell, pair):
    """A greedy rollout decoded twice, and each replay of it run twice: the same tokens, log-probabilities,
    cache over z + response and next-token logits, bit for bit."""
    judge(replay.contract.gates.replicas(ok(record("rollout", rollout_row, cell)), pair))


@pytest.mark.parametrize("pair", _arms("rollout_sampled"))
def test_rollout_sampled_replica_exact(record, replay, rollout_row, cell, pair):
    """A sampled rollout drawn twice with the row's seed, and each replay of it run twice: bit for bit."""
    judge(replay.contract.gates.replicas(ok(record("rollout_sampled", rollout_row, cell)), pair))


@pytest.mark.parametrize("pair", _arms("conversation"))
def test_conversation_replica_exact(record, replay, conversation_row, cell, pair):
    """Each construction of every turn of a conversation built twice (the session decoding its assistant turns
    live both times): the same cache, next-token logits and assistant turn, bit for bit."""
    judge(replay.contract.gates.conversation_replicas(ok(record("conversation", conversation_row, cell)), pair))


@pytest.mark.parametrize("pair", _arms("sweep"))
def test_sweep_replica_exact(record, replay, sweep_row, cell, pair):
    """At every point of every axis the backend sweeps, each construction built twice: the same cache, logits and
    continuation, bit for bit."""
    judge(replay.contract.gates.sweep_replicas(ok(record("sweep", sweep_row, cell)), pair))
