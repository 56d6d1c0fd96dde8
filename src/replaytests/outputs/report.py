"""The report (docs/report.md): report.json, its Markdown twin report.md and report.html with plots.

`build_report` turns ledger records into the report.json content, its statistics as frozen result objects
(outputs/stats.py's proportions with their interval and level, McNemar and bootstrap tests; the flips; each causal
family's outcomes) and its verdict a Verdict: the run's statistics computed once, which every renderer reads (the
terminal, summary.md, report.md, report.html, the history) and `stats.as_json` writes as report.json; the Markdown
and HTML tables are rendered from that content alone, so the three files cannot disagree. Excluded rows are listed
with their reasons and never enter a denominator.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from replaytests.errors import ConfigError, LedgerError, ReplaytestsError
from replaytests.families.registry import FAMILIES
from replaytests.files import NotStrictJSON, dumps, lookup, write_set
from replaytests.inputs import cells
from replaytests.inputs.contract import default_gates, load_contract
from replaytests.inputs.gates import Gates, bit_exact, replica_pairs
from replaytests.outputs import (
    causal,
    family_sections,
    flips,
    ledger,
    report_html,
    runs,
    sections,
    serving,
    stats,
    summary,
)
from replaytests.outputs.records import KEY_FIELDS, Comparison, Record
from replaytests.outputs.shapes import (
    DIVERGENCES,
    FLAGS,
    PER_LAYER,
    SHAPES,
    SPREADS,
    Shape,
    missing_replicas,
    replicas_hold,
    runtime,
)
from replaytests.outputs.stats import (
    LEVEL,
    RESAMPLES,
    SEED,
    mcnemar_paired,
    paired_bootstrap,
    proportion,
    wilson,
)
from replaytests.outputs.tables import first
from replaytests.outputs.verdict import Verdict

SCHEMA = "replaytests.report/1"
REPORT_FILES = ("report.json", "report.md", "report.html")


def _has(comps: list[Comparison], *fields: str) -> bool:
    """A metric is reported only when every comparison of the pair measured its fields."""
    return bool(comps) and all(getattr(c, f) is not None for c in comps for f in fields)


def _spread(values: list[float], positions: bool = False) -> dict:
    """n, median, mean, min and max (null when n = 0); with `positions`, the sorted values themselves."""
    a = np.asarray(values, dtype=float)
    out: dict = {"n": len(a), "median": None, "mean": None, "min": None, "max": None}
    if len(a):
        with np.errstate(over="ignore"):  # values near the float limit: the writer refuses the infinity, one line
            out |= {"median": float(np.median(a)), "mean": float(a.mean()), "min": float(a.min()),
                    "max": float(a.max())}
    if positions:
        out["positions"] = sorted(int(v) for v in values)
    return out


def _pair(comps: list[Comparison]) -> dict:
    """One pair's measures over the ok records carrying it (at least one)."""
    out: dict = {"rows": len(comps)}
    out |= {name: proportion(comps, lambda c, f=field, neg=negate: getattr(c, f) != neg)
            for name, (field, negate) in FLAGS.items() if _has(comps, field)}
    out["bit_exact"] = proportion(comps, bit_exact)  # a cache not measured (null) is not counted
    out |= {name: _spread([max(getattr(c, f) for f in fields) for c in comps])
            for name, fields in SPREADS.items() if _has(comps, *fields)}
    out["first_divergence"] = _spread([c.first_divergence for c in comps
                                       if not c.suffix_equal and c.first_divergence is not None], True)
    for name in PER_LAYER:
        if _has(comps, name) and len({len(getattr(c, name)) for c in comps}) == 1:
            out[f"{name}_mean"] = np.mean([getattr(c, name) for c in comps], axis=0).tolist()
    return out


def _paired(names: tuple[str, str], x: list[bool], y: list[bool]) -> dict:
    """mean(x) - mean(y) over paired rows with its bootstrap interval, and McNemar on (x only, y only)."""
    return {"x": names[0], "y": names[1], "difference": paired_bootstrap(x, y),
            "mcnemar": mcnemar_paired(x, y)}


def _label(record: Record, arm: str) -> bool | None:
    return record.arms[arm].correct if arm in record.arms else None


def _accuracy(ok: list[Record], first: str, second: str) -> dict | None:
    """Each arm's accuracy over its labelled rows; second - first over the rows labelled in both."""
    labels = {arm: [_label(r, arm) for r in ok if _label(r, arm) is not None] for arm in (first, second)}
    if not any(labels.values()):
        return None
    both = [r for r in ok if _label(r, first) is not None and _label(r, second) is not None]
    return {"arms": {arm: wilson(sum(v), len(v)) for arm, v in labels.items()},
            **_paired((second, first), [_label(r, second) for r in both], [_label(r, first) for r in both])}


