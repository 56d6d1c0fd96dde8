"""The report (docs/report.md): report.json, its Markdown twin report.md and report.html with plots.

`build_report` turns ledger records into the report.json content; the Markdown and HTML tables are
rendered from that content alone, so the three files cannot disagree. Excluded rows are listed with
their reasons and never enter a denominator.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from replaytests.errors import ConfigError, LedgerError, short
from replaytests.families.registry import FAMILIES
from replaytests.files import write_atomic, write_json_atomic
from replaytests.inputs.contract import PRECISIONS  # reductions are BF16 -> FP32 on the rows present at both
from replaytests.inputs.gates import BIT_EXACT, bit_exact, replicas_exact
from replaytests.outputs import causal, ledger, verdict
from replaytests.outputs.report_html import page
from replaytests.outputs.rundir import ledger_of
from replaytests.outputs.stats import (
    LEVEL,
    RESAMPLES,
    SEED,
    McNemar,
    mcnemar_exact,
    paired_bootstrap,
    proportion,
    wilson,
)

SCHEMA = "replaytests.report/1"
REPORT_FILES = ("report.json", "report.md", "report.html")


@dataclass(frozen=True)
class Shape:
    """How the report reads a family: which pairs are its result and which must be exact."""

    headline: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()
    accuracy: tuple[str, str] | None = None  # (first, second): difference = second - first
    reductions: bool = False


# From the family registry (the report reads the ledger format, not the engine): families with a headline
# table; the causal ones have tables of their own, and families it does not know are rendered generically.
SHAPES = {f.name: Shape(f.headline, f.replicas, f.accuracy, f.reductions) for f in FAMILIES.values()
          if f.headline_table}
CAUSAL = ("transplant", "replication")
# report name: (comparison field, whether the count is of rows where the field is false)
FLAGS = {
    "cache_exact": ("cache_exact", False),
    "logits_exact": ("logits_exact", False),
    "argmax_differs": ("argmax_equal", True),
    "suffix_divergence": ("suffix_equal", True),
    "answer_divergence": ("answer_equal", True),
    "correctness_divergence": ("correct_equal", True),
}
DIVERGENCES = ("suffix_divergence", "answer_divergence", "correctness_divergence")
# report name: the comparison fields whose per-row maximum it summarises
SPREADS = {"cache_max_abs": ("k_max_abs", "v_max_abs"), "k_rel_l2": ("k_rel_l2",), "v_rel_l2": ("v_rel_l2",),
           "logits_max_abs": ("logits_max_abs",)}
PER_LAYER = ("k_rel_l2_per_layer", "v_rel_l2_per_layer")


def _has(comps: list[dict], *fields: str) -> bool:
    """A metric is reported only when every comparison of the pair carries its fields."""
    return bool(comps) and all(c.get(f) is not None for c in comps for f in fields)


def _spread(values: list[float], positions: bool = False) -> dict:
    """n, median, mean, min and max (null when n = 0); with `positions`, the sorted values themselves."""
    a = np.asarray(values, dtype=float)
    out: dict = {"n": len(a), "median": None, "mean": None, "min": None, "max": None}
    if len(a):
        out |= {"median": float(np.median(a)), "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}
    if positions:
        out["positions"] = sorted(int(v) for v in values)
    return out


def _pair(comps: list[dict]) -> dict:
    out: dict = {"rows": len(comps)}
    out |= {name: proportion(comps, lambda c, f=field, neg=negate: c[f] != neg)
            for name, (field, negate) in FLAGS.items() if _has(comps, field)}
    if _has(comps, *BIT_EXACT):
        out["bit_exact"] = proportion(comps, bit_exact)
    out |= {name: _spread([max(c[f] for f in fields) for c in comps])
            for name, fields in SPREADS.items() if _has(comps, *fields)}
    if _has(comps, "suffix_equal") and all("first_divergence" in c for c in comps):
        out["first_divergence"] = _spread([c["first_divergence"] for c in comps
                                           if not c["suffix_equal"] and c["first_divergence"] is not None], True)
    for name in PER_LAYER:
        if _has(comps, name) and len({len(c[name]) for c in comps}) == 1:
            out[f"{name}_mean"] = np.mean([c[name] for c in comps], axis=0).tolist()
    return out


def mcnemar_paired(x: list[bool], y: list[bool]) -> McNemar:
    """Exact McNemar on paired binary outcomes: b counts the rows where only x holds, c where only y."""
    return mcnemar_exact(sum(a and not b for a, b in zip(x, y, strict=True)),
                         sum(b and not a for a, b in zip(x, y, strict=True)))


def _paired(names: tuple[str, str], x: list[bool], y: list[bool]) -> dict:
    """mean(x) - mean(y) over paired rows with its bootstrap interval, and McNemar on (x only, y only)."""
    return {"x": names[0], "y": names[1], "difference": paired_bootstrap(x, y).to_json(),
            "mcnemar": mcnemar_paired(x, y).to_json()}


def _label(record: dict, arm: str) -> bool | None:
    return record["arms"].get(arm, {}).get("correct")


def _accuracy(ok: list[dict], first: str, second: str) -> dict | None:
    """Each arm's accuracy over its labelled rows; second - first over the rows labelled in both."""
    labels = {arm: [_label(r, arm) for r in ok if _label(r, arm) is not None] for arm in (first, second)}
    if not any(labels.values()):
        return None
    both = [r for r in ok if _label(r, first) is not None and _label(r, second) is not None]
    return {"arms": {arm: wilson(sum(v), len(v)).to_json() for arm, v in labels.items()},
            **_paired((second, first), [_label(r, second) for r in both], [_label(r, first) for r in both])}


