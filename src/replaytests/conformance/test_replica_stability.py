"""Layer 1, replica stability: two executions of the same construction are bit-exact, within a run
(replica arms) and across runs (the ledger audit against a saved baseline)."""

import pytest

from replaytests.conformance.helpers import audit_against_baseline, judge, ok
from replaytests.inputs.gates import same_platform

pytestmark = pytest.mark.replica


def test_replica_exact(record, replay, cell, replica_family, replica_row, replica_pair):
    """Every family that names this layer (the registry's `layers`), each of its replica pairs (`X~X_replica`): the
    same construction built twice — the same cache, boundary logits and suffix, bit for bit; a conversation's at
    every turn, an edge sweep's at every point."""
    judge(replay.contract.gates.replicas_at_every_step(ok(record(replica_family, replica_row, cell)), replica_pair))


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