def _reduction(by_cell: dict[str, list[Record]], pair: str, cell_pair: tuple[str, str]) -> dict:
    """A headline pair's divergences in one cell against another, paired over the rows both hold: the
    paper's bf16 -> fp32 reduction, or a quantized cell against its native cell (the amplification)."""
    before, after = ({r.row: r.comparisons[pair] for r in by_cell[c] if pair in r.comparisons} for c in cell_pair)
    rows = sorted(before.keys() & after.keys())
    metrics = {}
    for name in DIVERGENCES:
        field = FLAGS[name][0]
        x, y = [not getattr(before[r], field) for r in rows], [not getattr(after[r], field) for r in rows]
        metrics[name] = {cell_pair[0]: wilson(sum(x), len(rows)),
                         cell_pair[1]: wilson(sum(y), len(rows)), **_paired(cell_pair, x, y)}
    return {"from": cell_pair[0], "to": cell_pair[1], "rows": len(rows), "metrics": metrics}


def _cell_summary(records: list[Record], shape: Shape) -> dict:
    ok = [r for r in records if r.ok]
    names = sorted({name for r in ok for name in r.comparisons})
    out: dict = {"rows": len(records), "ok": len(ok), "excluded": len(records) - len(ok),
                 "pairs": {name: _pair([r.comparisons[name] for r in ok if name in r.comparisons]) for name in names}}
    if shape.replicas and ok:  # null: no ok record carries a replica pair (the check is missing, not met)
        out["replicas_exact"] = proportion(ok, replicas_hold) if summary.replicas_recorded(ok) else None
    if ok and all(r.z_matches_bank is not None for r in ok):
        out["z_matches_bank"] = proportion(ok, lambda r: r.z_matches_bank)
    if shape.accuracy and (accuracy := _accuracy(ok, *shape.accuracy)):
        out["accuracy"] = accuracy
    return out


def ordered(names, first: tuple[str, ...]) -> list[str]:
    return [n for n in first if n in names] + sorted(set(names) - set(first))


def _family(records: list[Record], shape: Shape, cell_pairs: list[tuple[str, str]], order: tuple[str, ...]) -> dict:
    by_cell: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_cell[record.precision].append(record)
    out = {"known": shape != Shape(), "headline_pairs": list(shape.headline),
           "precisions": {c: _cell_summary(by_cell[c], shape) for c in ordered(by_cell, order)}}
    ok = {c: [r for r in rs if r.ok] for c, rs in by_cell.items()}
    if shape.reductions and (held := [p for p in cell_pairs if ok.get(p[0]) and ok.get(p[1])]):
        out["reductions"] = {pair: [_reduction(ok, pair, p) for p in held] for pair in shape.headline}
    return out


def _shape(family: str) -> Shape:
    """How the report reads a family: its headline-table shape; for a family with a report section of its own instead
    (its registry record's `report_section`: the rollout families, the conversation family, the edge sweep) its
    replicas alone, so that their count is kept (history tracks it)."""
    if family in FAMILIES and FAMILIES[family].report_section:
        return Shape(replicas=FAMILIES[family].replicas)
    return SHAPES.get(family, Shape())


def cell_pairs(meta: dict, names) -> list[tuple[str, str]]:
    """The pairs of cells a report compares: the run's contract's (run.json `cell_pairs`), or for a run
    that did not record them the paper's pair where its records hold both cells."""
    pairs = meta.get("cell_pairs")
    if isinstance(pairs, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in pairs):
        return [tuple(p) for p in pairs]
    return [tuple(p) for p in cells.paper_pairs(dict.fromkeys(names))]


def cell_order(meta: dict) -> tuple[str, ...]:
    """The order cells are shown in: the contract's (run.json `cells`), the paper's first otherwise."""
    declared = meta.get("cells")
    if isinstance(declared, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in declared):
        return tuple(c["name"] for c in declared)
    return cells.PAPER


def build_report(records: list[Record], meta: dict) -> dict:
    """The report.json content of ledger records (docs/report.md); `meta` is carried as given."""
    if problem := next(filter(None, map(ledger.headline_problem, records)), None):
        raise LedgerError(problem)
    by_family: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_family[record.family].append(record)
    pairs = cell_pairs(meta, {r.precision for r in records})
    by_cell = causal.by_cell(records, meta)
    excluded = [{name: getattr(r, name) for name in (*KEY_FIELDS, "reason")}
                for r in sorted(records, key=lambda r: r.key) if not r.ok]
    return {
        "verdict": checked_verdict(runs.recorded_verdict(meta), records, run_gates(meta)),  # first: did it pass?
        "schema": SCHEMA,
        "meta": {key: value for key, value in meta.items() if key != "verdict"},
        "statistics": {"interval": "wilson", "level": LEVEL, "paired_test": "mcnemar-exact",
                       "bootstrap": "paired-percentile-bootstrap", "bootstrap_seed": SEED,
                       "bootstrap_resamples": RESAMPLES},
        "records": {"total": len(records), "ok": len(records) - len(excluded), "excluded": len(excluded)},
        "headline": {"columns": list(summary.COLUMNS), "rows": summary.table_rows(records)},
        "excluded": excluded,
        "families": {f: _family(by_family[f], _shape(f), pairs, cell_order(meta))
                     for f in ordered(by_family, tuple(SHAPES))},
        # The first cell's causal outcomes (the paper's bf16 where it ran) as `causal`, every cell's in
        # `causal_cells` (history tracks `causal`).
        "causal": next(iter(by_cell.values()), {}),
        "causal_cells": by_cell,
        "flips": flips.flips(records, {family: shape.headline for family, shape in SHAPES.items()}),
        **({serving.FAMILY: serving.premise(records)} if serving.FAMILY in by_family else {}),
        **family_sections.build(records, runtime(meta), cell_order(meta), pairs),
    }