def _reduction(by_precision: dict[str, list[dict]], pair: str) -> dict:
    before, after = ({r["row"]: r["comparisons"][pair] for r in by_precision[p] if pair in r["comparisons"]}
                     for p in PRECISIONS)
    rows = sorted(before.keys() & after.keys())
    metrics = {}
    for name in DIVERGENCES:
        field = FLAGS[name][0]
        x, y = [not before[r][field] for r in rows], [not after[r][field] for r in rows]
        metrics[name] = {PRECISIONS[0]: wilson(sum(x), len(rows)).to_json(),
                         PRECISIONS[1]: wilson(sum(y), len(rows)).to_json(), **_paired(PRECISIONS, x, y)}
    return {"from": PRECISIONS[0], "to": PRECISIONS[1], "rows": len(rows), "metrics": metrics}


def _precision(records: list[dict], shape: Shape) -> dict:
    ok = [r for r in records if r["status"] == "ok"]
    names = sorted({name for r in ok for name in r["comparisons"]})
    out: dict = {"rows": len(records), "ok": len(ok), "excluded": len(records) - len(ok),
                 "pairs": {name: _pair([r["comparisons"][name] for r in ok if name in r["comparisons"]])
                           for name in names}}
    if shape.replicas and all(_has([r["comparisons"].get(n, {}) for r in ok], *BIT_EXACT) for n in shape.replicas):
        out["replicas_exact"] = proportion(ok, replicas_exact)
    if ok and all("z_matches_bank" in r for r in ok):
        out["z_matches_bank"] = proportion(ok, lambda r: r["z_matches_bank"])
    if shape.accuracy and (accuracy := _accuracy(ok, *shape.accuracy)):
        out["accuracy"] = accuracy
    return out


def ordered(names, first: tuple[str, ...]) -> list[str]:
    return [n for n in first if n in names] + sorted(set(names) - set(first))


def _family(records: list[dict], shape: Shape) -> dict:
    by_precision: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_precision[record["precision"]].append(record)
    out = {"known": shape != Shape(), "headline_pairs": list(shape.headline),
           "precisions": {p: _precision(by_precision[p], shape) for p in ordered(by_precision, PRECISIONS)}}
    ok = {p: [r for r in by_precision[p] if r["status"] == "ok"] for p in PRECISIONS}
    if shape.reductions and all(ok.values()):
        out["reductions"] = {pair: _reduction(ok, pair) for pair in shape.headline}
    return out


