"""The rollout families' own report section (docs/report.md): report.json's `rollouts` (per family and cell, every
pair's measures, outputs/rollout_families.py) and `rollout_cell_pairs` (the trainer's recompute, cell against cell),
and their part of every renderer: the replica layer's rows, the fidelity layer's tables, summary.md's table,
report.html's plots; and their checks of a run's records and between two runs. A report section module:
outputs/family_sections.py says what it holds; the families' registry records name it.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

import numpy as np

from replaytests.families.registry import ROLLOUT_FAMILIES
from replaytests.inputs.gates import ROLLOUT_CONTROL, ROLLOUT_RECOMPUTE, Gates
from replaytests.outputs import plots, rollout_families, rollout_report
from replaytests.outputs.findings import ROLLOUT_RATES_REASON, Findings, Group, Measure, Rows, ok_records
from replaytests.outputs.records import Record
from replaytests.outputs.shapes import own_comparisons, replica_counts
from replaytests.outputs.stats import INTERVAL, sign_flip, smallest_p
from replaytests.outputs.tables import Table, first, fmt_proportion

TERMINAL = False  # its summary table is summary.md's alone
# The headline table (outputs/summary.py) reads a rollout's own comparisons, and none of its divergence columns: its
# replays are given the live tokens, so no suffix of theirs can diverge (its table says what does: log-probabilities).
HEADLINE_SCOPE = None
HEADLINE_DIVERGENCES = False
headline_comparisons = own_comparisons


def build(records: list[Record], runtime: str, cells: tuple[str, ...], pairs: list[tuple[str, str]]) -> dict:
    """Its report.json keys, each where the run holds something for it."""
    return {**({"rollouts": found} if (found := rollout_families.build(records, runtime, cells)) else {}),
            **({"rollout_cell_pairs": paired} if (paired := rollout_families.cell_pairs(records, pairs)) else {})}


def replica_rows(report: dict) -> list[tuple[str, ...]]:
    """Its rows of the replica layer's table: its families' replica pairs (report.json `families` keeps their
    count)."""
    return [(*row, fmt_proportion(exact)) for family, summary in report["families"].items()
            if family in ROLLOUT_FAMILIES for *row, exact in replica_counts(family, summary)]


def fidelity(report: dict) -> tuple[list[Table], list[Table], list[str]]:
    """Its tables in the fidelity layer, those folded away, and its lines."""
    tables, folded = [], []
    for family, by_cell in (report.get("rollouts") or {}).items():
        for cell, found in by_cell.items():
            shown, hidden = _tables(family, cell, found)
            tables += shown
            folded += hidden
        if paired := (report.get("rollout_cell_pairs") or {}).get(family):
            tables.append(_cell_pairs(family, paired))
    return tables, folded, []


def _tables(family: str, cell: str, found: dict) -> tuple[list[Table], list[Table]]:
    """A rollout family's cell (outputs/rollout_families.py): the run's measures of every pair side by side, the
    worst tokens of the headline pair; the worst tokens of every other pair that is not bitwise equal, folded."""
    name = f"Rollout fidelity ({family}), {cell}, runtime {found['runtime']}"
    pairs = found["pairs"]
    if not pairs:
        return [Table(name, ("", ""), (("rows ok / excluded", f"{found['ok']} / {found['excluded']}"),
                                        ("measured", "no row holds log-probabilities")))], []
    columns = {pair: rollout_report.measure_rows(run) for pair, run in pairs.items()}
    labels = [label for label, _ in next(iter(columns.values()))]
    rows = [("rows ok / excluded", *(f"{found['ok']} / {found['excluded']}" for _ in pairs)),
            *((label, *(dict(columns[pair])[label] for pair in pairs)) for label in labels),
            ("rows with a token past the threshold", *(first(run["exceeding"], 3) or "none" for run in pairs.values()))]
    t = found["thresholds"]
    note = (f"{found['mode'].capitalize()} rollouts of {found['length']} response tokens per row; the control "
            "(teacher forcing on the live schedule, the same calls) must be bitwise equal. delta logp = logp(second "
            "arm) - logp(first arm) per response token, over the tokens both arms share; ratio = exp(delta), bounds "
            f"[{t['ratio_low']:g}, {t['ratio_high']:g}], |delta logp| threshold {t['delta']:g} nats; k3 = mean of "
            "ratio - 1 - log ratio, an estimate of KL(first || second); 95% intervals: percentile bootstrap over rows "
            f"(cluster), rows past the threshold: {INTERVAL}. " + " ".join(found["notes"]))
    shown = [Table(name, ("", *(f"{pair}, {rollout_families.role(pair)}" for pair in pairs)), tuple(rows),
                   note.strip())]
    worst = {pair: rollout_report.worst_table(run["worst"], f"{name}: the worst tokens of {pair}",
                                              tuple(pair.split("~")))
             for pair, run in pairs.items() if run["abs_delta_max"] > 0}
    headline = [table for pair, table in worst.items() if pair == ROLLOUT_RECOMPUTE]
    return shown + headline, [table for pair, table in worst.items() if pair != ROLLOUT_RECOMPUTE]


def _cell_pairs(family: str, paired: dict) -> Table:
    """The trainer's recompute of each pair of cells, paired by row (outputs/rollout_families.cell_pairs)."""
    def cell(measured: dict) -> str:
        test = measured["test"]
        return (f"{measured['means'][0]:.3g} vs {measured['means'][1]:.3g} (difference {test.diff:.3g}, "
                f"p {test.p:.3g})")

    rows = tuple((pair, str(m["rows"]), cell(m["k3"]), cell(m["abs_delta_mean"])) for pair, m in paired.items())
    return Table(f"Rollout fidelity ({family}): the trainer's recompute, cell against cell (paired rows)",
                 ("cells", "rows", "k3 per token, row means", "mean abs(delta logp), row means"), rows,
                 "Per row, live~prefill in each cell of the contract's cell_pairs; difference = first - second; p: "
                 "two-sided paired sign-flip permutation test over rows (exact up to 2^n <= 10,000 assignments).")


