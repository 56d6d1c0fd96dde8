"""Plots as inline SVG, drawn by hand (no plotting library, no scripts, no network).

Every plot is readable at the widths a report is read at (its viewBox scales to the column) and in
greyscale: series differ by marker shape and dash as well as by colour (colours of different
lightness). Labels are placed so they never overlap: categories on their own lines of a horizontal
plot, axis ticks thinned to the room they have. A plot of one value gets an axis around it, not a
bar filling the whole width. Every string from a ledger or a run is HTML-escaped.
"""

from __future__ import annotations

import math
from html import escape

from replaytests.outputs.stats import INTERVAL, Proportion

WIDTH = 640
FONT = 13  # px in the viewBox; the page's stylesheet gives the family
CHAR = 0.6 * FONT  # the width of an average character, for laying out labels
# (colour, marker, dash): dark blue, orange, green, purple: four lightness levels, four shapes, four dashes; then
# dark red with a triangle pointing down (a contract's fifth cell)
SERIES = (("#1d4f91", "circle", "none"), ("#e0822a", "square", "7 3"), ("#3a9a5b", "triangle", "2 3"),
          ("#6c3d91", "diamond", "9 3 2 3"), ("#9b2226", "down", "12 4"))
AXIS, GRID, INK = "#777", "#e6e6e6", "#333"


def scale(lo: float, hi: float, a: float, b: float):
    return lambda v: a + (v - lo) * (b - a) / ((hi - lo) or 1)