# What every comparison and arm of an ok record holds (docs/ledger.md), and the pair each family is read by.
COMPARISON_FIELDS = {"cache_exact": bool, "logits_exact": bool, "suffix_equal": bool, "answer_equal": bool,
                     "correct_equal": bool}
ARM_FIELDS = {"suffix": list, "answer": str, "cache_digest": str, "logits_digest": str}
CROSS_PAIR = "incremental~prefill"  # the transplant and replication records' crossing


def _problem(record: dict) -> str | None:
    """What makes a record unreadable as a ledger record (docs/ledger.md), or None: a hollow record
    (no arms, no comparisons, or comparisons without their fields) is never read as a result."""
    where = "/".join(str(record.get(f)) for f in ledger.KEY_FIELDS)
    needed = (*ledger.KEY_FIELDS, "status") + (("arms", "comparisons") if record.get("status") == "ok" else ())
    if missing := [f for f in needed if f not in record]:
        return f"ledger record {where}: missing field {missing[0]!r}"
    if not all(isinstance(record[f], str) and record[f] for f in ledger.KEY_FIELDS):
        return f"ledger record {where}: fields {', '.join(ledger.KEY_FIELDS)} must be non-empty strings"
    if record["status"] not in ("ok", "excluded"):
        return f"ledger record {where}: field 'status' is {short(record['status'])}, expected 'ok' or 'excluded'"
    if record["status"] == "excluded":
        return None if isinstance(record.get("reason"), str) else f"ledger record {where}: excluded without a reason"
    for name, fields in (("arms", ARM_FIELDS), ("comparisons", COMPARISON_FIELDS)):
        value = record[name]
        if not isinstance(value, dict) or not value:
            return f"ledger record {where}: field {name!r} must be a non-empty object, got {short(value)}"
        for key, item in value.items():
            bad = [f for f, kind in fields.items() if not isinstance(item, dict) or not isinstance(item.get(f), kind)]
            if bad:
                return f"ledger record {where}: {name}.{key} lacks {bad[0]!r} (or it has the wrong type)"
    family = record["family"]
    headline = SHAPES[family].headline if family in SHAPES else (CROSS_PAIR,) if family in CAUSAL else ()
    if missing := [pair for pair in headline if pair not in record["comparisons"]]:
        return f"ledger record {where}: comparisons lack the {family} family's pair {missing[0]!r}"
    return None


def build_report(records: list[dict], meta: dict) -> dict:
    """The report.json content of ledger records (docs/report.md); `meta` is carried as given."""
    if problem := next(filter(None, map(_problem, records)), None):
        raise LedgerError(problem)
    by_family: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_family[record["family"]].append(record)
    excluded = [{f: r[f] for f in (*ledger.KEY_FIELDS, "reason") if f in r}
                for r in sorted(records, key=ledger.key) if r["status"] == "excluded"]
    return {
        "verdict": meta.get("verdict"),  # first: did it pass, and why not (verdict.py)
        "schema": SCHEMA,
        "meta": {key: value for key, value in meta.items() if key != "verdict"},
        "statistics": {"interval": "wilson", "level": LEVEL, "paired_test": "mcnemar-exact",
                       "bootstrap": "paired-percentile-bootstrap", "bootstrap_seed": SEED,
                       "bootstrap_resamples": RESAMPLES},
        "records": {"total": len(records), "ok": len(records) - len(excluded), "excluded": len(excluded)},
        "excluded": excluded,
        "families": {f: _family(by_family[f], SHAPES.get(f, Shape())) for f in ordered(by_family, tuple(SHAPES))},
        "causal": _causal(records, meta),
    }