def summary_table(built: dict) -> Table | None:
    """The rollout families' headline and control pairs per cell (a built report's `rollouts`); None where none
    ran."""
    found = built.get("rollouts") or {}
    rows = [(family, cell, pair, *rollout_report.compact(run)) for family, by_cell in found.items()
            for cell, summary in by_cell.items() for pair, run in summary["pairs"].items()
            if pair in (ROLLOUT_RECOMPUTE, ROLLOUT_CONTROL)]
    if not rows:
        return None
    return Table("Rollouts: the trainer's recompute and its control",
                 ("family", "precision", "pair", *rollout_report.COMPACT), tuple(rows),
                 f"{ROLLOUT_RECOMPUTE}: the training-inference mismatch; {ROLLOUT_CONTROL}: teacher forcing on the "
                 "live schedule, which must be bitwise equal. Intervals: percentile bootstrap over rows; report.md "
                 "has every pair, the worst tokens and the thresholds.")


def figures(report: dict) -> list[str]:
    """Per rollout family and cell, the distribution of |delta logp| of each pair (outputs/rollout_families.py);
    a cell whose every pair is bitwise equal at every token gets a line of text instead of an empty plot."""
    drawn = []
    for family, by_cell in (report.get("rollouts") or {}).items():
        for cell, found in by_cell.items():
            spread = {pair: run["distribution"] for pair, run in found["pairs"].items()
                      if run["distribution"]["edges_log10"]}
            exact = [pair for pair in found["pairs"] if pair not in spread]
            title = f"{family} {cell} ({found['runtime']})"
            drawn.append(plots.cdf_plot(title, spread, exact) if spread else
                           f'<p class="note">{escape(title)}: every pair bitwise equal at every token '
                           f'({escape(", ".join(exact))}): no |delta logp| to draw.</p>')
    return drawn


def failing(record: Record, gates: Gates) -> list[str]:
    """None beyond every family's checks (report.checked_verdict): a rollout's control, live~incremental, is judged as
    every family's control is (registry Family.control)."""
    return []


# ---- compare: its checks between a baseline run and a new one ----

def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Its checks of one family and cell between a baseline run and a new one (outputs/compare.py): the trainer's
    recompute against the contract's rollout bounds, and its per-row mismatch at the rates level."""
    _gates(out, group, new, gates)
    _rates(out, group, base, new, alpha)


def _gates(out: Findings, group: Group, new: Rows, gates: Gates) -> None:
    """The trainer's recompute of the new run against the contract's rollout bounds (gates.rollout_recompute:
    k3 and the share outside the ratio bounds), at every level; a mismatch no bound judges is data."""
    for record in ok_records(new):
        if ROLLOUT_RECOMPUTE in record.comparisons and (judged := gates.rollout_recompute(record)).failed:
            out.reasons.append(f"rollout gate: {judged.message}")


# What the rates level tests of a rollout, per row of the trainer's recompute: name -> the row's value.
MEASURES: dict[str, Callable[[Record], float | None]] = {
    "k3 per token": lambda r: r.comparisons[ROLLOUT_RECOMPUTE].k3,
    "mean |delta logp|": lambda r: None if (s := rollout_families.scored(r, ROLLOUT_RECOMPUTE)) is None
    else float(np.abs(s.delta()).mean()),
}


def _rates(out: Findings, group: Group, base: Rows, new: Rows, alpha: float) -> None:
    """The trainer's recompute's per-row mismatch, paired by row between the runs: a sign-flip permutation test
    of the mean per-row difference (stats.sign_flip), p < alpha a finding at the rates level. Where the rows are
    too few for any p below alpha, a note says so: such a pass could not have failed."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys()) if base[row].ok and new[row].ok
            and ROLLOUT_RECOMPUTE in base[row].comparisons and ROLLOUT_RECOMPUTE in new[row].comparisons]
    cell = "/".join(group)
    for name, value in MEASURES.items() if both else ():
        paired = [(b, n) for b, n in ((value(b), value(n)) for b, n in both) if b is not None and n is not None]
        if not paired:
            continue
        before, after = ([p[i] for p in paired] for i in (0, 1))
        test = sign_flip(after, before)
        means = (f"{np.mean(before):.4g} (row mean)", f"{np.mean(after):.4g} (row mean)")
        measure = f"{ROLLOUT_RECOMPUTE} {name}"
        out.lines.append(Measure(group, measure, len(paired), *means, test.p, test.p >= alpha))
        if test.p < alpha:
            out.finding("rates", group, f"{ROLLOUT_RATES_REASON}: {cell} {measure}: baseline {means[0]}, new "
                                        f"{means[1]} over {len(paired)} paired rows, sign-flip permutation p = "
                                        f"{test.p:.3g} < {alpha:g}")
    if both and out.gated("rates") and smallest_p(len(both)) >= alpha:
        out.notes.append(f"{cell} {ROLLOUT_RECOMPUTE}: {len(both)} paired rows cannot show a change at alpha {alpha:g} "
                         f"(the smallest p a sign-flip test gives is {smallest_p(len(both)):.3g}): at least "
                         f"{min_rows(alpha)} rows are needed")


def min_rows(alpha: float) -> int:
    """The fewest paired rows whose sign-flip test can give a p below alpha."""
    return next(n for n in range(1, 64) if smallest_p(n) < alpha)
