"""The report in the paper's shape (docs/report.md): what report.md and report.html show, in order.

The verdict; the headline table (one line per family and cell); one section per fidelity layer
with its tables (the live matrix, the 2x2 crossing, the bridge, the ledger audit, the transplant and
the replication as the paper's Tables 5 and 6); then (report.html) the plots; then the run details as
a compact table, with every input folded away. Everything is rendered from report.json alone, so the
three files cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from replaytests.backends import declarations
from replaytests.families.registry import FAMILIES, LAYERS
from replaytests.files import lookup
from replaytests.outputs import (
    causal,
    family_sections,
    runs,
    serving,
    verdict,
)
from replaytests.outputs.flips import Flips
from replaytests.outputs.records import KEY_FIELDS
from replaytests.outputs.shapes import DIVERGENCES, NO_REPLICAS, SHAPES, replica_counts, runtime
from replaytests.outputs.stats import INTERVAL, LEVEL
from replaytests.outputs.summary import HEADLINE_PAIRS
from replaytests.outputs.tables import Table, fmt_number, fmt_proportion, md_cell
from replaytests.outputs.tables import markdown as md_table


@dataclass(frozen=True)
class Section:
    title: str
    text: str = ""  # what the section checks
    tables: tuple[Table, ...] = ()
    lines: tuple[str, ...] = ()  # findings in words, after the tables
    folded: tuple[Table, ...] = ()  # the detail a reader opens on demand


def title(report: dict) -> str:
    name = lookup(report.get("meta") or {}, "contract", "name")
    return "replaytests report" + (f": {name}" if name else "")


def verdict_head(report: dict) -> tuple[str, list[str]]:
    """The verdict's first line (PASS/FAIL and the test counts) and its other lines."""
    if report["verdict"] is None:
        return "Verdict not recorded", ["these records were collated from ledgers: no test outcomes"]
    lines = verdict.lines(report["verdict"])
    return lines[0].removeprefix("verdict: "), [line.strip() for line in lines[1:]]


def sections(report: dict) -> list[Section]:
    """The headline, then one section per fidelity layer, then families this version does not know."""
    causal_tables = tuple(table for cell, summaries in (report.get("causal_cells") or {}).items()
                          for table in _causal_tables(summaries, cell))
    out = [_headline(report), _replica(report), _token_identity(report), _fidelity(report),
           Section(*LAYERS["causal"], causal_tables,
                   () if causal_tables else ("Not in this run: the transplant runs on the BF16 crossing's divergent "
                                             "rows, the replication on a later checkpoint (--replication-model).",))]
    unknown = [f for f in report["families"] if f not in SHAPES and f not in FAMILIES]
    if unknown:
        out.append(Section("Other families", "Families this version of replaytests does not know: every pair.",
                           tuple(_pairs_table(f, report["families"][f]) for f in unknown)))
    return out


# ---- the headline ----

HEADLINE_NOTE = ("k/n over the rows that passed every fail-closed check; cache and divergence columns compare each "
                 f"family's headline pair ({HEADLINE_PAIRS}).")


def _headline(report: dict) -> Section:
    headline = report.get("headline") or {}
    tables = [Table("", tuple(headline.get("columns", ())),
                    tuple(map(tuple, headline.get("rows", ()))), HEADLINE_NOTE)] if headline.get("rows") else []
    if report["excluded"]:
        fields = (*KEY_FIELDS, "reason")
        tables.append(Table("Excluded rows (fail-closed checks; in no denominator)", fields,
                            tuple(tuple(str(e.get(f, "")) for f in fields) for e in report["excluded"])))
    return Section("Headline: every family and precision", tables=tuple(tables), lines=(summary_line(report),))


def summary_line(report: dict) -> str:
    stats, counts = report["statistics"], report["records"]
    return (f"Records: {counts['total']} ({counts['ok']} ok, {counts['excluded']} excluded). "
            f"Intervals: Wilson {100 * stats['level']:g}%; paired tests: exact McNemar; bootstrap: "
            f"{stats['bootstrap_resamples']} resamples, seed {stats['bootstrap_seed']}.")


