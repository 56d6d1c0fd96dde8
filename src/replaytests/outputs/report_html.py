"""report.html: one standalone page (no network, no scripts) in the report's order (outputs/sections.py):
the verdict, the headline table, one section per fidelity layer, the plots, the run details with every
input folded away. Every string that comes from a ledger or the run metadata is HTML-escaped.

Plots (outputs/plots.py): the divergence rates of every headline pair with their Wilson intervals,
per-layer K and V drift of each headline pair, first-divergence positions; then each report section's own figures
(outputs/family_sections.py: for the rollout families the distribution of |delta logp| of every pair per cell, for
the conversation family each headline pair's divergence by turn index, for the edge sweep each axis value by value).
"""

from __future__ import annotations

from html import escape

from replaytests.families.registry import FAMILIES
from replaytests.outputs import family_sections, plots, sections
from replaytests.outputs.shapes import DIVERGENCES
from replaytests.outputs.stats import INTERVAL
from replaytests.outputs.tables import html as html_table

STYLE = """body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:80em;
padding:0 1.2em;color:#222}
h1{font-size:1.6em;margin:.2em 0 .4em}h2{font-size:1.3em;margin:1.6em 0 .3em;border-bottom:1px solid #ddd}
h3{font-size:1.05em;margin:1.2em 0 .3em}
.verdict{border-left:6px solid #888;background:#f6f6f6;padding:.4em 1em;margin:.5em 0 1em}
.verdict h2{border:0;margin:.2em 0}.verdict ul{margin:.2em 0;padding-left:1.2em}
.verdict.pass{border-color:#2e7d32;background:#eef7ee}.verdict.fail{border-color:#c62828;background:#fbeeee}
.verdict.interrupted{border-color:#b26a00;background:#fbf4e8}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #d4d4d4;padding:.2em .6em;text-align:left;
white-space:nowrap;font-variant-numeric:tabular-nums}th{background:#f2f2f2;white-space:normal;vertical-align:bottom}
td.long{white-space:normal;min-width:16em}
.note,figcaption{color:#555;font-size:.9em}
details{margin:.5em 0}summary{cursor:pointer;color:#1d4f91}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,34em),1fr));gap:1em 2em}
figure{margin:0}figure.wide{grid-column:1/-1}figure svg{width:100%;height:auto;display:block}
svg text{font-family:inherit}"""


def shell(title: str, body: str) -> str:
    """A standalone page: the stylesheet inline, nothing fetched."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")


def _nested(value) -> str:
    if isinstance(value, dict | list) and value:
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        return "<ul>" + "".join(f"<li>{'' if k is None else f'<b>{escape(str(k))}</b>: '}{_nested(v)}</li>"
                                for k, v in items) + "</ul>"
    return escape(str(value))


def folded(summary: str, inner: str) -> str:
    return f"<details><summary>{escape(summary)}</summary>{inner}</details>"


def _headline(report: dict):
    """(family, pair, cell, pair summary) for each headline pair (the registry's; every pair of a
    family it does not know)."""
    for family, summary in report["families"].items():
        pairs = FAMILIES[family].headline if family in FAMILIES else ()
        for cell, s in summary["precisions"].items():
            for pair in pairs or list(s["pairs"]):
                if pair in s["pairs"]:
                    yield family, pair, cell, s["pairs"][pair]


def report_plots(report: dict) -> tuple[list[str], list[str]]:
    """The figures, and the pairs whose drift plot has nothing to draw (exact at every layer)."""
    headline = list(_headline(report))
    names = [name.split("_")[0] for name in DIVERGENCES]
    pairs = {family: {p for f, p, _, _ in headline if f == family} for family, _, _, _ in headline}
    rows = [((f"{family} {cell}",) + ((pair,) if len(pairs[family]) > 1 else ()),  # the pair where it has several
             [(i, names[i], s.get(name)) for i, name in enumerate(DIVERGENCES)])
            for family, pair, cell, s in headline]
    figures = [plots.interval_plot(f"Divergence of each family's headline pair, per precision, with {INTERVAL} "
                                   "intervals.", rows, names)] if rows else []
    drift: dict[str, dict] = {}
    for family, pair, cell, s in headline:
        for kv in ("K", "V"):
            if (values := s.get(f"{kv.lower()}_rel_l2_per_layer_mean")) is not None:
                drift.setdefault(f"{family} {pair}", {})[(cell, kv)] = values
    drawn = {title: plots.drift_plot(title, series) for title, series in drift.items()}
    figures += [figure for figure in drawn.values() if figure]
    figures += [plots.histogram(f"{family} {pair} {cell}", s["first_divergence"]["positions"])
                for family, pair, cell, s in headline if (s.get("first_divergence") or {}).get("n")]
    figures += [figure for module in family_sections.modules() for figure in module.figures(report)]
    return figures, [title for title, figure in drawn.items() if figure is None]


def page(report: dict) -> str:
    head, lines = sections.verdict_head(report)
    result = report["verdict"].result if report["verdict"] is not None else "unknown"
    body = [f"<h1>{escape(sections.title(report))}</h1>",
            f'<section class="verdict {escape(result)}"><h2>{escape(head)}</h2><ul>'
            + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul></section>"]
    for number, section in enumerate(sections.sections(report)):
        body.append(f"<h2>{f'{number}. ' if number else ''}{escape(section.title)}</h2>")
        body += [f"<p>{escape(section.text)}</p>"] if section.text else []
        body += [html_table(table) for table in section.tables]
        body += ["<ul>" + "".join(f"<li>{escape(line)}</li>" for line in section.lines) + "</ul>"] if section.lines \
            else []
        body += [folded(table.title, html_table(table, 0)) for table in section.folded]
    figures, undrawn = report_plots(report)
    if figures or undrawn:
        body.append('<h2>Plots</h2><div class="plots">' + "".join(figures) + "</div>"
                    + (f'<p class="note">Per-layer drift not drawn, bit-exact at every layer and precision: '
                       f'{escape("; ".join(undrawn))}.</p>' if undrawn else ""))
    body.append(html_table(sections.details(report), 2))
    body.append(folded("Every input", _nested(report["meta"]) if report.get("meta") else
                       "<p>(no run metadata given)</p>"))
    return shell(sections.title(report), "".join(body))