def _causal(records: list[dict], meta: dict) -> dict:
    """The transplant (Table 5) and replication (Table 6) outcomes, where they ran."""
    minimum = ((meta.get("panels") or {}).get("replication") or {}).get("min_exact_controls",
                                                                        causal.MIN_EXACT_CONTROLS)
    families = {r["family"] for r in records}
    return ({"transplant": causal.transplant(records)} if "transplant" in families else {}) | (
        {"replication": causal.replication(records, minimum)} if "replication" in families else {})


def _causal_tables(summaries: dict) -> list[Table]:
    out = []
    if "transplant" in summaries:
        t = summaries["transplant"]
        rows = tuple((direction, fmt_proportion(t["full"][direction]["follows_donor"]),
                      *(fmt_proportion(t["parts"][part][direction]["follows_donor"]) for part in sorted(t["parts"])),
                      fmt_proportion(t["full"][direction]["control_third"]),
                      ", ".join(f"{r}: {n}" for r, n in t["minimal_layers"][direction].items()) or "-")
                     for direction in t["full"])
        out.append(Table(f"transplant (BF16): {t['divergent']} divergent rows, {t['controls']} exact controls",
                         ("recipient<-donor", "follows donor", *(f"{p} follows donor" for p in sorted(t["parts"])),
                          "controls: third trajectory", "minimal layer ranges (rows)"), rows,
                         "Divergent rows: incremental and prefill suffixes differ, first suffix tokens agree. "
                         f"Validity control (each construction's cache in its own replica reproduces its "
                         f"trajectory): {_validity(t.get('validity'))}."))
        if t.get("not_testable"):
            out.append(Table("transplant: divergent rows not testable", ("row", "reason"),
                             tuple((row, reason) for row, reason in t["not_testable"])))
    if "replication" in summaries:
        r = summaries["replication"]
        label = causal.replication_label(r)
        rows = (("validity control", _validity(r.get("validity"))),
                ("divergent rows", fmt_proportion(r["divergent"])),
                ("not testable (first suffix tokens differ)", _not_testable(r["not_testable"])),
                ("replicas exact", fmt_proportion(r["replicas_exact"])),
                *((f"donor recovery {d}", fmt_proportion(v)) for d, v in r["donor_recovery"].items()),
                *((f"controls: third trajectory {d}", fmt_proportion(v)) for d, v in r["control_third"].items()),
                ("exact controls (registered minimum)", f"{r['exact_controls']} ({r['min_exact_controls']})"),
                ("label", label))
        out.append(Table("replication on the later checkpoint (BF16)", ("measure", "value"), rows))
    return out


def _validity(validity: dict | None) -> str:
    if validity is None:
        return "not recorded"
    text = f"{fmt_proportion(validity['reproduced'])} rows reproduce"
    if validity["invalid"]:
        text += (f"; INVALID HERE on {', '.join(validity['invalid'])}: decoding is not a function of the cache values "
                 "alone, no transplant outcome counts")
    return text


def _not_testable(rows: list | int) -> str:
    if isinstance(rows, int):  # a summary written before the reasons were kept
        return str(rows)
    return "; ".join(f"{row}: {reason}" for row, reason in rows) or "0"


# ---- text: the tables both report.md and report.html show ----

@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def fmt_proportion(p: dict | None) -> str:
    if p is None:
        return "-"
    if p["n"] == 0:
        return "0/0"
    return f"{p['k']}/{p['n']} = {100 * p['rate']:.1f}% [{100 * p['ci_low']:.1f}, {100 * p['ci_high']:.1f}]"


def _fmt_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _fmt_paired(test: dict | None) -> str:
    if test is None:
        return "-"
    d, m = test["difference"], test["mcnemar"]
    if d["n"] == 0:
        return "no paired rows"
    return (f"{100 * d['diff']:+.1f} pp [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]; McNemar "
            f"{test['x']} only {m['b']} vs {test['y']} only {m['c']}, p = {m['p']:.3g} ({d['n']} rows)")


def _fmt_positions(spread: dict | None) -> str:
    if spread is None:
        return "-"
    if spread["n"] == 0:
        return "none diverge"
    return f"{spread['median']:g} ({spread['min']:g}-{spread['max']:g}), n = {spread['n']}"