# ---- layer 1: replica stability ----

def _replica(report: dict) -> Section:
    rows = []
    for family, summary in report["families"].items():
        if family in SHAPES:
            rows += [(*row, fmt_proportion(exact)) for *row, exact in replica_counts(family, summary)]
    rows += [row for module in family_sections.modules() for row in module.replica_rows(report)]
    rows += [row for cell, summaries in (report.get("causal_cells") or {}).items()
             for family, outcome in causal.outcomes().items() if family in summaries
             for row in outcome.replica_rows(family, cell, summaries[family])]
    table = Table("Replica pairs bit-exact (cache, logits and suffix)", ("family", "precision", "pair", "bit exact"),
                  tuple(rows))
    v = report["verdict"]
    if v is None:
        audit = ["Ledger audit: not recorded (these records were collated from ledgers)"]
    else:
        baseline = v.line("baseline")
        audit = [f"Ledger audit: baseline {baseline}" if baseline else
                 "Ledger audit: no baseline given (pass --baseline LEDGER)",
                 *(f"Platform drift: {line}" for line in v.lines_of("platform_drift"))]
    return Section(LAYERS["replica"][0], LAYERS["replica"][1], (table,) if rows else (), tuple(audit))


# ---- layer 2: token identity ----

def _token_identity(report: dict) -> Section:
    rows = tuple((family, cell, str(s["rows"]), str(s["excluded"]), fmt_proportion(s.get("z_matches_bank")))
                 for family, summary in report["families"].items() for cell, s in summary["precisions"].items())
    table = Table("Records per family and precision", ("family", "precision", "rows", "excluded",
                                                        "live z matches the bank"), rows,
                  "The bank is frozen at one precision: live generation at another need not reach its z.")
    return Section(*LAYERS["token_identity"], (table,))


# ---- layer 3: live-state fidelity ----

class Line(NamedTuple):
    """One line of a headline table: its label, what it shows of one cell's summary, the reduction key."""

    label: str
    cell: Callable[[dict, str], str]
    reduction: str | None = None


def _pair_cell(name: str, fmt: Callable = fmt_proportion, *path: str) -> Callable[[dict, str], str]:
    return lambda s, pair: fmt(lookup(s, "pairs", pair, name, *path))


def _rel_l2(s: dict, pair: str) -> str:
    cells = [fmt_number(lookup(s, "pairs", pair, name, "median")) for name in ("k_rel_l2", "v_rel_l2")]
    return "-" if cells == ["-", "-"] else " / ".join(cells)


def fmt_paired(test: dict | None) -> str:
    if test is None:
        return "-"
    d, m = test["difference"], test["mcnemar"]
    if d.n == 0:
        return "no paired rows"
    return (f"{100 * d.diff:+.1f} pp [{100 * d.ci_low:+.1f}, {100 * d.ci_high:+.1f}], p = {m.p:.3g}; "
            f"{test['x']} only {m.b}, {test['y']} only {m.c} ({d.n} rows)")


def fmt_positions(spread: dict | None) -> str:
    if spread is None:
        return "-"
    if spread["n"] == 0:
        return "none diverge"
    return f"{spread['median']:g} ({spread['min']:g}-{spread['max']:g}), n = {spread['n']}"


def _replicas(summary: dict) -> str:
    """A cell's replica count; a null count (ok records with no replica pair) is a missing check."""
    missing = "replicas_exact" in summary and summary["replicas_exact"] is None
    return NO_REPLICAS if missing else fmt_proportion(summary.get("replicas_exact"))


