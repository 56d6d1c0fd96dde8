"""The edge sweep in a run's report (docs/report.md, "Edge sweeps"): per cell, axis and swept value, the rows whose
reference~edge boundary logits, caches, next tokens and continuations differ, each a k/n with its Wilson interval;
the replicas exact at the point; and per axis the first value where anything of the headline differs.

A sweep record (families/sweep.py) holds every point of every axis its backend swept (records.SweepPoint); its
top-level `arms` and `comparisons` are the last point's. Here every point is read, and a point is counted only where
its premise held: a backend with engine counters records them per arm in the point's `served`, and a point whose
counters say the premise did not hold (`premise_held: false` or `vacuous: true` in any arm's counters) is vacuous:
counted apart, never as agreement; counters this version cannot read (an arm's that are not a mapping, a
`premise_held` that is not true or false) are counted apart too. A point without counters (transformers: the
premise is the construction itself) is counted. Computed once into report.json; report.md, report.html, summary.md
and compare read the same functions.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from replaytests.errors import short
from replaytests.families.registry import FAMILIES, SWEEP, SWEEP_HEADLINE
from replaytests.inputs.gates import bit_exact, point_premise
from replaytests.outputs.records import Comparison, Record, SweepPoint
from replaytests.outputs.stats import Proportion, wilson

FAMILY = FAMILIES[SWEEP]
HEADLINE = SWEEP_HEADLINE  # reference~edge
# report name: (comparison field, whether the count is of the rows where the field is false), as shapes.FLAGS
MEASURES = {"logits_differ": ("logits_exact", True), "cache_differs": ("cache_exact", True),
            "argmax_differs": ("argmax_equal", True), "suffix_divergence": ("suffix_equal", True)}
# each measure as a reader names it (a table's column, the first value's `what`)
NAMES = {"logits_differ": "logits", "cache_differs": "cache", "argmax_differs": "next token",
         "suffix_divergence": "continuation"}
WHOLE = "the whole prefix"  # the edge label of a point that is the row's own boundary (SweepPoint.edge None)
HELD, VACUOUS, UNREADABLE = "held", "vacuous", "unreadable"


def premise(point: SweepPoint) -> tuple[str, str | None]:
    """Whether a point's premise held, from the engine's counters (inputs.gates.point_premise): HELD (no counters, or
    counters within what each arm requires and the point needs), VACUOUS (outside: a broken construction or a point that
    did not cross its edge; the first reason, in words), or UNREADABLE (counters of another shape)."""
    served = point.served
    arms = served.values() if isinstance(served, Mapping) else ()
    if served is not None and not (isinstance(served, Mapping) and all(isinstance(c, Mapping) for c in arms)):
        return UNREADABLE, f"counters unreadable: served is {_shown(served)}, not a mapping of arms to counters"
    try:
        broken, vacuous = point_premise(point)
    except (TypeError, ValueError, AttributeError):
        return UNREADABLE, f"counters unreadable: {_shown(served)}"
    if broken or vacuous:
        return VACUOUS, (broken + vacuous)[0]
    return HELD, None


def _shown(value: object) -> str:
    """A value from the ledger as its JSON reads (a list, not the tuple it is held as), shortened."""
    def plain(v: object) -> object:
        if isinstance(v, tuple):
            return [plain(item) for item in v]
        return {key: plain(item) for key, item in v.items()} if isinstance(v, Mapping) else v
    return short(plain(value))


def diverges(comparison: Comparison, name: str) -> bool:
    """Whether a comparison counts under the measure `name` (MEASURES)."""
    field, negate = MEASURES[name]
    return getattr(comparison, field) != negate


def edge_label(edge: str | None) -> str:
    return WHOLE if edge is None else edge


def on_edge(edge: str | None) -> bool:
    """A point that sits on an engine edge (a multiple of its size, or a listed value of an axis of counts), not one
    before or after it nor the whole prefix (families/sweep.positions writes the labels)."""
    return edge is not None and not edge.endswith((" - 1", " + 1"))


def points_of(record: Record) -> tuple[SweepPoint, ...]:
    """An ok sweep record's points (a record written without them: none)."""
    return record.sweep or ()


def _measured(comps: list[Comparison], name: str) -> bool:
    """A measure is reported only where every comparison measured it (a runtime without K/V records null); over no
    comparison (nothing counted at the point) it is 0/0, nothing estimated."""
    return all(getattr(c, MEASURES[name][0]) is not None for c in comps)


