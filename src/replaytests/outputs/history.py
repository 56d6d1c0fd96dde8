"""Nightly history (issue 5): one JSON line per run, `replaytests.history/1`, and its table and plot.

`append` summarises a ledger as report.json does (Wilson objects of the headline divergences and of
the replicas, per family and precision) and adds the line atomically; a ledger already in the history
(same sha256) is refused. `table` and `page` show the runs in date order.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from replaytests.errors import ReplaytestsError, short
from replaytests.files import read_text, sha256_file, write_atomic
from replaytests.outputs import ledger, report
from replaytests.outputs import report_html as svg  # the report page's SVG drawing and HTML helpers
from replaytests.outputs.rundir import ledger_of

SCHEMA = "replaytests.history/1"
HEADER = ("date", "label", "family", "precision", "pair", "rows", "excluded", "replicas exact",
          *(name.replace("_", " ") for name in report.DIVERGENCES))


class HistoryError(ReplaytestsError):
    """A history file that cannot be read or appended to as given."""


def summarize(records: list[dict]) -> dict:
    """family -> precision -> rows, excluded, replicas_exact (where the family has replicas) and, per
    headline pair, the Wilson objects of its divergences: the report's numbers (docs/report.md)."""
    families = report.build_report(records, {})["families"]
    return {family: {precision: {"rows": s["rows"], "excluded": s["excluded"],
                                 **({"replicas_exact": s["replicas_exact"]} if "replicas_exact" in s else {}),
                                 "pairs": {pair: {name: s["pairs"][pair][name] for name in report.DIVERGENCES
                                                  if name in s["pairs"][pair]}
                                           for pair in summary["headline_pairs"] if pair in s["pairs"]}}
                     for precision, s in summary["precisions"].items()}
            for family, summary in families.items()}


def _date(text: str | None) -> str:
    if text is None:
        return datetime.now(UTC).isoformat(timespec="seconds")
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        raise HistoryError(f"--date {text!r}: expected an ISO 8601 date, e.g. 2026-01-31T02:00:00+00:00") from None


def entry(source: Path, label: str | None = None, date: str | None = None) -> dict:
    """The history line of one run (a ledger file or a run directory, with its run.json if present)."""
    path, run = ledger_of(Path(source)), report.read_run(source) or {}
    return {"schema": SCHEMA, "date": _date(date), "label": label, "ledger": str(path),
            "ledger_sha256": sha256_file(path), "contract": run.get("contract"), "platform": run.get("platform"),
            "families": summarize(report.collate([source]))}


def _parse(path: Path, text: str) -> list[dict]:
    return ledger.parse_versioned_jsonl(path, text, SCHEMA, HistoryError, _problem)


def _problem(entry_: dict) -> str | None:
    """What makes a history line unreadable (a field missing or of the wrong shape), or None."""
    for name, kind in (("date", str), ("ledger_sha256", str), ("families", dict)):
        if not isinstance(entry_.get(name), kind):
            return f"field {name!r} must be a {kind.__name__}, got {short(entry_.get(name))}"
    try:
        datetime.fromisoformat(entry_["date"])
    except ValueError:
        return f"field 'date' is not an ISO 8601 date: {short(entry_['date'])}"
    if entry_.get("label") is not None and not isinstance(entry_["label"], str):
        return f"field 'label' must be a string or null, got {short(entry_['label'])}"
    for family, precisions in entry_["families"].items():
        for precision, summary in (precisions.items() if isinstance(precisions, dict) else [(None, None)]):
            if not (isinstance(summary, dict) and isinstance(summary.get("rows"), int)
                    and isinstance(summary.get("excluded"), int) and isinstance(summary.get("pairs"), dict)):
                return f"families.{family}.{precision} must hold rows, excluded and pairs"
    return None


def read_history(path: Path) -> list[dict]:
    """The runs of a history file, in date order."""
    entries = _parse(path, read_text(path, "history", HistoryError))
    if not entries:
        raise HistoryError(f"{path}: empty history (no runs)")
    return sorted(entries, key=lambda e: e["date"])


