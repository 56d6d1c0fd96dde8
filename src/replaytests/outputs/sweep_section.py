"""The edge sweep's own report section (docs/report.md): report.json's `sweeps` (per cell and axis, value by value,
outputs/sweep_report.py) and its part of every renderer: the replica layer's rows, the fidelity layer's tables and
lines, summary.md's and the terminal's table, report.html's plots. A report section module:
outputs/family_sections.py says what it holds; the family's registry record names it.
"""

from __future__ import annotations

from collections import defaultdict

from replaytests.outputs import plots, sweep_report
from replaytests.outputs.records import Record
from replaytests.outputs.stats import INTERVAL
from replaytests.outputs.tables import Table, first, fmt_proportion

TERMINAL = True  # its summary table is printed after a run too


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