def get_path(summary: dict, *path: str):
    for step in path:
        summary = summary.get(step) if isinstance(summary, dict) else None
    return summary


class Line(NamedTuple):
    """One line of a headline table: its label, the cell of one precision's summary, the reduction key."""

    label: str
    cell: Callable[[dict, str], str]
    reduction: str | None = None


def _pair_cell(name: str, fmt: Callable = fmt_proportion, *path: str) -> Callable[[dict, str], str]:
    return lambda s, pair: fmt(get_path(s, "pairs", pair, name, *path))


def _rel_l2(s: dict, pair: str) -> str:
    cells = [_fmt_number(get_path(s, "pairs", pair, name, "median")) for name in ("k_rel_l2", "v_rel_l2")]
    return "-" if cells == ["-", "-"] else " / ".join(cells)


HEADLINE_LINES = (
    Line("rows ok / excluded", lambda s, pair: f"{s['ok']} / {s['excluded']}"),
    Line("replicas exact (cache, logits, suffix)", lambda s, pair: fmt_proportion(s.get("replicas_exact"))),
    Line("live z matches the bank", lambda s, pair: fmt_proportion(s.get("z_matches_bank"))),
    Line("bit exact (cache, logits, suffix)", _pair_cell("bit_exact")),
    Line("cache exact", _pair_cell("cache_exact")),
    Line("logits exact", _pair_cell("logits_exact")),
    Line("boundary argmax differs", _pair_cell("argmax_differs")),
    Line("cache max |Δ| (max over rows)", _pair_cell("cache_max_abs", _fmt_number, "max")),
    Line("cache rel. L2, K / V (median over rows)", _rel_l2),
    Line("logits max |Δ| (max over rows)", _pair_cell("logits_max_abs", _fmt_number, "max")),
    *(Line(name.replace("_", " "), _pair_cell(name), name) for name in DIVERGENCES),
    Line("first divergence, median (range)", _pair_cell("first_divergence", _fmt_positions)),
)
TABLE_NOTE = ("k/n = rate [Wilson 95% CI]; paired differences: percentile bootstrap 95% CI in percentage points "
              "and exact McNemar on the discordant rows.")


def _accuracy_lines(first: str, second: str) -> list[Line]:
    return [*(Line(f"accuracy {arm}", lambda s, pair, a=arm: fmt_proportion(get_path(s, "accuracy", "arms", a)))
              for arm in (first, second)),
            Line(f"accuracy {second} - {first}, paired", lambda s, pair: _fmt_paired(s.get("accuracy")))]


def _headline_table(family: str, pair: str, summary: dict) -> Table:
    precisions = list(summary["precisions"])
    reduction = get_path(summary, "reductions", pair, "metrics")
    accuracy = SHAPES[family].accuracy
    lines = [*HEADLINE_LINES, *(_accuracy_lines(*accuracy) if accuracy else ())]
    rows = [(line.label, *(line.cell(summary["precisions"][p], pair) for p in precisions),
             *((_fmt_paired(reduction.get(line.reduction)) if line.reduction else "",) if reduction else ()))
            for line in lines]
    header = ("", *precisions, *(("BF16 → FP32 (paired rows)",) if reduction else ()))
    return Table(f"{family}: {pair}", header, tuple(r for r in rows if any(c not in ("-", "") for c in r[1:])),
                 TABLE_NOTE)


PAIR_COLUMNS = ("precision", "pair", "rows", "cache exact", "logits exact", "suffix divergence", "answer divergence",
                "correctness divergence", "cache max |Δ|", "first divergence")


def _pairs_table(family: str, summary: dict) -> Table:
    rows = tuple(
        (precision, pair, str(s["rows"]), *(fmt_proportion(s.get(n)) for n in ("cache_exact", "logits_exact",
                                                                                 *DIVERGENCES)),
         _fmt_number(get_path(s, "cache_max_abs", "max")), _fmt_positions(s.get("first_divergence")))
        for precision, p in summary["precisions"].items() for pair, s in p["pairs"].items())
    return Table(f"{family}: every pair", PAIR_COLUMNS, rows)


