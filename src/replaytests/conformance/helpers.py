"""Shared helpers of the conformance modules: turning ledger records and judgements into test outcomes."""

from __future__ import annotations

import pytest

from replaytests.families.registry import FAMILIES, ROLES
from replaytests.inputs.gates import Judgement
from replaytests.outputs.records import Record
from replaytests.suite.baseline import judge_against_baseline


def ok(record: Record) -> Record:
    """The record itself; a row excluded by a fail-closed check fails the test that reads it."""
    if not record.ok:
        pytest.fail(f"{record.title} excluded: {record.reason}", pytrace=False)
    return record


def audit_against_baseline(audit_record, replay, baseline_record: Record) -> None:
    """Every leaf of a saved record reproduced by this run (gates.audit.reproduce); a transplant record of
    a row outside this run's panel is skipped."""
    family, row, cell = baseline_record.key
    if (reads := FAMILIES[family].reads) and replay.role(family, replay.row(row), cell) not in ROLES:
        pytest.skip(f"not in this run's {family} panel (drawn from the selected rows' {cell} {' and '.join(reads)} "
                    "records, which are audited)")
    result = audit_record(baseline_record)
    moved = result.trajectory_changes
    problem = None if result.reproduced else (
        f"{baseline_record.title}: {len(result.changes)} of {result.leaves} leaves differ from the "
        f"baseline, {f'{len(moved)} of a trajectory' if moved else 'bits only (no trajectory changed)'}; "
        f"first: {(moved or result.changes)[0]}")
    judge(judge_against_baseline(replay, problem, "trajectories" if moved else "bits", cell))


def judge(*judgements: Judgement) -> None:
    """Pass when every judgement passes; fail naming every failing one; else an expected failure
    carrying every recorded finding (data the contract allows, or platform drift)."""
    failed = [j.message for j in judgements if j.outcome == "fail"]
    if failed:
        pytest.fail("\n".join(failed), pytrace=False)
    recorded = [j.message for j in judgements if j.outcome == "recorded"]
    if recorded:
        pytest.xfail("; ".join(recorded))