def append(source: Path, into: Path, label: str | None = None, date: str | None = None) -> dict:
    """Add one run to the history (created if missing), atomically; the same ledger twice is refused."""
    text = read_text(into, "history", HistoryError) if Path(into).exists() else ""
    new = entry(source, label, date)
    if same := next((e for e in _parse(into, text) if e["ledger_sha256"] == new["ledger_sha256"]), None):
        raise HistoryError(f"{into}: this ledger is already in the history (run of {same['date']}, label "
                           f"{same['label']!r}, ledger sha256 {new['ledger_sha256'][:12]}...); not appended twice")
    try:
        write_atomic(Path(into), text + ("\n" if text and not text.endswith("\n") else "")
                     + json.dumps(new, sort_keys=True) + "\n")
    except OSError as exc:
        raise HistoryError(f"{into}: cannot write history: {exc.strerror or exc}") from None
    return new


def _lines(entries: list[dict]):
    """(entry, family, precision, pair or None, precision summary) in date order."""
    for e in entries:
        for family in report.ordered(e["families"], tuple(report.SHAPES)):
            for precision in report.ordered(e["families"][family], report.PRECISIONS):
                s = e["families"][family][precision]
                for pair in s["pairs"] or [None]:
                    yield e, family, precision, pair, s


def table(entries: list[dict]) -> report.Table:
    rows = tuple((e["date"][:16].replace("T", " "), e["label"] or "", family, precision, pair or "-", str(s["rows"]),
                  str(s["excluded"]), report.fmt_proportion(s.get("replicas_exact")),
                  *(report.fmt_proportion(s["pairs"].get(pair, {}).get(name)) for name in report.DIVERGENCES))
                 for e, family, precision, pair, s in _lines(entries))
    return report.Table("history", HEADER, rows, "k/n = rate [Wilson 95% CI] over the rows that passed every "
                                                 "fail-closed check; divergences compare the family's headline pair.")


def plot(title: str, points: list[tuple[str, dict]]) -> str:
    """Divergence rates of one family, precision and pair over runs: (date, {rate name: Wilson}) in order."""
    x = svg._scale(0, max(len(points) - 1, 1), svg.LEFT + 12, svg.WIDTH - svg.RIGHT - 12)
    y = svg._scale(0, 1, svg.HEIGHT - svg.BOTTOM, svg.TOP)
    colours = dict(zip(report.DIVERGENCES, svg.COLORS, strict=False))
    body = []
    for shift, (name, colour) in enumerate(colours.items(), start=-1):  # side by side, so equal rates stay visible
        measured = [(x(i) + 5 * shift, date, rates[name]) for i, (date, rates) in enumerate(points)
                    if rates.get(name, {}).get("n")]
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="'
                    + " ".join(f"{cx:.1f},{y(p['rate']):.1f}" for cx, _, p in measured) + '"/>')
        body += [f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(p["ci_low"]):.1f}" y2="{y(p["ci_high"]):.1f}" '
                 f'stroke="{colour}" stroke-opacity="0.6" stroke-width="2"/><circle cx="{cx:.1f}" '
                 f'cy="{y(p["rate"]):.1f}" r="3" fill="{colour}"><title>{escape(date)} {name}: '
                 f'{p["k"]}/{p["n"]}</title></circle>' for cx, date, p in measured]
    caption = f"{title}: divergence rates per run with Wilson 95% intervals, {len(points)} runs in date order."
    dates = [(x(i), points[i][0][:10]) for i in svg._ticks(0, len(points) - 1, 4)]
    frame = svg._frame([(y(t / 4), f"{25 * t}%") for t in range(5)], dates, "run date", "rows that diverge")
    legend = svg._legend([(name.split("_")[0], colour, "none") for name, colour in colours.items()])
    return svg._figure(svg._svg(caption, frame + "".join(body) + legend), caption)


def page(entries: list[dict]) -> str:
    """A standalone HTML page: one plot per family, precision and headline pair, then the table."""
    series: dict[str, list[tuple[str, dict]]] = {}
    for e, family, precision, pair, s in _lines(entries):
        if pair is not None:
            series.setdefault(f"{family} {precision} {pair}", []).append((e["date"], s["pairs"][pair]))
    figures = "".join(plot(title, points) for title, points in series.items())
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>replaytests history</title>'
            f"<style>{svg.STYLE}</style></head><body><h1>replaytests history</h1>{figures}"
            f"{svg._table(table(entries))}</body></html>\n")


def show(path: Path, html: Path | None = None) -> str:
    """The history as a text table; with `html`, also the page with its plots, written atomically."""
    entries = read_history(path)
    if html is not None:
        try:
            write_atomic(Path(html), page(entries))
        except OSError as exc:
            raise HistoryError(f"{html}: cannot write the history page: {exc.strerror or exc}") from None
    return report.plain(table(entries))
