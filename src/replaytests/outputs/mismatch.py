"""The training-inference mismatch of rollouts (docs/rollouts.md, docs/ledger.md "Rollout measures"): per token t
of a response, the engine's live log-probability `live(t)` beside the recomputed `replay(t)` (log-softmax of the
step's logits in FP32 over the full vocabulary), `d(t) = replay(t) - live(t)` and `r(t) = exp(d(t))`.

Pure functions of numbers (numpy, no torch), results as frozen types whose `to_json()` the report holds.
Per row and per run: tokens bitwise equal; |d| max, median, 99th percentile (numpy's linear interpolation,
Hyndman & Fan type 7); the k3 estimate of KL(live || replay), the mean of r - 1 - log r (Schulman 2020,
"Approximating KL divergence"); the share of tokens with r outside the bounds; the first position where |d|
exceeds the threshold. Run-level means and shares carry intervals that resample rows, not tokens
(stats.cluster_bootstrap, seeded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from replaytests.outputs import stats

WORST = 10  # tokens the report lists, by |d|


@dataclass(frozen=True)
class Thresholds:
    """What a token may do before the report names it: r within [ratio_low, ratio_high] (verl's rollout
    importance-sampling truncation bounds are of this kind) and |d| at most `delta` nats. Options for now
    (`--ratio-bounds`, `--delta-threshold`); contract keys later."""

    ratio_low: float = 0.5
    ratio_high: float = 2.0
    delta: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.ratio_low <= 1 <= self.ratio_high < math.inf:
            raise ValueError(f"ratio bounds must hold 1, 0 < low <= 1 <= high, got [{self.ratio_low}, "
                             f"{self.ratio_high}]")
        if not 0 <= self.delta < math.inf:
            raise ValueError(f"the |delta logp| threshold must be 0 or more, got {self.delta}")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Scored:
    """One row's response tokens with both log-probabilities: live as the dump holds it (float64), replay as
    the recompute gave it (float32)."""

    row: str
    tokens: np.ndarray
    live: np.ndarray
    replay: np.ndarray

    def delta(self) -> np.ndarray:
        return self.replay.astype(np.float64) - self.live


@dataclass(frozen=True)
class RowMeasures:
    row: str
    tokens: int
    bitwise_equal: int
    abs_delta_max: float
    abs_delta_median: float
    abs_delta_p99: float
    k3: float  # mean of r - 1 - log r over the row's tokens
    outside_bounds: int  # tokens with r outside [ratio_low, ratio_high]
    first_exceeding: int | None  # first position with |d| > delta; None where none

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Worst:
    row: str
    position: int
    token: int
    live: float
    replay: float
    delta: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunMeasures:
    rows: tuple[RowMeasures, ...]
    tokens: int
    bitwise_equal: stats.ClusterInterval  # share of tokens
    abs_delta_mean: stats.ClusterInterval
    k3: stats.ClusterInterval
    outside_bounds: stats.ClusterInterval  # share of tokens
    abs_delta_max: float
    abs_delta_median: float
    abs_delta_p99: float
    rows_exceeding: stats.Proportion  # rows with a token past the |d| threshold (Wilson: rows are independent)
    worst: tuple[Worst, ...]
    thresholds: Thresholds

    def to_json(self) -> dict:
        return {"rows": len(self.rows), "tokens": self.tokens,
                "tokens_bitwise_equal": sum(m.bitwise_equal for m in self.rows),
                "bitwise_equal": self.bitwise_equal.to_json(),
                "abs_delta_mean": self.abs_delta_mean.to_json(), "k3": self.k3.to_json(),
                "outside_bounds": self.outside_bounds.to_json(), "abs_delta_max": self.abs_delta_max,
                "abs_delta_median": self.abs_delta_median, "abs_delta_p99": self.abs_delta_p99,
                "rows_exceeding": self.rows_exceeding.to_json(), "thresholds": self.thresholds.to_json(),
                "worst": [w.to_json() for w in self.worst]}

    def failures(self) -> list[str]:
        """One line per row with a token past a threshold (the gate's reasons)."""
        bounds = f"[{self.thresholds.ratio_low:g}, {self.thresholds.ratio_high:g}]"
        lines = []
        for m in self.rows:
            parts = [] if m.first_exceeding is None else [
                f"|delta logp| > {self.thresholds.delta:g} first at position {m.first_exceeding}"]
            if m.outside_bounds:
                parts.append(f"{m.outside_bounds} of {m.tokens} tokens with ratio outside {bounds}")
            lines += [f"row {m.row}: {'; '.join(parts)}"] if parts else []
        return lines


def bitwise(live: np.ndarray, replay: np.ndarray) -> np.ndarray:
    """Per token: the dump's number is the recomputed float32 exactly, bit for bit (-0.0 is not 0.0)."""
    return live.astype(np.float64).view(np.uint64) == replay.astype(np.float64).view(np.uint64)


def _each(function, d: np.ndarray) -> np.ndarray:
    """`function` of each value, computed one at a time by the C library (math), not by numpy's vector loops: numpy
    picks its float64 exp and expm1 by the CPU (AVX-512's SVML on one machine, the C library's on an AVX2 one), whose
    last bits differ, and a recorded measure may depend on the platform's pin, never on the CPU's vector units."""
    return np.fromiter((function(x) for x in d.tolist()), dtype=np.float64, count=len(d))


def k3_terms(d: np.ndarray) -> np.ndarray:
    """r - 1 - log r with r = exp(d), as expm1(d) - d (exact near d = 0, where r - 1 would cancel)."""
    return _each(math.expm1, d) - d


def outside(d: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    r = _each(math.exp, d)
    return (r < thresholds.ratio_low) | (r > thresholds.ratio_high)


def row_measures(scored: Scored, thresholds: Thresholds) -> RowMeasures:
    d = scored.delta()
    size = np.abs(d)
    over = np.flatnonzero(size > thresholds.delta)
    median, p99 = np.quantile(size, [0.5, 0.99])
    return RowMeasures(scored.row, len(d), int(bitwise(scored.live, scored.replay).sum()), float(size.max()),
                       float(median), float(p99), float(k3_terms(d).mean()), int(outside(d, thresholds).sum()),
                       int(over[0]) if len(over) else None)


def worst_tokens(scored: Sequence[Scored], count: int = WORST) -> tuple[Worst, ...]:
    """The `count` tokens of largest |d| over the run (ties: earlier row, then earlier position)."""
    found = []
    for item in scored:
        size = np.abs(item.delta())
        for position in np.argsort(-size, kind="stable")[:count]:
            found.append((-size[position], len(found), item, int(position)))
    found.sort(key=lambda entry: entry[:2])
    return tuple(Worst(item.row, position, int(item.tokens[position]), float(item.live[position]),
                       float(item.replay[position]), float(item.replay[position]) - float(item.live[position]))
                 for _, _, item, position in found[:count])


def run_measures(scored: Sequence[Scored], thresholds: Thresholds = Thresholds(), seed: int = stats.SEED,
                 resamples: int = stats.RESAMPLES) -> RunMeasures:
    """Every row's measures and the run's: pooled over tokens, intervals over rows (at least one row)."""
    if not scored:
        raise ValueError("no rows to measure")
    rows = tuple(row_measures(item, thresholds) for item in scored)
    deltas = [item.delta() for item in scored]
    sizes = np.abs(np.concatenate(deltas))
    counts = [m.tokens for m in rows]
    intervals = stats.cluster_bootstrap({
        "bitwise_equal": [m.bitwise_equal for m in rows],
        "abs_delta_mean": [float(np.abs(d).sum()) for d in deltas],
        "k3": [float(k3_terms(d).sum()) for d in deltas],
        "outside_bounds": [m.outside_bounds for m in rows]}, counts, seed, resamples)
    median, p99 = np.quantile(sizes, [0.5, 0.99])
    exceeding = stats.wilson(sum(m.first_exceeding is not None for m in rows), len(rows))
    return RunMeasures(rows, int(sum(counts)), intervals["bitwise_equal"], intervals["abs_delta_mean"],
                       intervals["k3"], intervals["outside_bounds"], float(sizes.max()), float(median), float(p99),
                       exceeding, worst_tokens(scored), thresholds)