def _point(axis: str, value: int | None, held: list[tuple[Record, SweepPoint]]) -> dict:
    """One (axis, value) over the ok records holding it: the headline measures and the replicas over the rows whose
    premise held, the others counted apart with why."""
    judged = [(record, point, premise(point)) for record, point in held]
    counted = [(record, point) for record, point, (state, _) in judged if state == HELD]
    comps = [point.comparisons[HEADLINE] for _, point in counted if HEADLINE in point.comparisons]
    replicas = [pair for pair in FAMILY.replicas if any(pair in p.comparisons for _, p in counted)]
    labels = sorted({edge_label(point.edge) for _, point in held})
    out = {"value": value, "edge": " / ".join(labels), "on_edge": any(on_edge(point.edge) for _, point in held),
           "tokens": sorted({point.tokens for _, point in held}), "rows": len(held), "counted": len(counted),
           "vacuous": sum(state == VACUOUS for _, _, (state, _) in judged),
           "unreadable": sum(state == UNREADABLE for _, _, (state, _) in judged),
           "why": dict(Counter(why for _, _, (state, why) in judged if state != HELD).most_common()),
           "replicas": {pair: wilson(sum(pair in p.comparisons and bit_exact(p.comparisons[pair])
                                         for _, p in counted), len(counted)) for pair in replicas},
           "replicas_exact": wilson(sum(all(pair in p.comparisons and bit_exact(p.comparisons[pair])
                                            for pair in FAMILY.replicas) for _, p in counted), len(counted)),
           "headline_rows": len(comps)}
    out |= {name: wilson(sum(diverges(c, name) for c in comps), len(comps)) if _measured(comps, name)
            else None for name in MEASURES}
    out["diverging_rows"] = sorted(record.row for record, point in counted if HEADLINE in point.comparisons
                                   and diverges(point.comparisons[HEADLINE], "suffix_divergence"))
    return out


def differs(point: dict) -> list[str]:
    """What of the headline differs in some counted row at a point (a report.json point): the measures' names."""
    return [NAMES[name] for name in MEASURES if _some(point.get(name))]


def _some(p: Proportion | None) -> bool:
    """Some row counted (a proportion with k > 0; None where the measure was not measured)."""
    return p is not None and p.k > 0


def _axis(axis: str, ok: list[Record]) -> dict:
    """An axis over the ok records: its points by swept value; each row's whole prefix (a length of its own, beside
    no edge) gathered in one entry, `whole_prefix`, rather than one single-row point per length."""
    by_value: dict[int, list[tuple[Record, SweepPoint]]] = defaultdict(list)
    whole: list[tuple[Record, SweepPoint]] = []
    for record in ok:
        for point in points_of(record):
            if point.axis == axis:
                (whole if point.edge is None else by_value[point.value]).append((record, point))
    found = [_point(axis, value, by_value[value]) for value in sorted(by_value)]
    first = next((p for p in found if differs(p)), None)
    first_suffix = next((p for p in found if _some(p["suffix_divergence"])), None)
    return {"rows": len({record.row for held in [*by_value.values(), whole] for record, _ in held}),
            "points": found, **({"whole_prefix": _point(axis, None, whole)} if whole else {}),
            "first_difference": None if first is None else {"value": first["value"], "edge": first["edge"],
                                                            "what": differs(first)},
            "first_suffix_divergence": None if first_suffix is None else first_suffix["value"]}


def _cell(records: list[Record], runtime: str) -> dict:
    ok = [r for r in records if r.ok]
    axes = list(dict.fromkeys(point.axis for record in ok for point in points_of(record)))  # in the order swept
    return {"runtime": runtime, "rows": len(records), "ok": len(ok), "excluded": len(records) - len(ok),
            "without_points": sorted(r.row for r in ok if not points_of(r)),
            "replicas": {pair: wilson(sum(replicas_hold(r, pair) for r in ok), len(ok))
                         for pair in FAMILY.replicas},
            "axes": {axis: _axis(axis, ok) for axis in axes}}


def build(records: list[Record], runtime: str, order: Sequence[str] = ()) -> dict:
    """cell -> the edge sweep's measures in that cell: `runtime` (the backend that ran them, from run.json), the
    rows, and per axis every swept value's point and the first value where the headline differs. Cells in `order`
    first, then the rest sorted; empty where the family did not run."""
    by_cell: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record.family == SWEEP:
            by_cell[record.precision].append(record)
    cells = [c for c in order if c in by_cell] + sorted(set(by_cell) - set(order))
    return {cell: _cell(by_cell[cell], runtime) for cell in cells}


def replicas_hold(record: Record, pair: str) -> bool:
    """A replica pair bit-exact at every point of the record, whatever its premise (a point lacking it: not; a
    record without points: not)."""
    return bool(points_of(record)) and all(pair in p.comparisons and bit_exact(p.comparisons[pair])
                                           for p in points_of(record))


def compact(axis: dict) -> tuple[str, str, str, str, str]:
    """An axis of a cell (build) in the summary's words: points, points whose logits differ in some row, points whose
    continuation differs in some row, the first value where anything differs, the row-points counted apart."""
    found = axis["points"]
    first = axis["first_difference"]
    apart = sum(p["vacuous"] + p["unreadable"] for p in found)
    return (str(len(found)), str(sum(_some(p["logits_differ"]) for p in found)),
            str(sum(_some(p["suffix_divergence"]) for p in found)),
            "none" if first is None else f"{first['value']} ({', '.join(first['what'])})", str(apart))