def tables(report: dict) -> list[Table]:
    """The tables of report.md and report.html, in order."""
    out = []
    for family, summary in report["families"].items():
        out += [_headline_table(family, pair, summary) for pair in summary["headline_pairs"]]
        pairs = {pair for p in summary["precisions"].values() for pair in p["pairs"]}
        if pairs - set(summary["headline_pairs"]):
            out.append(_pairs_table(family, summary))
    out += _causal_tables(report.get("causal", {}))
    counts = [(f, p, str(s["rows"]), str(s["excluded"])) for f, fs in report["families"].items()
              for p, s in fs["precisions"].items()]
    out.append(Table("records per family and precision", ("family", "precision", "rows", "excluded"), tuple(counts)))
    if report["excluded"]:
        fields = (*ledger.KEY_FIELDS, "reason")
        out.append(Table("excluded rows (fail-closed checks; in no denominator)", fields,
                         tuple(tuple(str(e.get(f, "")) for f in fields) for e in report["excluded"])))
    return out


# ---- report.md ----

def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_meta(value, indent: int = 0) -> list[str]:
    pad = "  " * indent
    items = value.items() if isinstance(value, dict) else enumerate(value)
    lines = []
    for name, item in items:
        label = f"**{_md_cell(str(name))}**: " if isinstance(value, dict) else ""
        if isinstance(item, dict | list) and item:
            lines += [f"{pad}- {label}".rstrip(), *_md_meta(item, indent + 1)]
        else:
            lines.append(f"{pad}- {label}{_md_cell(str(item))}")
    return lines


def summary_line(report: dict) -> str:
    stats, counts = report["statistics"], report["records"]
    return (f"Records: {counts['total']} ({counts['ok']} ok, {counts['excluded']} excluded). "
            f"Intervals: Wilson {100 * stats['level']:g}%; paired tests: exact McNemar; bootstrap: "
            f"{stats['bootstrap_resamples']} resamples, seed {stats['bootstrap_seed']}.")


