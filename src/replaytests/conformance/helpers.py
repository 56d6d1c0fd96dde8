"""Shared helpers of the conformance modules: turning ledger records into assertions."""

from __future__ import annotations

import pytest


def ok(record: dict) -> dict:
    """The record itself; a row excluded by a fail-closed check fails the test that reads it."""
    if record["status"] != "ok":
        pytest.fail(f"{record['family']} row {record['row']} ({record['precision']}) excluded: {record['reason']}",
                    pytrace=False)
    return record


def comparison(record: dict, pair: str) -> dict:
    return ok(record)["comparisons"][pair]


def state_differences(metrics: dict, pair: str, where: str) -> list[str]:
    """One line per boundary or suffix quantity that is not bit-exact."""
    problems = []
    if not metrics["cache_exact"]:
        problems.append(f"{where}: {pair} caches differ (K rel L2 {metrics['k_rel_l2']:.3g}, max |dK| "
                        f"{metrics['k_max_abs']:.3g}; V rel L2 {metrics['v_rel_l2']:.3g}, max |dV| "
                        f"{metrics['v_max_abs']:.3g})")
    if not metrics["logits_exact"]:
        problems.append(f"{where}: {pair} boundary logits differ (max |d| {metrics['logits_max_abs']:.3g})")
    if not metrics["suffix_equal"]:
        problems.append(f"{where}: {pair} suffixes diverge at suffix index {metrics['first_divergence']} "
                        f"(top-1 minus top-2 margins {metrics['margins_at_divergence']})")
    return problems


def judge_divergence(replay, record: dict, pair: str, precision: str) -> None:
    """Pass when the pair's suffixes agree. A divergence the contract allows at this precision is
    recorded as an expected failure with its details; one it forbids fails the test."""
    metrics = comparison(record, pair)
    if metrics["suffix_equal"]:
        return
    margins = metrics["margins_at_divergence"]
    a, b = pair.split("~")
    detail = (
        f"{record['family']} row {record['row']} ({precision}): {a} and {b} suffixes diverge at suffix index "
        f"{metrics['first_divergence']} (top-1 minus top-2 margins {margins[0]:.3g} / {margins[1]:.3g}); "
        f"answers {'equal' if metrics['answer_equal'] else 'differ'}; boundary K rel L2 {metrics['k_rel_l2']:.3g}"
    )
    contract = replay.contract
    if replay.divergence_allowed(record["family"], precision):
        pytest.xfail(f"divergence recorded, allowed by contract {contract.name}: {detail}")
    pytest.fail(f"{detail}; contract {contract.name} requires {precision} {record['family']} suffixes to be exact",
                pytrace=False)
