"""The edge sweep's own report section (docs/report.md): report.json's `sweeps` (per cell and axis, value by value,
outputs/sweep_report.py) and its part of every renderer: the replica layer's rows, the fidelity layer's tables and
lines, summary.md's and the terminal's table, report.html's plots; and its checks of a run's records and between two
runs. A report section module: outputs/family_sections.py says what it holds; the family's registry record names it.
"""

from __future__ import annotations

from collections import defaultdict

from replaytests.families.registry import FAMILIES
from replaytests.inputs.gates import Gates
from replaytests.outputs import plots, sweep_report
from replaytests.outputs.findings import RATES_REASON, Findings, Group, Measure, Rows, ok_records
from replaytests.outputs.records import Record
from replaytests.outputs.shapes import own_comparisons
from replaytests.outputs.stats import INTERVAL, mcnemar_paired
from replaytests.outputs.tables import Table, first, fmt_proportion

TERMINAL = True  # its summary table is printed after a run too
HEADLINE_SCOPE = None  # its pairs at every point: the sweep table's note says so
HEADLINE_DIVERGENCES = True


def headline_comparisons(record: Record, pair: str) -> list:
    """What the headline table (outputs/summary.py) reads of a sweep: `pair` at every point whose premise held
    (sweep_report.premise)."""
    if record.sweep:
        return [p.comparisons[pair] for p in record.sweep
                if pair in p.comparisons and sweep_report.premise(p)[0] == sweep_report.HELD]
    return own_comparisons(record, pair)


def build(records: list[Record], runtime: str, cells: tuple[str, ...], pairs: list[tuple[str, str]]) -> dict:
    """Its report.json key, where the run holds a sweep."""
    return {"sweeps": swept} if (swept := sweep_report.build(records, runtime, cells)) else {}


def replica_rows(report: dict) -> list[tuple[str, ...]]:
    """Its rows of the replica layer's table: each replica pair bit-exact at every point."""
    return [(sweep_report.SWEEP, cell, f"{pair} (every point)", fmt_proportion(exact))
            for cell, found in (report.get("sweeps") or {}).items() for pair, exact in found["replicas"].items()]


def fidelity(report: dict) -> tuple[list[Table], list[Table], list[str]]:
    """Its tables in the fidelity layer (each cell's axes), none folded away, and its lines (the points not counted,
    with why)."""
    found = report.get("sweeps") or {}
    return ([_table(cell, axis, swept) for cell, swept in found.items() for axis in swept["axes"]], [],
            [line for cell, swept in found.items() for line in _lines(cell, swept)])


COLUMNS = ("value", "edge", "rows ok", "not counted", "replicas exact", "logits differ", "cache differs",
           "next token differs", "continuation differs")  # the last four: sweep_report.MEASURES, in order


def _measure(point: dict, name: str) -> str:
    return "not measured" if point[name] is None else fmt_proportion(point[name])


def _table(cell: str, axis: str, found: dict) -> Table:
    """One axis of a cell of the edge sweep (outputs/sweep_report.py): per swept value, the rows whose reference~edge
    boundary logits, caches, next tokens and continuations differ, over the rows whose premise held."""
    swept = found["axes"][axis]
    whole = [swept["whole_prefix"]] if swept.get("whole_prefix") else []
    rows = tuple((str(p["value"]) if p["value"] is not None else "each row's length", p["edge"], str(p["rows"]),
                  _not_counted(p), fmt_proportion(p["replicas_exact"]),
                  *(_measure(p, name) for name in sweep_report.MEASURES)) for p in [*swept["points"], *whole])
    first, suffix = swept["first_difference"], swept["first_suffix_divergence"]
    return Table(f"{sweep_report.FAMILY.title}, {cell}, axis {axis}, runtime {found['runtime']}", COLUMNS, rows,
                 f"Per swept value, over the ok rows holding the point whose premise held: k/n = rate [{INTERVAL} CI] "
                 f"of the rows whose {sweep_report.HEADLINE} boundary logits, caches, next token (the boundary logits' "
                 "argmax) and greedy continuation differ (a cache not measured: the runtime exposes no K/V); replicas "
                 "exact: both constructions built twice bit-exact (cache, logits, continuation). A point whose engine "
                 "counters say its premise did not hold is not counted: vacuous, never agreement. First value where "
                 "anything differs: " + ("none" if first is None else f"{first['value']} ({first['edge']}: "
                                                                      f"{', '.join(first['what'])})")
                 + "; first continuation difference: " + ("none" if suffix is None else str(suffix)) + ". The "
                 "headline table's sweep row counts a row whose pair differs at any point whose premise held "
                 "(replicas: exact at every point).")


