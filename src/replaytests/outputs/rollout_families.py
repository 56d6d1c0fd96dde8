"""The rollout families in a run's report (docs/report.md, "Rollouts"): per family, cell and pair, the
mismatch measures of outputs/mismatch.py over the per-token log-probabilities the records hold.

A rollout record keeps each arm's log-probability of every response token (`arms.<arm>.logprobs`) and the two
most likely ids at each step (`top2`). The report re-reads them as mismatch.Scored rows (the first arm of a
pair as the reference, as families/rollout.py measured them), so the run's pooled measures, their intervals over
rows, the distribution of |delta logp| and the worst tokens come from the same numbers as each record's own
measures. Computed once into report.json; every renderer reads that.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from replaytests.families.registry import ROLLOUT_FAMILIES
from replaytests.inputs.gates import REPLICA_SUFFIX, ROLLOUT_CONTROL, ROLLOUT_RECOMPUTE
from replaytests.outputs.mismatch import Scored, Thresholds, bitwise, run_measures
from replaytests.outputs.records import Record

BINS_PER_DECADE = 4  # the distribution's bins of |delta logp| on a log axis
ROLES = {ROLLOUT_RECOMPUTE: "headline: the trainer's recompute", ROLLOUT_CONTROL: "control: teacher forcing"}


def role(pair: str) -> str:
    """What a pair of a rollout record is, in the report's words."""
    return ROLES.get(pair, "replica" if pair.endswith(REPLICA_SUFFIX) else "other")


def pair_order(pairs) -> list[str]:
    """The headline first, then the control, then the replicas, then any other pair."""
    rank = {ROLLOUT_RECOMPUTE: 0, ROLLOUT_CONTROL: 1}
    return sorted(pairs, key=lambda p: (rank.get(p, 2 if p.endswith(REPLICA_SUFFIX) else 3), p))


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many response tokens two arms share from the start (two live rollouts may split)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def scored(record: Record, pair: str) -> Scored | None:
    """One ok rollout record's pair as mismatch.Scored (the first arm is the reference, live as float64, the
    second's as float32, as families/rollout.py measured them), over the tokens both arms share; None where
    either arm holds no log-probabilities or they share no token."""
    a, b = (record.arms.get(arm) for arm in pair.split("~"))
    if a is None or b is None or a.logprobs is None or b.logprobs is None:
        return None
    shared = min(_shared(a.suffix, b.suffix), len(a.logprobs), len(b.logprobs))
    if not shared:
        return None
    return Scored(record.row, np.asarray(a.suffix[:shared], dtype=np.int64),
                  np.asarray(a.logprobs[:shared], dtype=np.float64), np.asarray(b.logprobs[:shared], dtype=np.float32))


def thresholds(record: Record) -> Thresholds:
    """The thresholds a rollout record was judged by (its `rollout` settings)."""
    s = record.rollout
    return Thresholds(s.ratio_low, s.ratio_high, s.delta_threshold) if s is not None else Thresholds()


def distribution(items: Sequence[Scored]) -> dict:
    """|delta logp| over every token: how many are exactly 0 (and how many bitwise equal: -0.0 against 0.0 is a
    zero delta, not a bitwise equal number), and the others in bins of a quarter decade on a log axis."""
    sizes = np.abs(np.concatenate([item.delta() for item in items]))
    positive = sizes[sizes > 0]
    out = {"tokens": int(sizes.size), "zero": int(sizes.size - positive.size),
           "bitwise_equal": int(sum(int(bitwise(item.live, item.replay).sum()) for item in items)),
           "bins_per_decade": BINS_PER_DECADE, "edges_log10": [], "counts": []}
    if positive.size:
        logs = np.log10(positive)
        lo, hi = math.floor(logs.min() * BINS_PER_DECADE), math.ceil(logs.max() * BINS_PER_DECADE)
        edges = np.arange(lo, max(hi, lo + 1) + 1) / BINS_PER_DECADE
        out |= {"edges_log10": edges.tolist(), "counts": np.histogram(logs, bins=edges)[0].tolist()}
    return out


def _with_top2(worst: dict, by_row: dict[str, Record], arms: tuple[str, str]) -> dict:
    """A worst token with the two most likely ids of each arm at its step, where the record holds them."""
    record = by_row[worst["row"]]
    top2 = {arm: list(record.arms[arm].top2[worst["position"]]) for arm in arms
            if record.arms[arm].top2 is not None and worst["position"] < len(record.arms[arm].top2)}
    return worst | ({"top2": top2} if top2 else {})