def plain(table: Table) -> str:
    """A table as fixed-width text for a terminal."""
    rows = [table.header, *table.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(table.header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def markdown(report: dict) -> str:
    verdict_lines = verdict.lines(report.get("verdict"))
    lines = ["# replaytests report", "", f"## {_md_cell(verdict_lines[0])}", "",
             *(f"- {_md_cell(line.strip())}" for line in verdict_lines[1:]), *([""] if verdict_lines[1:] else []),
             "## Run", "",
             *(_md_meta(report["meta"]) or ["- (no run metadata given)"]), "", summary_line(report), ""]
    for table in tables(report):
        lines += [f"## {_md_cell(table.title)}", "", "| " + " | ".join(map(_md_cell, table.header)) + " |",
                  "|" + "---|" * len(table.header)]
        lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table.rows]
        lines += ["", table.note, ""] if table.note else [""]
    return "\n".join(lines)


# ---- files ----

# run.json (written by suite.artifacts.run_metadata; docs/report.md): the fields its readers read, by type.
RUN_SCHEMA = "replaytests.run/1"
RUN_FIELDS = {"verdict": dict, "options": dict, "contract": dict, "platform": dict, "run": dict, "manifest": dict,
              "environment": dict, "drift": list, "overridden": list}


def read_run(path: Path) -> dict | None:
    """The run.json beside a ledger (a file or a run directory), or None where there is none: the one
    reader of run.json, which checks every field its users read."""
    run_json = ledger_of(Path(path)).parent / "run.json"
    if not run_json.is_file():
        return None
    try:
        run = json.loads(run_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LedgerError(f"{run_json}: cannot read run metadata: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(run, dict):
        raise LedgerError(f"{run_json}: expected a JSON object, got {type(run).__name__}")
    if run.get("schema", RUN_SCHEMA) != RUN_SCHEMA:
        raise LedgerError(f"{run_json}: field 'schema' is {short(run['schema'])}, expected {RUN_SCHEMA!r}")
    for name, kind in RUN_FIELDS.items():
        if run.get(name) is not None and not isinstance(run[name], kind):
            raise LedgerError(f"{run_json}: field {name!r} must be a {kind.__name__}, got {short(run[name])}")
    return run


# The bank manifest as a report shows it: its digests (the full manifest stays in run.json).
MANIFEST_DIGESTS = {"bank_sha256": ("bank_sha256",), "model_sha256": ("model", "sha256"),
                    "tokenizer_sha256": ("tokenizer", "sha256"), "contract_sha256": ("contract", "sha256")}


def run_meta(run: dict) -> dict:
    """A run.json for the report's meta: the manifest reduced to its digests, the environment to one line
    each for software and device, the options to those given; every other key as given."""
    meta = dict(run)
    if isinstance(run.get("manifest"), dict):
        digests = {name: get_path(run["manifest"], *path) for name, path in MANIFEST_DIGESTS.items()}
        meta["manifest"] = {name: value for name, value in digests.items() if value is not None}
    if isinstance(run.get("environment"), dict) and {"software", "hardware"} <= set(run["environment"]):
        meta["environment"] = _environment_lines(run["environment"])
    if isinstance(run.get("options"), dict):
        meta["options"] = {name: value for name, value in run["options"].items() if value not in (None, [], False)}
    return meta


def _environment_lines(env: dict) -> dict:
    software = env.get("software") or {}
    hardware = env.get("hardware") or {}
    settings = env.get("environment") or {}
    if hardware.get("gpu_name"):
        device = (f"{hardware['gpu_name']} (compute {hardware.get('compute_capability')}, "
                  f"driver {hardware.get('driver')})")
    else:
        device = f"{hardware.get('cpu')} ({hardware.get('cpu_capability')})"
    return {"software": ", ".join(f"{name} {version}" for name, version in software.items() if version),
            "device": f"{settings.get('device')}: {device}, {settings.get('cpu_threads')} intra-op thread(s)"}


def report_meta(paths: list[Path]) -> dict:
    """The CLI's report meta: the ledgers, and the run.json beside them (one run's keys at the top level;
    runs that differ under `runs`, keyed by ledger)."""
    runs = {str(path): run_meta(run) for path in paths if (run := read_run(path)) is not None}
    meta = {"ledgers": [str(p) for p in paths]}
    if len({json.dumps(run, sort_keys=True) for run in runs.values()}) == 1:
        return meta | next(iter(runs.values()))
    return meta | ({"runs": runs} if runs else {})


def collate(paths: list[Path]) -> list[dict]:
    """Records of one or more ledgers (files or run directories), de-duplicated, sorted by key.

    The same (family, row, precision) in two inputs must be identical: different results are an error.
    """
    seen: dict[tuple, tuple[dict, Path]] = {}
    for path in map(ledger_of, map(Path, paths)):
        records = ledger.read_ledger(path, _problem)
        if not records:
            raise LedgerError(f"{path}: empty ledger (no records)")
        for record in records:
            key = ledger.key(record)
            if key in seen and seen[key][0] != record:
                raise LedgerError(f"ledger record {'/'.join(key)} differs between {seen[key][1]} and {path}")
            seen.setdefault(key, (record, path))
    return [seen[k][0] for k in sorted(seen)]


def write_report(report_dir: Path, records: list[dict], meta: dict) -> list[Path]:
    """Write report.json, report.md and report.html (each atomically); returns their paths."""
    report_dir = Path(report_dir)
    report = build_report(records, meta)
    paths = [report_dir / name for name in REPORT_FILES]
    try:
        write_json_atomic(paths[0], report, sort_keys=False)
        write_atomic(paths[1], markdown(report))
        write_atomic(paths[2], page(report, tables(report), summary_line(report), verdict.lines(report.get("verdict"))))
    except OSError as exc:
        raise ConfigError(f"{report_dir}: cannot write report: {exc.strerror or exc}") from None
    return paths
