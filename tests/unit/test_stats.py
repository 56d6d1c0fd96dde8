"""replaytests.outputs.stats: reference tables (docs/protocol.md §12, Newcombe 1998, scipy) with explicit tolerances."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from scipy.stats import binomtest

from replaytests.files import dumps
from replaytests.outputs.flips import ApartRow, Flips
from replaytests.outputs.stats import BootstrapCI, Proportion, as_json, mcnemar_exact, paired_bootstrap, wilson


class WilsonCase(NamedTuple):
    id: str
    k: int
    n: int
    low: float
    high: float
    tol: float  # half a unit in the last published digit


# docs/protocol.md §12 (the paper), percentages rounded to 0.1 pp (1.88% to 0.01 pp).
WILSON_PAPER = [
    WilsonCase("fp32-suffix-0/200-upper-1.88%", 0, 200, 0.0, 0.0188, 0.00005),
    WilsonCase("transplant-follows-donor-24/24", 24, 24, 0.862, 1.0, 0.0005),
    WilsonCase("transplant-controls-0/8", 0, 8, 0.0, 0.324, 0.0005),
    WilsonCase("replication-diverge-43/48", 43, 48, 0.778, 0.955, 0.0005),
    WilsonCase("replication-donor-43/43", 43, 43, 0.918, 1.0, 0.0005),
    WilsonCase("replication-controls-0/5", 0, 5, 0.0, 0.434, 0.0005),
]
# Newcombe (1998), Stat. Med. 17:857-872, Table I, method 3 (score interval without continuity correction).
WILSON_NEWCOMBE = [
    WilsonCase("81/263", 81, 263, 0.2553, 0.3662, 0.00005),
    WilsonCase("15/148", 15, 148, 0.0624, 0.1605, 0.00005),
    WilsonCase("0/20", 0, 20, 0.0, 0.1611, 0.00005),
    WilsonCase("1/29", 1, 29, 0.0061, 0.1718, 0.00005),
    WilsonCase("29/29", 29, 29, 0.8830, 1.0, 0.00005),
]


def case_params(cases):
    return [pytest.param(c, id=c.id) for c in cases]


@pytest.mark.parametrize("case", case_params(WILSON_PAPER + WILSON_NEWCOMBE))
def test_wilson_reproduces_published_intervals(case):
    p = wilson(case.k, case.n)
    assert p.ci_low == pytest.approx(case.low, abs=case.tol), f"{case.k}/{case.n}: low {p.ci_low}, expected {case.low}"
    assert p.ci_high == pytest.approx(case.high, abs=case.tol), \
        f"{case.k}/{case.n}: high {p.ci_high}, expected {case.high}"


# scipy.stats.binomtest(k, n).proportion_ci(level, method="wilson"): an independent implementation.
@pytest.mark.parametrize(("k", "n", "level"), [
    pytest.param(3, 10, 0.95, id="3/10@95"),
    pytest.param(7, 7, 0.90, id="7/7@90"),
    pytest.param(0, 1, 0.99, id="0/1@99"),
    pytest.param(166, 200, 0.95, id="166/200@95"),
    pytest.param(1, 100_000, 0.95, id="1/100000@95"),
])
def test_wilson_agrees_with_scipy(k, n, level):
    expected = binomtest(k, n).proportion_ci(level, method="wilson")
    p = wilson(k, n, level)
    assert (p.ci_low, p.ci_high) == pytest.approx((expected.low, expected.high), rel=1e-12, abs=1e-15), \
        f"{k}/{n} at {level}: ({p.ci_low}, {p.ci_high}) vs scipy ({expected.low}, {expected.high})"


# At k = 0 the Wilson upper bound reduces to z²/(n + z²) and at k = n the lower to n/(n + z²); z = 1.959963984540054.
@pytest.mark.parametrize(("k", "n", "expected"), [
    pytest.param(0, 4, {"k": 0, "n": 4, "rate": 0.0, "ci_low": 0.0, "ci_high": 0.4898908364545973, "method": "wilson"},
                 id="0/n"),
    pytest.param(4, 4, {"k": 4, "n": 4, "rate": 1.0, "ci_low": 0.5101091635454027, "ci_high": 1.0, "method": "wilson"},
                 id="n/n"),
    pytest.param(0, 0, {"k": 0, "n": 0, "rate": None, "ci_low": None, "ci_high": None, "method": "wilson"},
                 id="0/0-nulls"),
])
def test_wilson_edge_cases_to_json(k, n, expected):
    got = wilson(k, n).to_json()
    assert got.keys() == expected.keys(), f"to_json keys {sorted(got)}"
    assert got == pytest.approx(expected, abs=1e-12), f"wilson({k}, {n}).to_json() = {got}"


@pytest.mark.parametrize(("k", "n", "bound", "value"), [
    pytest.param(0, 7, "ci_low", 0.0, id="0/7-low"),
    pytest.param(7, 7, "ci_high", 1.0, id="7/7-high"),
    pytest.param(0, 100_000, "ci_low", 0.0, id="0/100000-low"),
])
def test_wilson_bound_is_exact_at_the_edges(k, n, bound, value):
    got = getattr(wilson(k, n), bound)
    assert got == value, f"wilson({k}, {n}).{bound} = {got!r}, expected exactly {value}"


def test_wilson_json_types_are_plain_python():
    got = wilson(np.int64(3), np.int64(9)).to_json()
    types = {name: type(value) for name, value in got.items()}
    assert types == {"k": int, "n": int, "rate": float, "ci_low": float, "ci_high": float, "method": str}, types


@pytest.mark.parametrize("level", [0.95, 0.9])
def test_a_proportion_keeps_its_level_which_report_json_states_once(level):
    """The object carries its level (report.json states it once, in `statistics`, not in each proportion); read back
    at that level it is the same object."""
    found = wilson(3, 9, level)
    assert found.level == level and "level" not in found.to_json(), found
    assert Proportion.from_json(found.to_json(), level) == found, found.to_json()
    assert (Proportion.from_json(found.to_json()) == found) == (level == 0.95), "the level is part of the proportion"


def test_as_json_writes_every_result_object_nested_in_a_report_and_leaves_any_other_object_to_be_refused():
    flips = Flips(4, 1, {"apart": wilson(1, 4)}, (ApartRow("r1", (0.5, 0.25)),), "incremental", 0.5, None)
    report = {"families": {"crossing": [wilson(0, 2), (mcnemar_exact(1, 0),)]}, "flips": {"bf16": flips}, "n": 3}
    assert as_json(report) == {
        "families": {"crossing": [wilson(0, 2).to_json(), [mcnemar_exact(1, 0).to_json()]]},
        "flips": {"bf16": {"rows": 4, "divergent": 1, "bins": {"apart": wilson(1, 4).to_json()},
                           "apart_rows": [{"row": "r1", "margins": [0.5, 0.25]}], "reference": "incremental",
                           "threshold": 0.5, "trigger_rate": None}}, "n": 3}, as_json(report)
    with pytest.raises(TypeError, match="not JSON serializable"):  # not a result object: never written silently
        dumps(as_json({"x": object()}))


@pytest.mark.parametrize(("args", "message"), [
    pytest.param((-1, 5), r"k must be a non-negative integer, got -1", id="negative-k"),
    pytest.param((6, 5), r"k must be at most n, got k=6, n=5", id="k-above-n"),
    pytest.param((1.5, 5), r"k must be a non-negative integer, got 1\.5", id="float-k"),
    pytest.param((1, "5"), r"n must be a non-negative integer, got '5'", id="string-n"),
    pytest.param((True, 5), r"k must be a non-negative integer, got True", id="bool-k"),
    pytest.param((1, 5, 1.0), r"level must be in \(0, 1\), got 1\.0", id="level-1"),
])
def test_wilson_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        wilson(*args)


class McNemarCase(NamedTuple):
    id: str
    b: int
    c: int
    p: float
    tol: float


# docs/protocol.md §12: live/prefill correctness (9 live-only vs 11 prefill-only) and the BF16 -> FP32 reductions
# (every discordant row diverges at BF16 only), p rounded to three significant digits.
MCNEMAR_PAPER = [
    McNemarCase("live-vs-prefill-correct-9-vs-11", 9, 11, 0.824, 0.0005),
    McNemarCase("suffix-reduction-166-vs-0", 166, 0, 2.14e-50, 0.005e-50),
    McNemarCase("answer-reduction-49-vs-0", 49, 0, 3.55e-15, 0.005e-15),
    McNemarCase("correctness-reduction-20-vs-0", 20, 0, 1.91e-6, 0.005e-6),
]


@pytest.mark.parametrize("case", case_params(MCNEMAR_PAPER))
def test_mcnemar_reproduces_paper(case):
    result = mcnemar_exact(case.b, case.c)
    assert result.p == pytest.approx(case.p, abs=case.tol), f"b={case.b}, c={case.c}: p {result.p}, paper {case.p}"


@pytest.mark.parametrize(("b", "c", "p"), [
    pytest.param(0, 0, 1.0, id="no-discordant-pairs"),
    pytest.param(5, 5, 1.0, id="balanced-capped-at-1"),
    pytest.param(1, 0, 1.0, id="one-pair"),
    pytest.param(6, 0, 0.03125, id="6-vs-0-is-2^-5"),
    pytest.param(0, 6, 0.03125, id="0-vs-6-symmetric"),
])
def test_mcnemar_small_exact_values(b, c, p):
    result = mcnemar_exact(b, c)
    assert result.p == pytest.approx(p, rel=1e-12), f"b={b}, c={c}: p {result.p}, expected {p}"


@pytest.mark.parametrize(("b", "c"), [pytest.param(3, 17, id="3-vs-17"), pytest.param(40, 25, id="40-vs-25")])
def test_mcnemar_agrees_with_scipy_binomtest(b, c):
    expected = binomtest(b, b + c, 0.5).pvalue
    assert mcnemar_exact(b, c).p == pytest.approx(expected, rel=1e-9), f"b={b}, c={c} vs scipy {expected}"


def test_mcnemar_to_json():
    assert mcnemar_exact(0, 0).to_json() == {"b": 0, "c": 0, "p": 1.0, "method": "mcnemar-exact"}


@pytest.mark.parametrize(("b", "c", "message"), [
    pytest.param(-1, 2, r"b must be a non-negative integer, got -1", id="negative-b"),
    pytest.param(2, 0.5, r"c must be a non-negative integer, got 0\.5", id="float-c"),
])
def test_mcnemar_rejects_bad_input(b, c, message):
    with pytest.raises(ValueError, match=message):
        mcnemar_exact(b, c)


def paired_rows(x_only: int, y_only: int, both: int, neither: int) -> tuple[list[int], list[int]]:
    """Paired 0/1 outcomes rebuilt from the four cell counts of a 2x2 table."""
    x = [1] * x_only + [0] * y_only + [1] * both + [0] * neither
    y = [0] * x_only + [1] * y_only + [1] * both + [0] * neither
    return x, y


class BootstrapCase(NamedTuple):
    id: str
    cells: tuple[int, int, int, int]  # x only, y only, both, neither
    diff: float
    paper: tuple[float, float]
    pinned: tuple[float, float]  # this implementation, seed 0, 10,000 resamples


# docs/protocol.md §12. Reductions BF16 -> FP32: x = diverges at BF16, y = diverges at FP32 (0 on every row).
# Exp. 1 accuracy: x = prefill correct, y = live correct (11 prefill-only, 9 live-only, 95 and 93 correct).
BOOTSTRAP_PAPER = [
    BootstrapCase("suffix-reduction-166/200", (166, 0, 0, 34), 0.83, (0.775, 0.880), (0.78, 0.88)),
    BootstrapCase("answer-reduction-49/200", (49, 0, 0, 151), 0.245, (0.185, 0.305), (0.185, 0.305)),
    BootstrapCase("correctness-reduction-20/200", (20, 0, 0, 180), 0.10, (0.060, 0.145), (0.06, 0.145)),
    BootstrapCase("prefill-minus-live-correct", (11, 9, 84, 96), 0.01, (-0.035, 0.055), (-0.035, 0.055)),
]
PAPER_TOLERANCE = 0.015  # the paper's seed is unknown: its interval is matched to within 1.5 pp


@pytest.mark.parametrize("case", case_params(BOOTSTRAP_PAPER))
def test_bootstrap_difference_is_exact(case):
    result = paired_bootstrap(*paired_rows(*case.cells))
    assert result.diff == pytest.approx(case.diff, abs=1e-12), f"{case.cells}: diff {result.diff}, paper {case.diff}"
    assert result.n == sum(case.cells), f"{case.cells}: n {result.n}"


@pytest.mark.parametrize("case", case_params(BOOTSTRAP_PAPER))
def test_bootstrap_interval_is_near_the_papers(case):
    result = paired_bootstrap(*paired_rows(*case.cells))
    got = (result.ci_low, result.ci_high)
    assert got == pytest.approx(case.paper, abs=PAPER_TOLERANCE), f"{case.cells}: CI {got}, paper {case.paper}"


@pytest.mark.parametrize("case", case_params(BOOTSTRAP_PAPER))
def test_bootstrap_seeded_interval_is_pinned(case):
    result = paired_bootstrap(*paired_rows(*case.cells), seed=0, resamples=10_000)
    got = (result.ci_low, result.ci_high)
    assert got == pytest.approx(case.pinned, abs=1e-12), f"{case.cells}: seeded CI {got}, pinned {case.pinned}"


def test_bootstrap_swapping_x_and_y_negates_the_difference():
    x, y = paired_rows(11, 9, 84, 96)
    forward, backward = paired_bootstrap(x, y), paired_bootstrap(y, x)
    assert backward.diff == pytest.approx(-forward.diff, abs=1e-12), f"{backward.diff} vs {forward.diff}"
    assert (backward.ci_low, backward.ci_high) == pytest.approx((-0.055, 0.035), abs=1e-12), \
        f"live - prefill CI ({backward.ci_low}, {backward.ci_high})"


def test_bootstrap_same_seed_same_interval():
    x, y = paired_rows(30, 12, 50, 108)
    first, second = paired_bootstrap(x, y, seed=7), paired_bootstrap(x, y, seed=7)
    assert first == second, f"seed 7 twice: {first} vs {second}"


def test_bootstrap_matches_naive_row_resampling():
    # The multinomial shortcut must give the distribution of resampling row indices directly.
    x, y = paired_rows(30, 12, 50, 108)
    d = np.array(x) - np.array(y)
    rng = np.random.default_rng(123)
    means = d[rng.integers(0, len(d), size=(20_000, len(d)))].mean(axis=1)
    naive = np.quantile(means, [0.025, 0.975])
    result = paired_bootstrap(x, y, seed=1, resamples=20_000)
    assert (result.ci_low, result.ci_high) == pytest.approx(tuple(naive), abs=0.0051), \
        f"multinomial CI ({result.ci_low}, {result.ci_high}) vs row resampling {naive}"


@pytest.mark.parametrize(("x", "y", "expected"), [
    pytest.param([], [], BootstrapCI(None, None, None, 0, 10_000, 0), id="empty-is-null"),
    pytest.param([1, 1, 1], [0, 0, 0], BootstrapCI(1.0, 1.0, 1.0, 0, 10_000, 3), id="constant-difference"),
    pytest.param([True, False], [True, False], BootstrapCI(0.0, 0.0, 0.0, 0, 10_000, 2), id="booleans-identical"),
])
def test_bootstrap_edge_cases(x, y, expected):
    assert paired_bootstrap(x, y) == expected, f"paired_bootstrap({x}, {y})"


def test_bootstrap_to_json_carries_seed_and_resamples():
    got = paired_bootstrap([1, 0], [0, 0], seed=5, resamples=100).to_json()
    assert {k: got[k] for k in ("seed", "resamples", "n", "level", "method")} == {
        "seed": 5, "resamples": 100, "n": 2, "level": 0.95, "method": "paired-percentile-bootstrap"}, got


@pytest.mark.parametrize(("x", "y", "kwargs", "message"), [
    pytest.param([1, 0], [1], {}, r"x and y must pair the same rows, got lengths 2 and 1", id="unequal-lengths"),
    pytest.param([1, 2], [1, 0], {}, r"x must be a flat sequence of 0/1 values, got \[2\]", id="non-binary"),
    pytest.param([1], [0.5], {}, r"y must be a flat sequence of 0/1 values, got \[0\.5\]", id="fraction"),
    pytest.param([1], [0], {"resamples": 0}, r"resamples must be at least 1, got 0", id="zero-resamples"),
])
def test_bootstrap_rejects_bad_input(x, y, kwargs, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(x, y, **kwargs)