def _not_counted(point: dict) -> str:
    parts = [f"{name} {point[name]}" for name in ("vacuous", "unreadable") if point[name]]
    return f"{point['vacuous'] + point['unreadable']} ({', '.join(parts)})" if parts else "0"


def _lines(cell: str, found: dict) -> list[str]:
    """The sweep points not counted, with why; the ok records holding no point."""
    lines = [f"Edge sweep {cell}, {axis} {p['value']}: {n} row{'s' * (n > 1)} not counted: {why}"
             for axis, swept in found["axes"].items() for p in swept["points"] for why, n in p["why"].items()]
    if found["without_points"]:
        lines.append(f"Edge sweep {cell}: ok records holding no point (nothing of them checked): "
                     f"{first(found['without_points'])}")
    return lines


SUMMARY_COLUMNS = ("precision", "axis", "rows", "points", "logits differ at", "continuation differs at",
                   "first difference", "not counted")


def summary_table(built: dict) -> Table | None:
    """The edge sweep per cell and axis (outputs/sweep_report.py): the values swept, at how many of them some row's
    reference~edge logits and continuation differ, the first value where anything differs, and the row-points not
    counted (their premise did not hold); None where the family did not run."""
    rows = tuple((cell, axis, str(swept["rows"]), *sweep_report.compact(swept))
                 for cell, found in (built.get("sweeps") or {}).items() for axis, swept in found["axes"].items())
    if not rows:
        return None
    return Table("Edge sweep, value by value", SUMMARY_COLUMNS, rows,
                 f"Points: the values swept; logits / continuation differs at: the values where some row's "
                 f"{sweep_report.HEADLINE} boundary logits / greedy continuation differ; first difference: the first "
                 "value where its logits, cache, next token or continuation differ; not counted: row-points whose "
                 "premise did not hold. The headline row of the sweep counts its rows at every point whose premise "
                 "held (replicas: at every point). report.md has every value with its rates and intervals.")


PANELS = {"logits_differ": "boundary logits differ", "suffix_divergence": "continuation differs"}


def figures(report: dict) -> list[str]:
    """Per axis of the edge sweep, the share of rows whose reference~edge boundary logits differ and whose continuation
    differs against the swept value (outputs/sweep_report.py): one panel each, one line per cell with its Wilson
    interval as a band, the engine's edges as dashed verticals."""
    found = report.get("sweeps") or {}
    axes = list(dict.fromkeys(axis for cell in found.values() for axis in cell["axes"]))
    runtimes = ", ".join(sorted({cell["runtime"] for cell in found.values()}))
    drawn = []
    for axis in axes:
        swept = {name: cell["axes"][axis]["points"] for name, cell in found.items() if axis in cell["axes"]}
        panels = [(f"{sweep_report.HEADLINE}: {title}",
                   {name: [(p["value"], p[measure], f"{axis} {p['value']} ({p['edge']})") for p in points]
                    for name, points in swept.items()}) for measure, title in PANELS.items()]
        if not any(p[measure] for points in swept.values() for p in points for measure in PANELS):
            continue
        edges: dict[int, set[str]] = defaultdict(set)
        for name, points in swept.items():
            for p in points:
                if p["on_edge"]:
                    edges[p["value"]].add(f"{name} {p['edge']}")
        apart = sum(p["vacuous"] + p["unreadable"] for points in swept.values() for p in points)
        drawn.append(plots.sweep_plot(
            f"Edge sweep ({runtimes}), axis {axis}: rows whose {sweep_report.HEADLINE} boundary logits differ (top) "
            f"and whose continuation differs (bottom) at each swept value, one line per cell, with {INTERVAL} "
            "intervals as bands; dashed verticals: the engine's edges."
            + (f" {apart} row-points not counted (their premise did not hold)." if apart else ""),
            panels, {value: "; ".join(sorted(names)) for value, names in edges.items()}, axis))
    return drawn


def failing(record: Record, gates: Gates) -> list[str]:
    """The checks an ok sweep fails at every point (its judgements' names; a record without points fails both:
    nothing of it was checked). A report's check of its run's pass (report.checked_verdict)."""
    return [name for name, judged in _judged(record, gates).items() if any(j.failed for j in judged)]


def _judged(record: Record, gates: Gates) -> dict[str, list]:
    """A sweep's gates at every point (gates.sweep_*), by check: each replica pair bit-exact, and the headline pair's
    continuations where the contract requires the cell exact (a cell its sweep gates do not name: not judged here)."""
    family = FAMILIES[sweep_report.SWEEP]
    exact = record.precision in gates.suffix_divergence_allowed.get(sweep_report.SWEEP, {})
    return {"sweep replicas (every point)": [gates.sweep_replicas(record, pair) for pair in family.replicas],
            "exact-cell continuations (every sweep point)":
                [gates.sweep_divergence(record, pair) for pair in family.headline] if exact else []}