HEADLINE_LINES = (
    Line("rows ok / excluded", lambda s, pair: f"{s['ok']} / {s['excluded']}"),
    Line("replicas exact (cache, logits, suffix)", lambda s, pair: _replicas(s)),
    Line("live z matches the bank", lambda s, pair: fmt_proportion(s.get("z_matches_bank"))),
    Line("bit exact (cache, logits, suffix)", _pair_cell("bit_exact")),
    Line("cache exact", _pair_cell("cache_exact")),
    Line("logits exact", _pair_cell("logits_exact")),
    Line("boundary argmax differs", _pair_cell("argmax_differs")),
    Line("cache max |Δ| (max over rows)", _pair_cell("cache_max_abs", fmt_number, "max")),
    Line("cache rel. L2, K / V (median over rows)", _rel_l2),
    Line("logits max |Δ| (max over rows)", _pair_cell("logits_max_abs", fmt_number, "max")),
    Line("suffix steps bitwise exact (top-k logits)", _pair_cell("steps_exact")),
    Line("suffix steps max |Δ logit| (max over rows)", _pair_cell("steps_max_abs", fmt_number, "max")),
    *(Line(name.replace("_", " "), _pair_cell(name), name) for name in DIVERGENCES),
    Line("first divergence, median (range)", _pair_cell("first_divergence", fmt_positions)),
)
TABLE_NOTE = (f"k/n = rate [{INTERVAL} CI]; paired differences: percentile bootstrap {100 * LEVEL:g}% CI in percentage "
              "points, exact McNemar p and the discordant rows.")


def _accuracy_lines(first: str, second: str) -> list[Line]:
    return [*(Line(f"accuracy {arm}", lambda s, pair, a=arm: fmt_proportion(lookup(s, "accuracy", "arms", a)))
              for arm in (first, second)),
            Line(f"accuracy {second} - {first}, paired", lambda s, pair: fmt_paired(s.get("accuracy")))]


def _headline_table(family: str, pair: str, summary: dict) -> Table:
    cells = list(summary["precisions"])
    reductions = lookup(summary, "reductions", pair) or []
    accuracy = SHAPES[family].accuracy
    lines = [*HEADLINE_LINES, *(_accuracy_lines(*accuracy) if accuracy else ())]
    rows = [(line.label, *(line.cell(summary["precisions"][p], pair) for p in cells),
             *(fmt_paired(r["metrics"].get(line.reduction)) if line.reduction else "" for r in reductions))
            for line in lines]
    header = ("", *cells, *(f"{r['from']} → {r['to']} (paired rows)" for r in reductions))
    name = FAMILIES[family].title if family in FAMILIES else family
    return Table(f"{name}" + (f": {pair}" if len(SHAPES[family].headline) > 1 else ""), header,
                 tuple(r for r in rows if any(c not in ("-", "") for c in r[1:])), TABLE_NOTE)


PAIR_COLUMNS = ("precision", "pair", "rows", "cache exact", "logits exact", "suffix divergence", "answer divergence",
                "correctness divergence", "cache max |Δ|", "first divergence")


def _pairs_table(family: str, summary: dict) -> Table:
    rows = tuple(
        (cell, pair, str(s["rows"]), *(fmt_proportion(s.get(n)) for n in ("cache_exact", "logits_exact",
                                                                                 *DIVERGENCES)),
         fmt_number(lookup(s, "cache_max_abs", "max")), fmt_positions(s.get("first_divergence")))
        for cell, p in summary["precisions"].items() for pair, s in p["pairs"].items())
    return Table(f"{family}: every pair", PAIR_COLUMNS, rows)


def _fidelity(report: dict) -> Section:
    tables, folded = [], []
    for family, summary in report["families"].items():
        if family not in SHAPES:
            continue
        if family == serving.FAMILY and report.get(serving.FAMILY):
            tables.append(_serving_premise(report))
        tables += [_headline_table(family, pair, summary) for pair in summary["headline_pairs"]]
        pairs = {pair for p in summary["precisions"].values() for pair in p["pairs"]}
        if pairs - set(summary["headline_pairs"]):
            folded.append(_pairs_table(family, summary))
    if report.get("flips"):
        tables.append(_flips_table(report["flips"]))
    lines = []
    for module in family_sections.modules():
        shown, hidden, said = module.fidelity(report)
        tables += shown
        folded += hidden
        lines += said
    return Section(*LAYERS["fidelity"], tuple(tables), tuple(lines), folded=tuple(folded))


