"""What the controller gathers from the test reports (its own, or the xdist workers'): the outcomes, the
failures, the skip reasons, and the key facts of each record and audit a test read (suite.properties)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from replaytests.outputs.records import Record
from replaytests.outputs.verdict import Failure


@dataclass
class Gathered:
    """What the test reports brought back (from this process or from xdist workers)."""

    records: list[Record] = field(default_factory=list)  # the run's records (read from its directory at the end)
    computed: int = 0  # records its processes computed and appended (more than `records`: some computed twice)
    facts: list[dict] = field(default_factory=list)  # the key facts of each record a test read (properties.facts)
    audits: list[dict] = field(default_factory=list)  # {key, leaves, changes} per audited baseline record
    outcomes: dict[str, int] = field(default_factory=dict)  # pytest outcome -> count
    failures: list[Failure] = field(default_factory=list)  # verdict.failure of each failing test
    skips: set[str] = field(default_factory=set)  # the distinct skip reasons

    def add(self, properties: list[tuple[str, str]], record_property: str, audit_property: str) -> None:
        self.facts += [json.loads(v) for n, v in properties if n == record_property]
        self.audits += [json.loads(v) for n, v in properties if n == audit_property]

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
