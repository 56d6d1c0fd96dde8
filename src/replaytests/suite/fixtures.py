"""The fixtures the conformance tests ask for: `replay` (the session), `record` (a record, computed once
by the session) and `audit_record` (a baseline record audited against this run's). A test's report
carries what it read: each record's key facts and each audit's counts as user_properties (the
collector turns them into the progress line and JUnit XML properties), the metrics it judged in the
test's stash (pytest-json-report's metadata). suite.plugin registers this module as a plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from replaytests.files import dumps
from replaytests.outputs import audit
from replaytests.outputs.records import Record
from replaytests.suite.properties import facts
from replaytests.suite.state import replay_session

if TYPE_CHECKING:
    from replaytests.suite.session import ReplaySession

RECORD_PROPERTY = "replaytests_record"
AUDIT_PROPERTY = "replaytests_audit"
METRICS_KEY = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def replay(request: pytest.FixtureRequest) -> ReplaySession:
    return replay_session(request.config)


@pytest.fixture
def record(replay: ReplaySession, request: pytest.FixtureRequest):
    """record(family, row, cell) -> the ledger record (the session computes it and appends it to the
    run's records); its key facts ride on this test's report (progress, JUnit XML properties)."""
    from replaytests.outputs import summary

    def get(family: str, row, cell: str) -> Record:
        result = replay.record(family, row, cell)
        request.node.user_properties.append((RECORD_PROPERTY, dumps(facts(result))))
        request.node.stash.setdefault(METRICS_KEY, []).append(summary.metrics(result))
        return result

    return get


@pytest.fixture
def audit_record(replay: ReplaySession, record, request: pytest.FixtureRequest):
    """audit_record(baseline) -> the Audit of that saved record against this run's recomputation."""

    def get(baseline: Record) -> audit.Audit:
        family, row, cell = baseline.key
        result = audit.audit_record(baseline, record(family, replay.row(row), cell))
        request.node.user_properties.append((AUDIT_PROPERTY, dumps(
            {"key": [family, row, cell], "leaves": result.leaves, "changes": len(result.changes)})))
        return result

    return get