FLIP_COLUMNS = ("family", "precision", "pair", "suffixes diverge", "exact tie", "within one BF16 step",
                "clearly apart", "clear-margin flips (margins)", "threshold catching every flip",
                "steps at or below it")


def _flips_table(found: dict[str, dict[str, dict[str, Flips]]]) -> Table:
    """Every flip in the run attributed to its margin (outputs/flips.py)."""
    rows = []
    for family, cells in found.items():
        for cell, pairs in cells.items():
            for pair, f in pairs.items():
                unknown = f.bins["unknown"].k
                rows.append((family, cell, pair, f"{f.divergent}/{f.rows}",
                             *(fmt_proportion(f.bins[name]) for name in ("tie", "bf16_step", "apart")),
                             ", ".join(f"{a.row} ({' / '.join(f'{m:g}' for m in a.margins)})"
                                       for a in f.apart_rows) or ("none" if not unknown else f"{unknown} unknown"),
                             f"{f.threshold:g} ({f.reference})",
                             fmt_proportion(f.trigger_rate) if f.trigger_rate else "not recorded"))
    return Table("Flips attributed to their margins", FLIP_COLUMNS, tuple(rows),
                 "Each divergence binned by the top-1 minus top-2 masked logit margin at the first difference, in "
                 "both constructions: an exact tie in either (broken differently), within one BF16 step of the "
                 "top-1 logit in either (a near tie), or clearly apart in both (a change of preference, the row "
                 "named). The threshold is the largest margin at which the pair's first construction flipped: a "
                 "margin-triggered verifier needs at least it, and would re-check the share of that construction's "
                 "decode steps (with a choice) shown last.")


def _counts(counts: dict) -> str:
    if not counts or not counts["n"]:
        return "-"
    return f"{counts['median']:g} ({counts['min']:g}-{counts['max']:g})"


SERVING_LINES = (
    ("rows ok", lambda s: str(s["rows"])),
    ("prefix hit reused a live-decoded block", lambda s: fmt_proportion(s["hit_covers_decode"])),
    ("tokens the hit read from the cache, median (range)", lambda s: _counts(s["hit_cached_tokens"])),
    ("of them past the prompt block's full blocks", lambda s: _counts(s["hit_past_prompt_block"])),
    ("chunked prefill split by the scheduler", lambda s: fmt_proportion(s["chunked_split"])),
    ("scheduler steps of the chunked prefill", lambda s: _counts(s["chunked_steps"])),
    ("fresh requests that read the cache", lambda s: ", ".join(s["fresh_read_cache"]) or "none"),
)


def _serving_premise(report: dict) -> Table:
    """The engine's own counters behind the serving family's comparisons, with the runtime's settings (its
    Declaration's `report_settings` in the run's platform)."""
    premise = report[serving.FAMILY]
    meta = report.get("meta") or {}
    declared = declarations().get(runtime(meta))
    title, docs = (declared.label(), declared.docs) if declared else (runtime(meta), "README.md")
    settings = lookup(meta, "platform", declared.report_settings) if declared and declared.report_settings else None
    shown = (", ".join(f"{name} {value}" for name, value in settings.items() if value is not None)
             if isinstance(settings, dict) else "not recorded")
    return Table("Serving engine: what the engine counted (the premise of each comparison)",
                 ("", *premise), tuple((label, *(cell(s) for s in premise.values())) for label, cell in SERVING_LINES),
                 f"Runtime: {title} {shown}. A hit that reused no live-decoded block, or a chunked prefill in one "
                 f"step, is vacuous: recorded as such, never counted as fidelity ({docs}).")


# ---- layer 4: causal state sufficiency ----

def _causal_tables(summaries: dict, cell: str) -> list[Table]:
    """A cell's tables of each causal family it holds (its outcome module's: Tables 5 and 6)."""
    return [table for family, outcome in causal.outcomes().items() if family in summaries
            for table in outcome.tables(family, cell, summaries[family])]


