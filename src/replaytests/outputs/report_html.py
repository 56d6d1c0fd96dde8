"""report.html: one standalone page (no network, no scripts) with inline SVG plots drawn by hand.

Plots: per-layer K and V drift of each headline pair (mean over rows, log scale, one line per
precision), first-divergence positions as histograms, and divergence rates with Wilson interval bars.
Every string that comes from a ledger or the run metadata is HTML-escaped.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 14, 44
COLORS = ("#1f5fa8", "#c8412b", "#2e8b57", "#7a4fa0", "#b8860b", "#555555")
RATES = ("suffix_divergence", "answer_divergence", "correctness_divergence")
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}td:first-child{white-space:nowrap}.note{color:#555;font-size:90%}
figure{margin:1em 0}figcaption{color:#555;font-size:90%}"""


def _scale(lo: float, hi: float, a: float, b: float):
    return lambda v: a + (v - lo) * (b - a) / ((hi - lo) or 1)


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-family="sans-serif" font-size="11" '
            f'fill="#333"{extra}>{escape(text)}</text>')


def _frame(y_ticks: list[tuple[float, str]], x_ticks: list[tuple[float, str]], x_label: str, y_label: str) -> str:
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM
    parts = [f'<line stroke="#e3e3e3" x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>'
             + _text(LEFT - 6, y + 4, label, "end") for y, label in y_ticks]
    parts += [_text(x, bottom + 16, label) for x, label in x_ticks]
    parts += [f'<path stroke="#888" fill="none" d="M{LEFT} {TOP}V{bottom}H{right}"/>',
              _text((LEFT + right) / 2, HEIGHT - 6, x_label),
              _text(14, (TOP + bottom) / 2, y_label, extra=f' transform="rotate(-90 14 {(TOP + bottom) / 2:.1f})"')]
    return "".join(parts)


def _legend(entries: list[tuple[str, str, str]]) -> str:
    """(label, colour, dash) per entry, stacked at the right of the plot."""
    x = WIDTH - RIGHT + 12
    return "".join(f'<line x1="{x}" x2="{x + 18}" y1="{TOP + 8 + 16 * i}" y2="{TOP + 8 + 16 * i}" stroke="{colour}" '
                   f'stroke-width="2" stroke-dasharray="{dash}"/>' + _text(x + 24, TOP + 12 + 16 * i, label, "start")
                   for i, (label, colour, dash) in enumerate(entries))