# ---- compare: its checks between a baseline run and a new one ----

def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Its checks of one cell between a baseline run and a new one (outputs/compare.py): its gates at every point, and
    the headline pair's continuations at each swept value at the rates level."""
    _gates(out, group, base, new, gates)
    _rates(out, group, base, new, alpha)


def _judgements(record: Record, gates: Gates) -> list:
    """A sweep's gates at every point, in one list (compare's count of the records that pass them all)."""
    return [j for judged in _judged(record, gates).values() for j in judged]


def _gates(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates) -> None:
    """The sweep gates on the new run at every point, at every level (the baseline's count informs): a failure is a
    reason; a record of the family without points was never checked, which fails too (gates._at_points)."""
    def passing(rows: Rows) -> tuple[int, int]:
        ok = ok_records(rows)
        return sum(not any(j.failed for j in _judgements(r, gates)) for r in ok), len(ok)

    counts = passing(new)
    if counts[1]:
        before = passing(base)
        out.lines.append(Measure(group, "every point: replicas, exact-cell continuations", counts[1],
                                 before if before[1] else None, counts, None, counts[0] == counts[1]))
    out.reasons += [f"sweep gate: {j.message}" for record in ok_records(new) for j in _judgements(record, gates)
                    if j.failed]


def _counted_points(record: Record) -> dict[tuple[str, int], object]:
    """(axis, value) -> the record's headline comparison there, at each point whose premise held."""
    return {(p.axis, p.value): p.comparisons[sweep_report.HEADLINE] for p in sweep_report.points_of(record)
            if sweep_report.HEADLINE in p.comparisons and sweep_report.premise(p)[0] == sweep_report.HELD}


def _rates(out: Findings, group: Group, base: Rows, new: Rows, alpha: float) -> None:
    """The headline pair's continuation divergence at each (axis, value), paired by row where both runs hold the
    point and its premise held in both: exact McNemar, p < alpha a finding at the rates level, as the conversation's
    per-turn rates. One line per axis over every paired point, and one per value whose rows moved."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys()) if base[row].ok and new[row].ok]
    paired: dict[tuple[str, int], list[tuple[bool, bool]]] = defaultdict(list)
    apart = 0
    for b, n in both:
        before, after = _counted_points(b), _counted_points(n)
        common = {(p.axis, p.value) for p in sweep_report.points_of(b)} & {(p.axis, p.value)
                                                                           for p in sweep_report.points_of(n)}
        apart += len(common - (before.keys() & after.keys()))
        for point in sorted(before.keys() & after.keys()):
            paired[point].append((sweep_report.diverges(before[point], "suffix_divergence"),
                                  sweep_report.diverges(after[point], "suffix_divergence")))
    cell, name = "/".join(group), f"{sweep_report.HEADLINE} continuation divergence"
    failed: dict[str, int] = defaultdict(int)
    for (axis, value), pairs in sorted(paired.items()):
        x, y = [a for a, _ in pairs], [b for _, b in pairs]
        test = mcnemar_paired(x, y)
        if test.b + test.c:  # a value whose rows moved: its own line
            out.lines.append(Measure(group, f"{axis} {value} {name}", len(pairs), (sum(x), len(pairs)),
                                     (sum(y), len(pairs)), test.p, test.p >= alpha))
        if test.p < alpha:
            failed[axis] += 1
            out.finding("rates", group, f"{RATES_REASON}: {cell} {axis} {value} {name}: baseline "
                                        f"{sum(x)}/{len(pairs)}, new {sum(y)}/{len(pairs)} (baseline only {test.b}, "
                                        f"new only {test.c}), McNemar p = {test.p:.3g} < {alpha:g}")
    for axis in dict.fromkeys(axis for axis, _ in paired):
        pairs = [pair for (a, _), values in paired.items() if a == axis for pair in values]
        points = sum(a == axis for a, _ in paired)
        out.lines.append(Measure(group, f"{axis}: {name}, {points} values", len(pairs),
                                 (sum(x for x, _ in pairs), len(pairs)), (sum(y for _, y in pairs), len(pairs)), None,
                                 not failed[axis]))
    if apart:
        out.notes.append(f"{cell}: {apart} sweep points both runs hold not paired for the rates: their premise did not "
                         "hold in one run or both (vacuous), or lacks the headline pair")
