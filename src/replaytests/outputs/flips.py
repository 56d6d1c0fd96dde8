"""Every flip attributed to its margin (docs/report.md): was a divergence a tie broken differently, or a
change of the model's preference?

For each headline pair whose suffixes split, the top-1 minus top-2 masked logit margin at the first
difference, in both constructions, puts the flip in one bin by the smaller of the two:

- `tie`: an exact top-1/top-2 tie (margin 0) in one construction: the tie was broken differently;
- `bf16_step`: a margin no larger than one BF16 step (2^-7 of the top-1 logit's binade) in either: a
  near tie, within the rounding of a BF16 logit;
- `apart`: clearly apart in both: the construction changed the model's preference, and the row is named;
- `unknown`: a ledger written before the top-1 logits were recorded (ledger/3 and older) and no tie.

A margin-triggered verifier (one that re-checks a decode step when its margin is small) would need a
threshold at least the largest margin at which the reference construction (the pair's first: live or
incremental) flipped; its trigger rate is the share of that construction's decode steps with a choice
whose margin lies at or below it (ledger/4: every step's margin is recorded). Reads records only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from replaytests.outputs.records import Record
from replaytests.outputs.stats import Proportion, fields_of, proportion

BINS = ("tie", "bf16_step", "apart", "unknown")
BF16_MANTISSA_BITS = 7  # explicit fraction bits of bfloat16


def bf16_step(value: float) -> float:
    """One BF16 step (unit in the last place) at `value`'s magnitude."""
    magnitude = abs(value)
    if magnitude == 0 or not math.isfinite(magnitude):
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - BF16_MANTISSA_BITS)


def bin_of(margins: tuple[float, ...], top1: tuple[float, ...] | None) -> str:
    """The bin of one flip from its two margins and, where recorded, the two top-1 logits."""
    smaller = min(margins)
    if smaller == 0:
        return "tie"
    if top1 is None:
        return "unknown"
    return "bf16_step" if any(m <= bf16_step(t) for m, t in zip(margins, top1, strict=True)) else "apart"


def step_margins(records: list[Record], arm: str) -> list[float] | None:
    """Every decode step's margin of `arm` with a choice (forced steps are null), or None where a record
    does not carry them (an older ledger)."""
    if not all(arm in r.arms and r.arms[arm].margins is not None for r in records):
        return None
    return [m for r in records for m in r.arms[arm].margins if m is not None]


@dataclass(frozen=True)
class ApartRow:
    """A flip clearly apart in both constructions: its row and its two margins."""

    row: str
    margins: tuple[float, ...]

    def to_json(self) -> dict:
        return fields_of(self)


@dataclass(frozen=True)
class Flips:
    """The flips of one pair: of its `rows` (the ok records carrying it), the `divergent` ones binned by margin, the
    rows clearly apart, and the verifier's threshold (the largest margin at which the `reference` construction
    flipped) with its trigger rate (None where the records do not carry every step's margin)."""

    rows: int
    divergent: int
    bins: dict[str, Proportion]
    apart_rows: tuple[ApartRow, ...]
    reference: str
    threshold: float
    trigger_rate: Proportion | None

    def to_json(self) -> dict:
        return fields_of(self)


def pair_flips(records: list[Record], pair: str) -> Flips | None:
    """The flips of one pair over the ok records carrying it (None where none diverges)."""
    carrying = [r for r in records if pair in r.comparisons]
    flips = [(r.row, c) for r in carrying if not (c := r.comparisons[pair]).suffix_equal and c.margins_at_divergence]
    if not flips:
        return None
    binned = {row: bin_of(c.margins_at_divergence, c.top1_at_divergence) for row, c in flips}
    reference = pair.split("~")[0]
    threshold = max(c.margins_at_divergence[0] for _, c in flips)
    steps = step_margins(carrying, reference)
    return Flips(rows=len(carrying), divergent=len(flips),
                 bins={name: proportion(carrying, lambda r, n=name: binned.get(r.row) == n) for name in BINS},
                 apart_rows=tuple(ApartRow(row, tuple(c.margins_at_divergence)) for row, c in flips
                                  if binned[row] == "apart"),
                 reference=reference, threshold=threshold,
                 trigger_rate=None if steps is None else proportion(steps, lambda m: m <= threshold))


def flips(records: list[Record], headlines: dict[str, tuple[str, ...]]) -> dict:
    """family -> cell -> pair -> its flips, for every headline pair with a divergence."""
    out: dict = {}
    for family, pairs in headlines.items():
        for cell in sorted({r.precision for r in records if r.family == family}):
            ok = [r for r in records if r.family == family and r.precision == cell and r.ok]
            for pair in pairs:
                if (found := pair_flips(ok, pair)) is not None:
                    out.setdefault(family, {}).setdefault(cell, {})[pair] = found
    return out
