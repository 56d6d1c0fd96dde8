"""Shared helpers of the conformance modules: turning ledger records into assertions."""

from __future__ import annotations

import pytest


def comparison(record: dict, pair: str) -> dict:
    """The named comparison of a record; a row excluded by a fail-closed check fails here."""
    if record["status"] != "ok":
        pytest.fail(f"{record['family']} row {record['row']} ({record['precision']}) excluded: {record['reason']}",
                    pytrace=False)
    return record["comparisons"][pair]


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