def _svg(title: str, body: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img"><title>{escape(title)}</title>{body}</svg>')


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _ticks(lo: int, hi: int, count: int = 5) -> list[int]:
    """Integer ticks from lo to hi at a step of 1, 2 or 5 times a power of ten, about `count` of them."""
    rough = max(1.0, (hi - lo) / count)
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return list(range(-(-lo // step) * step, hi + 1, step))


def drift_plot(title: str, series: dict[tuple[str, str], list[float]]) -> str:
    """Per-layer relative L2 drift on a log scale; series keyed (precision, "K" | "V")."""
    positive = [v for values in series.values() for v in values if v > 0]
    exact = [f"{p} {kv}" for (p, kv), values in series.items() if not any(v > 0 for v in values)]
    caption = f"{title}: per-layer K and V relative L2 drift, mean over rows (log scale)." + (
        " Layers with zero drift (bit-exact) are not drawn." if any(v <= 0 for vs in series.values() for v in vs)
        else "") + (f" Exact at every layer: {', '.join(exact)}." if exact else "")
    if not positive:
        return f"<p>{escape(caption)}</p>"
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    hi += hi == lo
    layers = max(len(v) for v in series.values())
    x = _scale(0, max(layers - 1, 1), LEFT + 8, WIDTH - RIGHT - 8)
    y = _scale(lo, hi, HEIGHT - BOTTOM, TOP)
    precisions = sorted({p for p, _ in series})
    body, legend = [], []
    for (precision, kv), values in series.items():
        colour, dash = COLORS[precisions.index(precision) % len(COLORS)], "5 3" if kv == "V" else "none"
        points = " ".join(f"{x(i):.1f},{y(math.log10(v)):.1f}" for i, v in enumerate(values) if v > 0)
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" '
                    f'points="{points}"/>')
        legend.append((f"{precision} {kv}", colour, dash))
    frame = _frame([(y(d), f"1e{d}") for d in _ticks(lo, hi)], [(x(i), str(i)) for i in _ticks(0, layers - 1, 8)],
                   "layer", "relative L2")
    return _figure(_svg(caption, frame + "".join(body) + _legend(legend)), caption)


def histogram(title: str, positions: list[int], bins: int = 20) -> str:
    width = max(1, math.ceil((max(positions) + 1) / bins))
    counts = [0] * math.ceil((max(positions) + 1) / width)
    for position in positions:
        counts[position // width] += 1
    x = _scale(0, len(counts) * width, LEFT, WIDTH - RIGHT)
    y = _scale(0, max(counts), HEIGHT - BOTTOM, TOP)
    bars = "".join(f'<rect x="{x(i * width) + 1:.1f}" y="{y(c):.1f}" width="{x(width) - x(0) - 2:.1f}" '
                   f'height="{y(0) - y(c):.1f}" fill="{COLORS[0]}"><title>{i * width}-{(i + 1) * width - 1}: {c}'
                   f"</title></rect>" for i, c in enumerate(counts) if c)
    caption = f"{title}: first-divergence position (suffix tokens after the boundary), {len(positions)} rows."
    frame = _frame([(y(c), str(c)) for c in _ticks(0, max(counts))],
                   [(x(t), str(t)) for t in _ticks(0, len(counts) * width, 8)], "first divergence position", "rows")
    return _figure(_svg(caption, frame + bars), caption)


def rate_plot(points: list[tuple[str, str, dict]]) -> str:
    """(category, rate name, Wilson proportion) as dots with interval bars, grouped by category."""
    categories = list(dict.fromkeys(c for c, _, _ in points))
    band = (WIDTH - RIGHT - LEFT) / len(categories)
    y = _scale(0, 1, HEIGHT - BOTTOM, TOP)
    body = []
    for category, name, p in points:
        if p["n"] == 0:
            continue
        cx = LEFT + band * (categories.index(category) + (RATES.index(name) + 1) / (len(RATES) + 1))
        colour = COLORS[RATES.index(name)]
        body.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(p["ci_low"]):.1f}" y2="{y(p["ci_high"]):.1f}" '
                    f'stroke="{colour}" stroke-width="2"/><circle cx="{cx:.1f}" cy="{y(p["rate"]):.1f}" r="3.5" '
                    f'fill="{colour}"><title>{escape(category)} {name}: {p["k"]}/{p["n"]}</title></circle>')
    caption = "Divergence rates per family and precision with Wilson 95% intervals (headline pairs)."
    frame = _frame([(y(t / 4), f"{25 * t}%") for t in range(5)],
                   [(LEFT + band * (i + 0.5), c) for i, c in enumerate(categories)], "", "rows that diverge")
    legend = _legend([(name.split("_")[0], COLORS[i], "none") for i, name in enumerate(RATES)])
    return _figure(_svg(caption, frame + "".join(body) + legend), caption)


def _headline(report: dict):
    """(family, pair, precision, pair summary) for each headline pair (every pair of an unknown family)."""
    for family, summary in report["families"].items():
        for precision, s in summary["precisions"].items():
            for pair in summary["headline_pairs"] or list(s["pairs"]):
                if pair in s["pairs"]:
                    yield family, pair, precision, s["pairs"][pair]


def plots(report: dict) -> list[str]:
    headline = list(_headline(report))
    drift: dict[str, dict] = {}
    for family, pair, precision, s in headline:
        for kv in ("K", "V"):
            if (values := s.get(f"{kv.lower()}_rel_l2_per_layer_mean")) is not None:
                drift.setdefault(f"{family} {pair}", {})[(precision, kv)] = values
    out = [drift_plot(title, series) for title, series in drift.items()]
    out += [histogram(f"{family} {pair} {precision}", s["first_divergence"]["positions"])
            for family, pair, precision, s in headline if _get_n(s.get("first_divergence"))]
    rates = [(f"{family} {precision}" + (f" {pair}" if len(report["families"][family]["headline_pairs"]) > 1 else ""),
              name, s[name]) for family, pair, precision, s in headline for name in RATES if name in s]
    return out + ([rate_plot(rates)] if rates else [])


def _get_n(spread: dict | None) -> int:
    return spread["n"] if spread else 0


def _meta(value) -> str:
    if isinstance(value, dict | list) and value:
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        return "<ul>" + "".join(f"<li>{'' if k is None else f'<b>{escape(str(k))}</b>: '}{_meta(v)}</li>"
                                for k, v in items) + "</ul>"
    return escape(str(value))


def _table(table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return f"<h2>{escape(table.title)}</h2><table><tr>{head}</tr>{rows}</table>{note}"


def page(report: dict, tables: list, summary: str, verdict_lines: list[str]) -> str:
    """The standalone HTML page: the verdict, run metadata, plots, then the same tables as report.md."""
    meta = _meta(report["meta"]) if report["meta"] else "<p>(no run metadata given)</p>"
    figures = plots(report)
    items = "".join(f"<li>{escape(line.strip())}</li>" for line in verdict_lines[1:])
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>replaytests report</title>'
            f"<style>{STYLE}</style></head><body><h1>replaytests report</h1>"
            f"<h2>{escape(verdict_lines[0])}</h2><ul>{items}</ul><h2>Run</h2>{meta}"
            f"<p>{escape(summary)}</p>" + ("<h2>Plots</h2>" + "".join(figures) if figures else "")
            + "".join(_table(t) for t in tables) + "</body></html>\n")