def ticks(lo: int, hi: int, count: int = 5) -> list[int]:
    """Integer ticks from lo to hi at a step of 1, 2 or 5 times a power of ten, at most about `count`."""
    rough = max(1.0, (hi - lo) / max(count, 1))
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return list(range(-(-lo // step) * step, hi + 1, step))


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above value (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def text(x: float, y: float, label: str, anchor: str = "middle", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{FONT}" fill="{INK}"{extra}>' \
           f"{escape(label)}</text>"


def marker(shape: str, x: float, y: float, colour: str, size: float = 4.5, tip: str = "") -> str:
    title = f"<title>{escape(tip)}</title>" if tip else ""
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size:.1f}" fill="{colour}">{title}</circle>'
    if shape == "square":
        s = size * 0.9
        return f'<rect x="{x - s:.1f}" y="{y - s:.1f}" width="{2 * s:.1f}" height="{2 * s:.1f}" fill="{colour}">' \
               f"{title}</rect>"
    points = ({"triangle": ((0, -1.2), (1.1, 0.8), (-1.1, 0.8)), "down": ((0, 1.2), (1.1, -0.8), (-1.1, -0.8))}
              .get(shape)
              or ((0, -1.25), (1.1, 0), (0, 1.25), (-1.1, 0)))
    d = "M" + "L".join(f"{x + dx * size:.1f} {y + dy * size:.1f}" for dx, dy in points) + "Z"
    return f'<path d="{d}" fill="{colour}">{title}</path>'


def legend(entries: list[tuple[str, int, str | None]], x: float, y: float, width: float) -> tuple[str, float]:
    """(label, series index, the dash of its line or None for a marker alone) per entry, left to right,
    wrapping at `width`: its SVG and height."""
    parts, cx, cy = [], x, y
    for label, index, dash in entries:
        line = dash is not None
        sample = 40 if line else 12  # a line long enough to show its dash on both sides of the marker
        span = sample + 8 + len(label) * CHAR + 18
        if cx + span > x + width and cx > x:
            cx, cy = x, cy + FONT + 8
        colour, shape, _ = SERIES[index % len(SERIES)]
        if line:
            parts.append(f'<line x1="{cx:.1f}" x2="{cx + sample:.1f}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="{colour}" '
                         f'stroke-width="2" stroke-dasharray="{dash}"/>')
        parts += [marker(shape, cx + sample / 2, cy, colour, 3.5),
                  text(cx + sample + 8, cy + FONT * 0.35, label, "start")]
        cx += span
    return "".join(parts), cy - y + FONT + 8


def svg(caption: str, width: float, height: float, body: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
            f'style="max-width:{width * 1.15:.0f}px"><title>{escape(caption)}</title>{body}</svg>')


def figure(svg_text: str, caption: str, wide: bool = False) -> str:
    return (f'<figure{" class=wide" if wide else ""}>{svg_text}<figcaption>{escape(caption)}</figcaption>'
            "</figure>")


class Frame:
    """A plot area with a left axis label margin, ticks and axis titles."""

    def __init__(self, left: float, top: float, width: float = WIDTH, plot_height: float = 200, bottom: float = 50):
        self.left, self.top, self.width = left, top, width
        self.right = width - 26  # room for the last tick's label
        self.bottom_y = top + plot_height
        self.height = self.bottom_y + bottom

    def axes(self, y_ticks: list[tuple[float, str]], x_ticks: list[tuple[float, str]], x_title: str,
             y_title: str) -> str:
        parts = [f'<line stroke="{GRID}" x1="{self.left}" x2="{self.right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                 + text(self.left - 6, y + FONT * 0.35, label, "end") for y, label in y_ticks]
        parts += [text(x, self.bottom_y + FONT + 6, label) for x, label in x_ticks]
        parts += [f'<path stroke="{AXIS}" fill="none" d="M{self.left} {self.top}V{self.bottom_y}H{self.right}"/>',
                  text((self.left + self.right) / 2, self.bottom_y + 2 * FONT + 12, x_title)]
        if y_title:
            middle = (self.top + self.bottom_y) / 2
            parts.append(text(FONT, middle, y_title, extra=f' transform="rotate(-90 {FONT} {middle:.1f})"'))
        return "".join(parts)


def drift_plot(title: str, series: dict[tuple[str, str], list[float]]) -> str | None:
    """Per-layer relative L2 drift on a log scale; series keyed (cell, "K" | "V"): cell by
    colour and marker, K solid and V dashed. None where every layer of every series is exact."""
    positive = [v for values in series.values() for v in values if v > 0]
    exact = [f"{p} {kv}" for (p, kv), values in series.items() if not any(v > 0 for v in values)]
    caption = f"{title}: per-layer K and V relative L2 drift, mean over rows (log scale)." + (
        " Layers with zero drift (bit-exact) are not drawn." if any(v <= 0 for vs in series.values() for v in vs)
        else "") + (f" Exact at every layer: {', '.join(exact)}." if exact else "")
    if not positive:
        return None
    lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
    hi += hi == lo
    layers = max(len(v) for v in series.values())
    cells = sorted({p for p, _ in series})
    dashes = {"K": "none", "V": "6 4"}
    entries = [(f"{p} {kv}", cells.index(p), dashes[kv]) for (p, kv), values in series.items()
               if any(v > 0 for v in values)]
    frame = Frame(left=58, top=12)
    key, key_height = legend(entries, frame.left, frame.height + 8, WIDTH - frame.left)
    x = scale(0, layers - 1, frame.left + 14, frame.right - 14) if layers > 1 else (
        lambda _: (frame.left + frame.right) / 2)
    y = scale(lo, hi, frame.bottom_y, frame.top)
    body = []
    for (cell, kv), values in series.items():
        colour, shape, _ = SERIES[cells.index(cell) % len(SERIES)]
        dash = dashes[kv]
        drawn = [(x(i), y(math.log10(v)), i, v) for i, v in enumerate(values) if v > 0]
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" points="'
                    + " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in drawn) + '"/>')
        body += [marker(shape, px, py, colour, 3.5, f"{cell} {kv} layer {i}: {v:.3g}") for px, py, i, v in drawn]
    axes = frame.axes([(y(d), f"1e{d}") for d in ticks(lo, hi, 6)],
                      [(x(i), str(i)) for i in ticks(0, layers - 1, 10)], "layer", "relative L2")
    return figure(svg(caption, WIDTH, frame.height + key_height + 4, axes + "".join(body) + key), caption)


def histogram(title: str, positions: list[int], bins: int = 20) -> str:
    """First-divergence positions: bins of whole tokens on an axis from 0 that fits them (at least 0-10)."""
    hi = nice_ceiling(max(max(positions) + 1, 10))
    width = max(1, math.ceil(hi / bins))
    counts = [0] * math.ceil(hi / width)
    for position in positions:
        counts[position // width] += 1
    frame = Frame(left=50, top=12, plot_height=160)
    x = scale(0, len(counts) * width, frame.left, frame.right)
    y = scale(0, max(counts), frame.bottom_y, frame.top)
    bars = "".join(f'<rect x="{x(i * width) + 1:.1f}" y="{y(c):.1f}" width="{x(width) - x(0) - 2:.1f}" '
                   f'height="{y(0) - y(c):.1f}" fill="{SERIES[0][0]}"><title>'
                   f"{i * width if width == 1 else f'{i * width}-{(i + 1) * width - 1}'}: {c} rows</title></rect>"
                   for i, c in enumerate(counts) if c)
    caption = (f"{title}: first-divergence position (suffix tokens after the boundary), {len(positions)} "
               f"row{'s' if len(positions) != 1 else ''}" + (f", bins of {width} tokens." if width > 1 else "."))
    axes = frame.axes([(y(c), str(c)) for c in ticks(0, max(counts), 4)],
                      [(x(t), str(t)) for t in ticks(0, len(counts) * width, 8)], "first divergence position",
                      "rows")
    return figure(svg(caption, WIDTH, frame.height, axes + bars), caption)


def interval_plot(caption: str, rows: list[tuple[tuple[str, ...], list[tuple[int, str, Proportion | None]]]],
                  measures: list[str]) -> str:
    """Proportions with Wilson intervals as horizontal dot-and-whisker lines: one band per row, its
    label (one or two lines) at the left, one line per (measure index, name, proportion) in it."""
    band = 12 + 14 * len(measures)
    left = 16 + CHAR * max(len(line) for label, _ in rows for line in label)
    width = max(WIDTH, left + 420)
    frame = Frame(left=left, top=8, width=width, plot_height=band * len(rows))
    key, key_height = legend([(name, i, None) for i, name in enumerate(measures)], left, frame.height + 8,
                             width - left)
    x = scale(0, 1, frame.left, frame.right)
    body = []
    for r, (label, points) in enumerate(rows):
        top = frame.top + r * band
        first = top + band / 2 + FONT * 0.35 - (FONT + 2) * (len(label) - 1) / 2
        body += [text(left - 8, first + (FONT + 2) * i, line, "end") for i, line in enumerate(label)]
        if r:
            body.append(f'<line x1="8" x2="{frame.right}" y1="{top:.1f}" y2="{top:.1f}" stroke="{GRID}"/>')
        for index, name, p in points:
            if not p or not p.n:
                continue
            colour, shape, _ = SERIES[index % len(SERIES)]
            cy = top + 13 + 14 * index
            body.append(f'<line x1="{x(p.ci_low):.1f}" x2="{x(p.ci_high):.1f}" y1="{cy:.1f}" y2="{cy:.1f}" '
                        f'stroke="{colour}" stroke-width="2"/>')
            body.append(marker(shape, x(p.rate), cy, colour, tip=f"{' '.join(label)} {name}: {p.k}/{p.n}"))
    grid = "".join(f'<line x1="{x(t / 4):.1f}" x2="{x(t / 4):.1f}" y1="{frame.top}" y2="{frame.bottom_y}" '
                   f'stroke="{GRID}"/>' for t in range(1, 5))
    axes = frame.axes([], [(x(t / 4), f"{25 * t}%") for t in range(5)], f"rows that diverge ({INTERVAL} interval)",
                      "")
    return figure(svg(caption, width, frame.height + key_height + 4, grid + axes + "".join(body) + key), caption,
                  wide=True)


def time_plot(caption: str, runs: list[str], series: dict[str, list[Proportion | None]],
              names: list[str] | None = None, x_title: str = "run", y_title: str = "rows") -> str:
    """Proportions over runs in order (or any ordered steps, named by `x_title`): a line and markers per measure,
    its Wilson interval as a band, on a y axis of `y_title`; x ticks name the runs by `runs` (as many as fit without
    overlapping), tooltips by `names` (default: the same)."""
    names_ = names or runs
    frame = Frame(left=54, top=12, plot_height=170)
    measures = list(series)
    entries = [(name, i, SERIES[i % len(SERIES)][2]) for i, name in enumerate(measures)]
    key, key_height = legend(entries, frame.left, frame.height + 8, WIDTH - frame.left)
    x = scale(0, max(len(runs) - 1, 1), frame.left + 16, frame.right - 16) if len(runs) > 1 else (
        lambda _: (frame.left + frame.right) / 2)
    y = scale(0, 1, frame.bottom_y, frame.top)
    body = []
    for index, name in enumerate(measures):
        colour, shape, dash = SERIES[index % len(SERIES)]
        points = [(i, p) for i, p in enumerate(series[name]) if p and p.n]
        if not points:
            continue
        band = [f"{x(i):.1f},{y(p.ci_high):.1f}" for i, p in points] + [
            f"{x(i):.1f},{y(p.ci_low):.1f}" for i, p in reversed(points)]
        body.append(f'<polygon points="{" ".join(band)}" fill="{colour}" fill-opacity="0.1" stroke="none"/>')
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" points="'
                    + " ".join(f"{x(i):.1f},{y(p.rate):.1f}" for i, p in points) + '"/>')
        body += [marker(shape, x(i), y(p.rate), colour, 4, f"{names_[i]} {name}: {p.k}/{p.n}")
                 for i, p in points]
    room = max(1, int((frame.right - frame.left) / (CHAR * max(map(len, runs)) + 16)) - 1)
    shown = ticks(0, len(runs) - 1, room) if len(runs) > 1 else [0]
    axes = frame.axes([(y(t / 4), f"{25 * t}%") for t in range(5)], [(x(i), runs[i]) for i in shown], x_title,
                      y_title)
    return figure(svg(caption, WIDTH, frame.height + key_height + 4, axes + "".join(body) + key), caption)


def cdf_plot(title: str, series: dict[str, dict], exact: list[str]) -> str:
    """The distribution of |delta logp| per pair (outputs/rollout_families.distribution) as the share of tokens at
    or below each value: a log axis of |delta logp| (evaluated at the bin edges) with a column of its own at the
    left for a delta of exactly 0, which a log axis cannot hold; the pairs bitwise equal at every token (`exact`)
    are named in the caption, not drawn."""
    lo = min(min(d["edges_log10"]) for d in series.values())
    hi = max(max(d["edges_log10"]) for d in series.values())
    lo, hi = math.floor(lo), max(math.ceil(hi), math.floor(lo) + 1)
    frame = Frame(left=58, top=12, plot_height=180)
    zero_x, log_left = frame.left + 20, frame.left + 56  # the zero column, then a gap, then the log axis
    entries = [(name, i, SERIES[i % len(SERIES)][2]) for i, name in enumerate(series)]
    key, key_height = legend(entries, frame.left, frame.height + 8, WIDTH - frame.left)
    x = scale(lo, hi, log_left, frame.right)
    y = scale(0, 1, frame.bottom_y, frame.top)
    body = [f'<line x1="{(zero_x + log_left) / 2:.1f}" x2="{(zero_x + log_left) / 2:.1f}" y1="{frame.top}" '
            f'y2="{frame.bottom_y}" stroke="{AXIS}" stroke-dasharray="2 3"/>']
    for index, (name, d) in enumerate(series.items()):
        colour, shape, dash = SERIES[index % len(SERIES)]
        share = d["zero"] / d["tokens"]
        points = [(zero_x, share, f"{name}: {d['zero']} of {d['tokens']} tokens with delta = 0 "
                                  f"({d['bitwise_equal']} bitwise equal)"), (x(d["edges_log10"][0]), share, "")]
        below = d["zero"]
        for edge, count in zip(d["edges_log10"][1:], d["counts"], strict=True):
            below += count
            points.append((x(edge), below / d["tokens"], f"{name}: {below} of {d['tokens']} tokens at or below "
                                                         f"{10 ** edge:.3g}"))
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" points="'
                    + " ".join(f"{px:.1f},{y(py):.1f}" for px, py, _ in points) + '"/>')
        body += [marker(shape, px, y(py), colour, 3.5, tip) for px, py, tip in points if tip]
    axes = frame.axes([(y(t / 4), f"{25 * t}%") for t in range(5)],
                      [(zero_x, "0"), *((x(d), f"1e{d}") for d in ticks(lo, hi, 6))], "|delta logp| (nats)",
                      "tokens at or below")
    caption = (f"{title}: share of response tokens with |delta logp| at or below each value (log axis; a delta of "
               "exactly 0 in its own column at the left)." + (f" Bitwise equal at every token: {', '.join(exact)}."
                                                               if exact else ""))
    return figure(svg(caption, WIDTH, frame.height + key_height + 4, axes + "".join(body) + key), caption)


def sweep_plot(caption: str, panels: list[tuple[str, dict[str, list[tuple[int, Proportion | None, str]]]]],
               edges: dict[int, str], x_title: str, y_title: str = "rows") -> str:
    """Proportions against a swept value on a linear axis, one panel per measure stacked over one x range: a line
    and markers per series (a cell), its Wilson interval as a band, `edges` (value -> the edge sitting there, in
    words) as dashed verticals in every panel. Each panel is (its heading, series -> (value, proportion, tooltip) per
    point); a point without a proportion (nothing counted there) is not drawn."""
    values = [v for _, series in panels for points in series.values() for v, _, _ in points]
    lo, hi = min(values), max(values)
    names = list(dict.fromkeys(name for _, series in panels for name in series))
    frames, top = [], 0
    for _ in panels:
        frames.append(Frame(left=54, top=top + FONT + 10, plot_height=130, bottom=50))
        top = frames[-1].height + 6
    key, key_height = legend([(name, i, SERIES[i % len(SERIES)][2]) for i, name in enumerate(names)], frames[0].left,
                             top + 4, WIDTH - frames[0].left)
    x = scale(lo, hi, frames[0].left + 16, frames[0].right - 16) if hi > lo else (
        lambda _: (frames[0].left + frames[0].right) / 2)
    room = max(1, int((frames[0].right - frames[0].left) / (CHAR * len(str(hi)) + 16)) - 1)
    body = []
    for frame, (heading, series) in zip(frames, panels, strict=True):
        y = scale(0, 1, frame.bottom_y, frame.top)
        body.append(text(frame.left, frame.top - 8, heading, "start"))
        body += [f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{frame.top}" y2="{frame.bottom_y}" stroke="{AXIS}" '
                 f'stroke-dasharray="2 3"><title>{escape(f"{v}: {label}")}</title></line>'
                 for v, label in sorted(edges.items()) if lo <= v <= hi]
        for name, points in series.items():
            index = names.index(name)
            colour, shape, dash = SERIES[index % len(SERIES)]
            drawn = sorted((v, p, tip) for v, p, tip in points if p and p.n)
            if not drawn:
                continue
            band = [f"{x(v):.1f},{y(p.ci_high):.1f}" for v, p, _ in drawn] + [
                f"{x(v):.1f},{y(p.ci_low):.1f}" for v, p, _ in reversed(drawn)]
            body.append(f'<polygon points="{" ".join(band)}" fill="{colour}" fill-opacity="0.1" stroke="none"/>')
            body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" points="'
                        + " ".join(f"{x(v):.1f},{y(p.rate):.1f}" for v, p, _ in drawn) + '"/>')
            body += [marker(shape, x(v), y(p.rate), colour, 3.5, f"{tip} {name}: {p.k}/{p.n}")
                     for v, p, tip in drawn]
        shown = ticks(lo, hi, room) if hi > lo else [lo]
        body.append(frame.axes([(y(t / 4), f"{25 * t}%") for t in range(5)], [(x(v), str(v)) for v in shown],
                               x_title, y_title))
    return figure(svg(caption, WIDTH, top + key_height + 8, "".join(body) + key), caption)