def _pair(ok: list[Record], pair: str, judged_by: Thresholds) -> dict | None:
    """A pair's run-level measures over the rows holding it (mismatch.run_measures), its distribution and its
    worst tokens with their top-2 candidates; None where no row holds log-probabilities for it."""
    items = [item for record in ok if (item := scored(record, pair)) is not None]
    if not items:
        return None
    run = run_measures(items, judged_by)
    by_row = {record.row: record for record in ok}
    arms = tuple(pair.split("~"))
    measured = run.to_json()
    return {"role": role(pair), **measured, "worst": [_with_top2(w, by_row, arms) for w in measured["worst"]],
            "exceeding": [m.row for m in run.rows if m.first_exceeding is not None],
            "distribution": distribution(items)}


def _cell(records: list[Record], runtime: str) -> dict:
    ok = [r for r in records if r.ok]
    judged = Counter(thresholds(r) for r in ok)
    judged_by = judged.most_common(1)[0][0] if judged else Thresholds()
    modes = sorted({r.rollout.mode for r in ok if r.rollout is not None})
    lengths = sorted({r.rollout.length for r in ok if r.rollout is not None})
    pairs = pair_order({pair for r in ok for pair in r.comparisons})
    measured = {pair: found for pair in pairs if (found := _pair(ok, pair, judged_by)) is not None}
    notes = [f"rows judged by other thresholds ({len(ok) - judged.most_common(1)[0][1]} of {len(ok)}): the run's "
             "measures use the most common"] if len(judged) > 1 else []
    return {"runtime": runtime, "rows": len(records), "ok": len(ok), "excluded": len(records) - len(ok),
            "mode": ", ".join(modes), "length": ", ".join(map(str, lengths)), "thresholds": judged_by.to_json(),
            "pairs": measured, "notes": notes}


def build(records: list[Record], runtime: str, order: Sequence[str] = ()) -> dict:
    """family -> cell -> the cell's rollout measures, for each rollout family present: `runtime` (the backend
    that ran them, from run.json), the rows, the rollout mode and length, the thresholds and per pair its
    measures (`pairs`). Cells in `order` first, then the rest sorted."""
    groups: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if record.family in ROLLOUT_FAMILIES:
            groups[record.family][record.precision].append(record)
    cells = {family: [c for c in order if c in by_cell] + sorted(set(by_cell) - set(order))
             for family, by_cell in groups.items()}
    return {family: {cell: _cell(groups[family][cell], runtime) for cell in cells[family]}
            for family in ROLLOUT_FAMILIES if family in groups}



def _k3(record: Record) -> float:
    return record.comparisons[ROLLOUT_RECOMPUTE].k3


def _abs_delta_mean(record: Record) -> float:
    item = scored(record, ROLLOUT_RECOMPUTE)
    return float(np.abs(item.delta()).mean())


def cell_pairs(records: list[Record], pairs: Sequence[tuple[str, str]]) -> dict:
    """family -> "A -> B" -> the trainer's recompute in cell A against cell B on the rows both ran (ok), paired by
    row, as the crossing pairs its cells (a quantized cell's amplification over its native one): each cell's mean
    of the per-row k3 and mean abs(delta logp), and a paired sign-flip test (stats.sign_flip) of the per-row
    differences. A pair of cells with no row in common is left out (a comparison with nothing in common)."""
    from replaytests.outputs import stats

    by_key = {(r.family, r.precision, r.row): r for r in records if r.family in ROLLOUT_FAMILIES and r.ok
              and ROLLOUT_RECOMPUTE in r.comparisons and r.comparisons[ROLLOUT_RECOMPUTE].logprob_tokens}
    out: dict[str, dict] = {}
    for family in ROLLOUT_FAMILIES:
        for a, b in pairs:
            rows = sorted(row for f, cell, row in by_key if f == family and cell == a and (family, b, row) in by_key)
            if not rows:
                continue
            measured = {}
            for name, read in (("k3", _k3), ("abs_delta_mean", _abs_delta_mean)):
                x, y = ([read(by_key[family, cell, row]) for row in rows] for cell in (a, b))
                measured[name] = {"means": [float(np.mean(x)), float(np.mean(y))],
                                  "test": stats.sign_flip(x, y)}
            out.setdefault(family, {})[f"{a} -> {b}"] = {"rows": len(rows), **measured}
    return out
