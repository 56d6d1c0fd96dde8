"""Shared helpers of the conformance modules: turning ledger records and judgements into test outcomes."""

from __future__ import annotations

import pytest

from replaytests.inputs.gates import Judgement


def ok(record: dict) -> dict:
    """The record itself; a row excluded by a fail-closed check fails the test that reads it."""
    if record["status"] != "ok":
        pytest.fail(f"{record['family']} row {record['row']} ({record['precision']}) excluded: {record['reason']}",
                    pytrace=False)
    return record


def judge(*judgements: Judgement) -> None:
    """Pass when every judgement passes; fail naming every failing one; else an expected failure
    carrying every recorded finding (data the contract allows, or platform drift)."""
    failed = [j.message for j in judgements if j.outcome == "fail"]
    if failed:
        pytest.fail("\n".join(failed), pytrace=False)
    recorded = [j.message for j in judgements if j.outcome == "recorded"]
    if recorded:
        pytest.xfail("; ".join(recorded))
