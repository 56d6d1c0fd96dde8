"""Statistics for counts (docs/protocol.md §8): Wilson intervals, exact McNemar, seeded paired bootstrap.

Public functions return small frozen result objects whose `to_json()` is what report.json holds
(docs/report.md). Rates and bounds are fractions in [0, 1]. With no data (n = 0) a rate, bound or
difference is None (JSON null): there is nothing to estimate, and 0 would read as a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from numbers import Integral
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
INTERVAL = f"Wilson {100 * LEVEL:g}%"  # what every rendered interval of a proportion is, as its labels name it
RESAMPLES = 10_000
SEED = 0


@dataclass(frozen=True)
class Proportion:
    """k of n with its Wilson interval at `level`. report.json states the level once (`statistics.level`), not in
    each proportion: `to_json` leaves it out, `from_json` takes it back."""

    k: int
    n: int
    rate: float | None
    ci_low: float | None
    ci_high: float | None
    method: str = "wilson"
    level: float = LEVEL

    def to_json(self) -> dict:
        return {name: value for name, value in asdict(self).items() if name != "level"}

    @classmethod
    def from_json(cls, value: dict, level: float = LEVEL) -> Proportion:
        """A proportion as report.json or a history line holds it (a line is checked as it is read: k and n, and
        where n > 0 the rate and its bounds); keys this version does not know are left."""
        return cls(value["k"], value["n"], value.get("rate"), value.get("ci_low"), value.get("ci_high"),
                   value.get("method", "wilson"), level)


@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test: b and c are the discordant pair counts (A only, B only)."""

    b: int
    c: int
    p: float
    method: str = "mcnemar-exact"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BootstrapCI:
    """Percentile bootstrap interval of mean(x) - mean(y) over n paired rows."""

    diff: float | None
    ci_low: float | None
    ci_high: float | None
    seed: int
    resamples: int
    n: int
    level: float = LEVEL
    method: str = "paired-percentile-bootstrap"

    def to_json(self) -> dict:
        return asdict(self)


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_level(level: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return level


def _z(level: float) -> float:
    # Two-sided standard normal quantile: 1.959964 for 95%.
    return NormalDist().inv_cdf(1 - (1 - level) / 2)


def _wilson_bounds(k: int, n: int, z: float) -> tuple[float, float]:
    # Wilson (1927) score interval, JASA 22:209; Agresti & Coull (1998) eq. 2:
    # (k + z²/2 ± z·sqrt(k(n-k)/n + z²/4)) / (n + z²). The bound at 0/n and n/n is exact by definition.
    centre = k + z * z / 2
    half = z * math.sqrt(k * (n - k) / n + z * z / 4)
    low = 0.0 if k == 0 else (centre - half) / (n + z * z)
    high = 1.0 if k == n else (centre + half) / (n + z * z)
    return low, high


def wilson(k: int, n: int, level: float = LEVEL) -> Proportion:
    """k successes out of n with a Wilson score interval; n = 0 gives rate and bounds None."""
    k, n = _check_count("k", k), _check_count("n", n)
    if k > n:
        raise ValueError(f"k must be at most n, got k={k!r}, n={n!r}")
    z = _z(_check_level(level))
    if n == 0:
        return Proportion(k, n, None, None, None, level=level)
    return Proportion(k, n, k / n, *_wilson_bounds(k, n, z), level=level)


def proportion(items: list, test) -> Proportion:
    """The Wilson proportion of the items that pass `test`."""
    return wilson(sum(1 for item in items if test(item)), len(items))


def _two_sided_sign_test(b: int, c: int) -> float:
    # Exact McNemar = two-sided binomial test of b successes in b + c trials at p = 1/2
    # (McNemar 1947; Fagerland, Lydersen & Laake 2013, BMC Med Res Methodol 13:91, eq. 2):
    # p = min(1, 2 · P[X ≤ min(b, c)]), X ~ Bin(b + c, 1/2). scipy.stats is imported here, not at the top: it takes
    # a second to import, and every run, command and worker starts by importing this module.
    from scipy.stats import binom

    return min(1.0, 2.0 * float(binom.cdf(min(b, c), b + c, 0.5)))


def mcnemar_paired(x: list[bool], y: list[bool]) -> McNemar:
    """Exact McNemar on paired binary outcomes: b counts the rows where only x holds, c where only y."""
    return mcnemar_exact(sum(a and not b for a, b in zip(x, y, strict=True)),
                         sum(b and not a for a, b in zip(x, y, strict=True)))


def mcnemar_exact(b: int, c: int) -> McNemar:
    """Exact McNemar test on the discordant pairs; p = 1 when there are none."""
    b, c = _check_count("b", b), _check_count("c", c)
    return McNemar(b, c, 1.0 if b + c == 0 else _two_sided_sign_test(b, c))


def _as_binary(name: str, values: Sequence[int | bool]) -> np.ndarray:
    array = np.asarray(values)
    bad = [v for v in array.tolist() if v not in (0, 1)]
    if array.ndim != 1 or bad:
        raise ValueError(f"{name} must be a flat sequence of 0/1 values, got {bad[:3] or values!r}")
    return array.astype(np.int8)


def _percentile_bootstrap(d: np.ndarray, rng: np.random.Generator, resamples: int,
                          level: float) -> tuple[float, float]:
    # Percentile interval (Efron & Tibshirani 1993, §13.3) of the mean paired difference, resampling
    # rows with replacement. d takes the values -1, 0, 1, so a resample of n rows is fully described by
    # how many rows of each value it draws: one multinomial draw per resample, the same distribution
    # as drawing n row indices, in O(resamples) memory.
    counts = rng.multinomial(len(d), [np.mean(d == v) for v in (-1, 0, 1)], size=resamples)
    means = (counts[:, 2] - counts[:, 0]) / len(d)
    low, high = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


def paired_bootstrap(x: Sequence[int | bool], y: Sequence[int | bool], seed: int = SEED,
                     resamples: int = RESAMPLES, level: float = LEVEL) -> BootstrapCI:
    """mean(x) - mean(y) for paired 0/1 outcomes of the same rows, with a seeded percentile interval.

    Empty input gives diff and bounds None (n = 0).
    """
    xs, ys = _as_binary("x", x), _as_binary("y", y)
    if len(xs) != len(ys):
        raise ValueError(f"x and y must pair the same rows, got lengths {len(xs)} and {len(ys)}")
    if _check_count("resamples", resamples) == 0:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    _check_level(level)
    if len(xs) == 0:
        return BootstrapCI(None, None, None, seed, resamples, 0, level)
    d = xs.astype(np.int64) - ys
    low, high = _percentile_bootstrap(d, np.random.default_rng(seed), resamples, level)
    return BootstrapCI(float(d.mean()), low, high, seed, resamples, len(d), level)


@dataclass(frozen=True)
class ClusterInterval:
    """A ratio of sums over clusters (a token-level mean or share over rows of tokens) with a percentile
    bootstrap interval that resamples whole clusters: tokens of one row are not independent draws."""

    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    seed: int
    resamples: int
    n: int
    level: float = LEVEL
    method: str = "cluster-percentile-bootstrap"

    def to_json(self) -> dict:
        return asdict(self)


CHUNK = 1_000  # resamples drawn at a time: memory stays O(CHUNK x clusters)


def cluster_bootstrap(numerators: dict[str, Sequence[float]], denominators: Sequence[float], seed: int = SEED,
                      resamples: int = RESAMPLES, level: float = LEVEL) -> dict[str, ClusterInterval]:
    """sum(numerator) / sum(denominator) over clusters, for each named numerator, with seeded percentile
    intervals (Efron & Tibshirani 1993, §13.3; clusters resampled with replacement, Field & Welsh 2007): every
    measure is read off the same resamples. No cluster gives estimate and bounds None."""
    weights = np.asarray(denominators, dtype=np.float64)
    sums = {name: np.asarray(values, dtype=np.float64) for name, values in numerators.items()}
    if any(values.shape != weights.shape for values in sums.values()):
        raise ValueError("every numerator needs one value per cluster, as the denominators")
    if _check_count("resamples", resamples) == 0:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    _check_level(level)
    n = len(weights)
    if n == 0:
        return {name: ClusterInterval(None, None, None, seed, resamples, 0, level) for name in sums}
    rng, drawn = np.random.default_rng(seed), {name: [] for name in sums}
    for start in range(0, resamples, CHUNK):
        picks = rng.integers(0, n, size=(min(CHUNK, resamples - start), n))
        total = weights[picks].sum(axis=1)
        for name, values in sums.items():
            drawn[name].append(values[picks].sum(axis=1) / total)
    quantiles = [(1 - level) / 2, 1 - (1 - level) / 2]
    out = {}
    for name, values in sums.items():
        low, high = np.quantile(np.concatenate(drawn[name]), quantiles)
        out[name] = ClusterInterval(float(values.sum() / weights.sum()), float(low), float(high), seed, resamples, n,
                                    level)
    return out


@dataclass(frozen=True)
class PermutationTest:
    """A paired two-sided test of mean(x - y) = 0 over rows measured in two runs."""

    diff: float | None  # mean(x - y); None with no paired rows
    p: float
    n: int
    exact: bool  # every sign assignment enumerated (else `resamples` drawn with `seed`)
    seed: int
    resamples: int
    method: str = "paired-sign-flip-permutation"

    def to_json(self) -> dict:
        return asdict(self)


def smallest_p(n: int, resamples: int = RESAMPLES) -> float:
    """The smallest p sign_flip can give over n paired rows: 2 / 2^n when it enumerates (the observed signs and
    their negation tie), 1 / (resamples + 1) when it draws; 1 with no row."""
    if n == 0:
        return 1.0
    return 2.0 / 2 ** n if 2 ** n <= resamples else 1.0 / (resamples + 1)


def sign_flip(x: Sequence[float], y: Sequence[float], seed: int = SEED, resamples: int = RESAMPLES) -> PermutationTest:
    """Paired sign-flip permutation test of mean(x - y) = 0, two-sided (Fisher 1935, §21; Good 2005, §3.1.2): under
    the null each row's difference is as likely negated, and p is the share of sign assignments whose |mean| is at
    least the observed. Every assignment is enumerated where 2^n <= resamples; else `resamples` are drawn from a
    seeded generator and p = (1 + hits) / (1 + resamples) (Phipson & Smyth 2010), never 0."""
    if len(x) != len(y):
        raise ValueError(f"x and y must pair the same rows, got lengths {len(x)} and {len(y)}")
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"x and y must be flat sequences of numbers, got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("x and y must be finite")
    if _check_count("resamples", resamples) == 0:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")
    n = len(d)
    if n == 0:
        return PermutationTest(None, 1.0, 0, True, seed, resamples)
    observed = abs(d.mean())
    floor = observed * (1 - 1e-9)  # a sum in another order may round below the observed one: count it as a tie
    if 2 ** n <= resamples:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        p = float(np.mean(np.abs(signs @ d) / n >= floor))
        return PermutationTest(float(d.mean()), min(1.0, p), n, True, seed, resamples)
    rng, hits = np.random.default_rng(seed), 0
    for start in range(0, resamples, CHUNK):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(min(CHUNK, resamples - start), n))
        hits += int(np.sum(np.abs(signs @ d) / n >= floor))
    return PermutationTest(float(d.mean()), (1 + hits) / (1 + resamples), n, False, seed, resamples)


def fields_of(result: object) -> dict:
    """A result object's fields in their declared order (report.json's), as they are: `as_json` writes the objects
    among them. The `to_json` of a result object that holds others."""
    return {field.name: getattr(result, field.name) for field in fields(result)}


def as_json(value: object) -> object:
    """`value` (a built report's content: dicts, lists and tuples of JSON values and result objects) with every result
    object (a frozen dataclass with a `to_json`: these, flips.Flips, verdict.Verdict, ...) as its `to_json()`, itself
    converted: what report.json and a history line hold. Any other object is left for the JSON writer to refuse."""
    if is_dataclass(value) and not isinstance(value, type) and hasattr(value, "to_json"):
        return as_json(value.to_json())
    if isinstance(value, dict):
        return {key: as_json(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(inner) for inner in value]
    return value