def run_gates(meta: dict) -> Gates:
    """The gates the run was judged by: its contract's (meta `contract`: the file at its path, where it still
    has the recorded sha256), else the contract defaults, which require every replica and the bridge exact."""
    path, digest = (lookup(meta, "contract", key) for key in ("path", "sha256"))
    try:
        contract = load_contract(Path(path)) if isinstance(path, str) and Path(path).is_file() else None
    except ReplaytestsError:
        contract = None
    return contract.gates if contract is not None and contract.digest == digest else default_gates()


def _failing(record: Record, gates: Gates) -> list[str]:
    """The exactness checks an ok record fails under `gates`: its replicas (a pair its family compares and the
    record lacks fails too), its family's control (the bridge's, a rollout's: registry Family.control), a headline
    pair whose suffixes diverge in a cell the gates require exact (a cell they do not name is not judged here), and
    those of its family's report section (a conversation's turns, a sweep's points: outputs/family_sections.py)."""
    replicas = missing_replicas(record) or any(gates.replicas(record, pair).failed for pair in replica_pairs(record))
    control = gates.control_pair(record) is not None and gates.control(record).failed
    exact = gates.suffix_divergence_allowed.get(record.family, {}).get(record.precision) is False
    headline = SHAPES.get(record.family, Shape()).headline
    diverged = exact and any(gates.divergence(record, pair).failed for pair in headline if pair in record.comparisons)
    names = ("replicas", f"the {FAMILIES[record.family].control.name}" if control else "", "exact-cell suffixes")
    failed = [name for name, failed in zip(names, (replicas, control, diverged), strict=True) if failed]
    return failed + (section.failing(record, gates) if (section := family_sections.of(record.family)) else [])


def failing_checks(records: list[Record], gates: Gates) -> str | None:
    """What the ok records show failing (`_failing`: replicas, a family's control, exact-cell suffixes, a report
    section's checks) under `gates`, in words, `the records show ...`; None where nothing fails."""
    failing: dict[str, list[str]] = defaultdict(list)
    for record in records:
        for name in _failing(record, gates) if record.ok else ():
            failing[name].append(record.label)
    if not failing:
        return None
    return "the records show " + "; ".join(f"{name} failing in {len(rows)} row{'s' * (len(rows) > 1)} "
                                           f"({first(rows, 3)})" for name, rows in failing.items())


def checked_verdict(recorded: Verdict | None, records: list[Record], gates: Gates) -> Verdict | None:
    """The run's verdict (run.json's), unless it says pass while the records show a replica or bridge check
    failing (a ledger edited after the run, or collated with another; a run's own verdict checks its records:
    suite.collector.run_verdict): then a fail whose `contradicted` says what the records show, so that the verdict
    a report prints agrees with its tables."""
    if recorded is None or recorded.result != "pass":
        return recorded
    shown = failing_checks(records, gates)
    return recorded if shown is None else replace(recorded, result="fail", contradicted=shown)


def write_report(report_dir: Path, records: list[Record], meta: dict) -> list[Path]:
    """Write report.json, report.md and report.html (each atomically); returns their paths."""
    return write_built(report_dir, build_report(records, meta))


def write_built(report_dir: Path, report: dict) -> list[Path]:
    """Write a built report (build_report) as report.json, report.md and report.html; returns their paths."""
    report_dir = Path(report_dir)
    paths = [report_dir / name for name in REPORT_FILES]
    try:  # as one set: a report.json never stands beside another run's report.html
        write_set({paths[0]: dumps(stats.as_json(report), indent=2) + "\n", paths[1]: sections.markdown(report),
                   paths[2]: report_html.page(report)})
    except NotStrictJSON as exc:  # a number the ledger's finite ones overflowed to (a mean of 1e308s)
        raise LedgerError(f"{paths[0]}: cannot write report: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{report_dir}: cannot write report: {exc.strerror or exc}") from None
    return paths