# ---- the run details ----

def _short(digest) -> str:
    return f"sha256 {digest[:12]}…" if isinstance(digest, str) else "-"


def details(report: dict) -> Table:
    """The run in one compact table: what ran, on what, with which inputs, when."""
    meta = report.get("meta") or {}
    options, manifest, run = meta.get("options") or {}, meta.get("manifest") or {}, meta.get("run") or {}
    contract = meta.get("contract") or {}
    cpu = meta.get("cpu_isa") or {}
    rows = [
        ("contract", f"{contract['name']} ({_short(contract.get('sha256'))}, {contract.get('path')})"
         if contract.get("name") else None),
        ("platform", runs.describe_platform(meta["platform"]) if isinstance(meta.get("platform"), dict) else None),
        ("cpu_isa", (f"{cpu.get('contract')}, " + ("applied" if cpu.get("applied") else "not applied")
                     + (f" ({cpu['note']})" if cpu.get("note") else "")) if cpu else None),
        ("bank", f"{options.get('bank', '-')} ({_short(manifest.get('bank_sha256'))})" if manifest else None),
        ("model", f"{options.get('model', '-')} ({_short(manifest.get('model_sha256'))})" if manifest else None),
        ("tokenizer", _short(manifest.get("tokenizer_sha256")) if manifest else None),
        ("selection", ", ".join(f"--{name.replace('_', '-')} {options[name]}" for name in ("precision", "rows", "shard")
                                if options.get(name)) or None),
        ("run", ", ".join(f"{name} {run[name]}" for name in ("name", "started", "finished") if run.get(name))
         + (f", {run['seconds']:.0f} s" if isinstance(run.get("seconds"), int | float) else "")
         + (", INTERRUPTED" if run.get("interrupted") else "") if run else None),
        *((name, value) for name, value in (meta.get("environment") or {}).items() if isinstance(value, str)),
        ("ledgers", ", ".join(meta["ledgers"]) if meta.get("ledgers") else None),
        ("runs", f"{len(meta['runs'])} runs with different inputs (see every input)" if meta.get("runs") else None),
    ]
    return Table("Run details", ("field", "value"), tuple((name, str(value)) for name, value in rows if value))


# ---- report.md ----

def _md_nested(value, indent: int = 0) -> list[str]:
    pad = "  " * indent
    items = value.items() if isinstance(value, dict) else enumerate(value)
    lines = []
    for name, item in items:
        label = f"**{md_cell(str(name))}**: " if isinstance(value, dict) else ""
        if isinstance(item, dict | list) and item:
            lines += [f"{pad}- {label}".rstrip(), *_md_nested(item, indent + 1)]
        else:
            lines.append(f"{pad}- {label}{md_cell(str(item))}")
    return lines


def markdown(report: dict) -> str:
    """report.md: the verdict, the headline, the layers, then the run details with every input folded."""
    head, verdict_lines = verdict_head(report)
    lines = [f"# {md_cell(title(report))}", "", f"## {md_cell(head)}", "",
             *(f"- {md_cell(line)}" for line in verdict_lines), ""]
    for number, section in enumerate(sections(report)):
        lines += [f"## {f'{number}. ' if number else ''}{md_cell(section.title)}", ""]
        lines += [section.text, ""] if section.text else []
        for table in section.tables:
            lines += md_table(table)
        lines += [*(f"- {md_cell(line)}" for line in section.lines), ""] if section.lines else []
        for table in section.folded:
            lines += [f"<details><summary>{md_cell(table.title)}</summary>", "", *md_table(table, 0), "</details>", ""]
    lines += ["## Plots", "", "report.html beside this file draws the per-layer drift, the first-divergence "
              "positions and the divergence rates.", ""]
    lines += md_table(details(report), 2)
    meta = report.get("meta") or {}
    lines += ["<details><summary>Every input</summary>", "", *(_md_nested(meta) or ["- (no run metadata given)"]),
              "", "</details>", ""]
    return "\n".join(lines)
