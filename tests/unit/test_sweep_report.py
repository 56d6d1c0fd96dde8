"""The edge sweep in the report, compare and summary.md, on hand-built records (no model): per cell, axis and swept
value the rows whose reference~edge logits, caches, next tokens and continuations differ with their Wilson intervals;
a point whose engine counters say its premise did not hold counted apart, never as agreement; a runtime without K/V
reporting its caches as not measured; the first value where anything differs; the replicas at every point, not only
the last; and compare's sweep gates and per-value rates."""

from __future__ import annotations

import copy
from typing import NamedTuple

import pytest
from test_report import comparison, record, typed

from replaytests.families.registry import FAMILIES
from replaytests.outputs import compare as comparing
from replaytests.outputs import findings, report_html, sections, summary, sweep_report, sweep_section
from replaytests.outputs.report import build_report, checked_verdict
from replaytests.outputs.stats import wilson
from replaytests.outputs.verdict import Verdict

FAMILY = FAMILIES["sweep"]
PAIRS = [f"{a}~{b}" for a, b in FAMILY.pairs]
HEADLINE = "reference~edge"
KV_FIELDS = [f"{kv}_{m}" for kv in "kv" for m in ("rel_l2", "max_abs", "rel_l2_per_layer", "max_abs_per_layer")]


def headline(logits: bool = True, cache: bool | None = True, argmax: bool = True, suffix: bool = True) -> dict:
    """reference~edge: each field exact (True) or not; a cache of None is not measured (a runtime without K/V)."""
    c = comparison(cache_exact=bool(cache), suffix_equal=suffix, first_divergence=None if suffix else 2)
    c |= {"logits_exact": logits, "argmax_equal": argmax}
    return c | ({"cache_exact": None} | dict.fromkeys(KV_FIELDS) if cache is None else {})


def point(value: int, edge: str | None = "runtime.x.block_size 8 x1", axis: str = "position", served=None,
          replica: bool = True, **differ) -> dict:
    """A sweep point: every pair compared, reference~edge as `differ` says (headline's arguments), the edge's replica
    bit-exact unless `replica` is false."""
    comps = {pair: comparison() for pair in PAIRS} | {HEADLINE: headline(**differ)}
    if not replica:
        comps["edge~edge_replica"] = comparison(suffix_equal=False, first_divergence=1)
    arms = record("sweep", "x", "bf16", comps)["arms"]
    return {"axis": axis, "value": value, "edge": edge, "tokens": value, "arms": arms, "comparisons": comps,
            **({} if served is None else {"served": served})}


def sweep(row: str, points: list[dict], precision: str = "bf16") -> dict:
    """A sweep record: its arms and comparisons are its last point's, as families/sweep.py writes."""
    return record("sweep", row, precision, points[-1]["comparisons"], sweep=points) | {"arms": points[-1]["arms"]}


def panel(rows: int, at: dict[int, int], measure: str = "suffix", values: tuple[int, ...] = (7, 8, 9),
          precision: str = "bf16", **extra) -> list[dict]:
    """`rows` sweep records over `values`; at value v (a key of `at`) the first at[v] rows differ in `measure`."""
    return [sweep(f"r{i:02d}", [point(v, **({measure: False} if i < at.get(v, 0) else {}), **extra) for v in values],
                  precision) for i in range(rows)]


def built(records: list[dict], meta: dict | None = None) -> dict:
    return build_report(typed(records), meta or {})


def axis_of(report: dict, cell: str = "bf16", axis: str = "position") -> dict:
    return report["sweeps"][cell]["axes"][axis]


# ---- the rates per value ----

class Rates(NamedTuple):
    id: str
    measure: str  # the argument of headline() that differs
    name: str  # the report's measure
    at: dict[int, int]  # value -> rows that differ there


RATES = [Rates("logits", "logits", "logits_differ", {8: 3, 9: 1}),
         Rates("cache", "cache", "cache_differs", {7: 1}),
         Rates("next-token", "argmax", "argmax_differs", {9: 4}),
         Rates("continuation", "suffix", "suffix_divergence", {8: 2}),
         Rates("nothing", "suffix", "suffix_divergence", {})]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in RATES])
def test_each_value_counts_the_rows_that_differ_there_with_a_wilson_interval(case):
    found = axis_of(built(panel(4, case.at, case.measure)))
    assert [p["value"] for p in found["points"]] == [7, 8, 9]
    for p in found["points"]:
        expected = wilson(case.at.get(p["value"], 0), 4)
        assert p[case.name] == expected, f"value {p['value']}: {p[case.name]}, expected {expected}"
        others = {name: p[name].k for name in sweep_report.MEASURES if name != case.name}
        assert not any(others.values()), f"value {p['value']}: only {case.name} differs, not {others}"


def test_the_interval_is_the_reference_wilson_interval():
    # 2 of 5 rows, Wilson 95% (R: binom::binom.confint(2, 5, methods = "wilson")): [0.1176, 0.7693]
    found = axis_of(built(panel(5, {8: 2})))["points"][1]["suffix_divergence"]
    assert (found.k, found.n) == (2, 5) and (found.ci_low, found.ci_high) == pytest.approx(
        (0.1176, 0.7693), abs=5e-5), found


def test_a_value_counts_only_the_rows_that_swept_it():
    records = [*panel(3, {9: 3}), sweep("short", [point(7), point(8)])]  # a shorter prefix: no point 9
    found = axis_of(built(records))["points"]
    assert [(p["value"], p["rows"], p["suffix_divergence"].n) for p in found] == [(7, 4, 4), (8, 4, 4), (9, 3, 3)]


def test_a_runtime_without_kv_reports_the_cache_as_not_measured_never_as_exact():
    report = built(panel(3, {8: 2}, "logits", cache=None))
    for p in axis_of(report)["points"]:
        assert p["cache_differs"] is None and p["logits_differ"].n == 3, p
    row = next(line for line in sections.markdown(report).splitlines() if line.startswith("| 8 |"))
    assert "not measured" in row and "2/3" in row and "0/3" in row, row


# ---- premises ----

class Premise(NamedTuple):
    id: str
    served: object
    state: str
    why: str | None


AT_8 = "at position 8 (runtime.x.block_size 8 x1)"
PREMISES = [
    Premise("short-of-the-premise", {"edge": {"prefill_steps": 1, "premise": {"prefill_steps": [2, None]}},
                                     "reference": {"cached_tokens": 0, "requires": {"cached_tokens": [0, 0]}}},
            sweep_report.VACUOUS, f"{AT_8}: edge counted prefill_steps 1, the point needs at least 2"),
    Premise("construction-broken", {"reference": {"cached_tokens": 32, "requires": {"cached_tokens": [0, 0]}}},
            sweep_report.VACUOUS, f"{AT_8}: reference counted cached_tokens 32, its construction requires 0"),
    Premise("counter-missing", {"edge": {"premise": {"calls": [3, 3]}}}, sweep_report.VACUOUS,
            f"{AT_8}: edge counted calls None, the point needs 3"),
    Premise("arm-not-a-mapping", {"edge": [3, 1]}, sweep_report.UNREADABLE,
            "counters unreadable: served is {'edge': [3, 1]}, not a mapping of arms to counters"),
    Premise("bounds-not-a-pair", {"edge": {"calls": 1, "premise": {"calls": "two"}}}, sweep_report.UNREADABLE,
            "counters unreadable: {'edge': {'calls': 1, 'premise': {'calls': 'two'}}}"),
    Premise("a-least-value", {"edge": {"calls": 1, "premise": {"calls": 2}}}, sweep_report.VACUOUS,
            f"{AT_8}: edge counted calls 1, the point needs at least 2"),
    Premise("served-not-a-mapping", "warm", sweep_report.UNREADABLE,
            "counters unreadable: served is 'warm', not a mapping of arms to counters"),
    # counters that say nothing of the premise: the point is counted, as one without counters
    Premise("counters-without-verdict", {"edge": {"prefill_steps": 3, "cached_tokens": 0}}, sweep_report.HELD, None),
    Premise("premise-held", {"edge": {"prefill_steps": 3, "premise": {"prefill_steps": [2, None]}}},
            sweep_report.HELD, None),
]
VACUOUS = {"edge": {"prefill_steps": 1, "premise": {"prefill_steps": [2, None]}}}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in PREMISES])
def test_a_point_whose_premise_did_not_hold_is_counted_apart_never_as_agreement(case):
    # r00 agrees at value 8, but its counters there say the premise did not hold: it must leave the denominator
    records = panel(4, {8: 2}, values=(7, 8))
    records[3]["sweep"][1] = point(8, served=case.served)
    found = axis_of(built(records))["points"][1]
    apart = case.state != sweep_report.HELD
    assert sweep_report.premise(typed([records[3]])[0].sweep[1]) == (case.state, case.why)
    assert (found["rows"], found["counted"]) == (4, 3 if apart else 4), found
    assert found["suffix_divergence"] == wilson(2, 3 if apart else 4), found["suffix_divergence"]
    assert found["why"] == ({case.why: 1} if apart else {}), found["why"]
    assert (found["vacuous"], found["unreadable"]) == ((case.state == sweep_report.VACUOUS,
                                                        case.state == sweep_report.UNREADABLE)), found


def test_a_point_every_row_of_which_is_vacuous_shows_nothing_counted():
    records = panel(2, {}, values=(7, 8), served=VACUOUS)
    report = built(records)
    found = axis_of(report)["points"]
    assert all(p["counted"] == 0 and p["suffix_divergence"].n == 0 for p in found), found
    assert axis_of(report)["first_difference"] is None
    text = sections.markdown(report)
    assert "| 7 | runtime.x.block_size 8 x1 | 2 | 2 (vacuous 2) |" in text, text
    assert ("Edge sweep bf16, position 7: 2 rows not counted: at position 7 (runtime.x.block_size 8 x1): edge counted "
            "prefill_steps 1, the point needs at least 2") in text, text[-3000:]
    assert sweep_section.summary_table(build_report(typed(records), {})).rows[0][-1] == "4", "4 row-points not counted"


# ---- per axis: the first value where anything differs ----

class First(NamedTuple):
    id: str
    at: dict[int, dict]  # value -> headline() arguments of row r00 there
    first: dict | None
    suffix: int | None


FIRSTS = [First("none", {}, None, None),
          First("logits-then-continuation", {16: {"logits": False}, 17: {"suffix": False, "logits": False}},
                {"value": 16, "edge": "runtime.x.block_size 8 x2", "what": ["logits"]}, 17),
          First("cache-and-next-token", {7: {"cache": False, "argmax": False}},
                {"value": 7, "edge": "runtime.x.block_size 8 x1 - 1", "what": ["cache", "next token"]}, None)]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FIRSTS])
def test_each_axis_names_the_first_value_where_anything_differs(case):
    edges = {7: " - 1", 8: "", 9: " + 1", 15: " - 1", 16: "", 17: " + 1"}
    points = [point(v, f"runtime.x.block_size 8 x{(v + 1) // 8}{where}", **case.at.get(v, {}))
              for v, where in edges.items()]
    others = [point(v, f"runtime.x.block_size 8 x{(v + 1) // 8}{where}") for v, where in edges.items()]
    found = axis_of(built([sweep("r00", points), sweep("r01", others)]))
    assert found["first_difference"] == case.first, found["first_difference"]
    assert found["first_suffix_divergence"] == case.suffix
    assert [p["on_edge"] for p in found["points"]] == [False, True, False, False, True, False]


def test_the_whole_prefix_is_labelled_and_axes_are_kept_apart():
    records = [sweep("r00", [point(8), point(37, None), point(2, "sweep.batch 2", "batch", suffix=False)])]
    report = built(records)
    assert list(report["sweeps"]["bf16"]["axes"]) == ["position", "batch"]
    assert [p["value"] for p in axis_of(report)["points"]] == [8], "each row's whole prefix is no swept value"
    whole = axis_of(report)["whole_prefix"]
    assert (whole["value"], whole["edge"], whole["on_edge"], whole["rows"]) == (None, sweep_report.WHOLE, False, 1), \
        whole
    assert axis_of(report)["first_suffix_divergence"] is None
    assert axis_of(report, axis="batch")["first_suffix_divergence"] == 2


# ---- replicas ----

def test_every_replica_is_checked_at_every_point_not_only_the_last():
    records = panel(3, {})
    records[1]["sweep"][0] = point(7, replica=False)  # the first point only; the record's own comparisons are the last
    report = built(records)
    cell = report["sweeps"]["bf16"]
    assert cell["replicas"]["edge~edge_replica"].k == 2 and cell["replicas"]["reference~reference_replica"].k == 3
    assert [p["replicas_exact"].k for p in cell["axes"]["position"]["points"]] == [2, 3, 3]
    assert "| sweep | bf16 | edge~edge_replica (every point) | 2/3" in sections.markdown(report)


def test_a_replica_that_differs_at_an_earlier_point_contradicts_a_pass():
    from replaytests.inputs.contract import default_gates

    records = panel(2, {})
    records[0]["sweep"][0] = point(7, replica=False)
    found = checked_verdict(Verdict("pass", {"passed": 1}), typed(records), default_gates())
    assert found.result == "fail" and "sweep replicas (every point)" in found.contradicted, found


# ---- what a reader sees ----

def test_the_headline_row_counts_every_point_whose_premise_held_not_only_the_last():
    records = panel(4, {8: 2}, values=(7, 8, 9))  # the last point, 9, agrees in every row
    records[3]["sweep"][0] = point(7, served=VACUOUS, suffix=False)  # vacuous: not counted
    records[2]["sweep"][1] = point(8, replica=False)
    columns = dict(zip(summary.COLUMNS, summary.table_rows(typed(records))[0], strict=True))
    assert (columns["suffix div."], columns["replicas exact"]) == ("2/4", "3/4"), columns
    report = built(records)
    assert report["families"]["sweep"]["precisions"]["bf16"]["replicas_exact"].k == 3



def test_report_md_has_a_table_per_cell_and_axis():
    records = [sweep("r00", [point(8, suffix=False), point(2, "sweep.batch 2", "batch")]),
               sweep("r00", [point(8), point(2, "sweep.batch 2", "batch")], "fp32")]
    text = sections.markdown(built(records, {"options": {"backend": "vllm"}}))
    titles = [line for line in text.splitlines() if line.startswith("### Edge sweep")]
    expected = [f"{cell}, axis {axis}, runtime vllm" for cell in ("bf16", "fp32") for axis in ("position", "batch")]
    assert [t.split("engine, ", 1)[1] for t in titles] == expected, titles
    assert "| 8 | runtime.x.block_size 8 x1 | 1 | 0 | 1/1 = 100.0% [20.7, 100.0] |" in text


def test_no_sweep_section_without_sweep_records():
    records = [record("crossing", "r1", "bf16", {"incremental~prefill": comparison()})]
    report = built(records)
    assert "sweeps" not in report and not sweep_section.figures(report)
    report = build_report(typed(records), {})
    assert sweep_section.summary_table(report) is None and "Edge sweep" not in summary.text_table(report)
    assert "Edge sweep" not in sections.markdown(report)


def test_report_html_draws_a_plot_per_axis_one_line_per_cell_with_its_edges():
    records = [*panel(3, {8: 1}), *panel(3, {9: 2}, precision="fp32"),
               sweep("b0", [point(7), point(2, "sweep.batch 2", "batch", logits=False)])]
    figures = sweep_section.figures(built(records))
    assert len(figures) == 2, "one plot per axis"
    position = figures[0]
    assert "position 8 (runtime.x.block_size 8 x1) bf16: 1/3" in position, "the continuation panel's bf16 line"
    assert "position 8 (runtime.x.block_size 8 x1) bf16: 0/3" in position, "the logits panel's bf16 line"
    assert "position 9 (runtime.x.block_size 8 x1) fp32: 2/3" in position
    assert "<title>8: bf16 runtime.x.block_size 8 x1; fp32 runtime.x.block_size 8 x1</title>" in position


def test_a_hostile_edge_label_and_runtime_are_text_in_report_html():
    hostile = "<img src=x onerror=alert(1)>"
    page = report_html.page(built([sweep("r00", [point(8, hostile, suffix=False)])], {"options": {"backend": hostile}}))
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_summary_and_terminal_show_the_sweep_per_cell_and_axis():
    records = typed([*panel(4, {8: 1, 9: 2}, "suffix"), *panel(2, {}, precision="fp32")])
    md = summary.markdown(build_report(records, {}), {})
    assert "| bf16 | position | 4 | 3 | 0 | 2 | 8 (continuation) | 0 |" in md, md
    assert "| fp32 | position | 2 | 3 | 0 | 0 | none | 0 |" in md, md
    assert "Edge sweep, value by value" in summary.text_table(build_report(records, {}))


# ---- compare ----

def judged(baseline: list[dict], new: list[dict], gate: str):
    return comparing.compare(typed(baseline), typed(new), gate=gate)


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_the_same_sweep_run_passes_at_every_gate(gate):
    records = panel(8, {8: 2, 9: 3})
    found = judged(records, copy.deepcopy(records), gate)
    assert found.passed and found.found == {"bits": 0, "trajectories": 0, "rates": 0}, found.text()
    assert any(m.measure == "every point: replicas, exact-cell continuations" and m.ok for m in found.lines)


def test_a_value_whose_continuation_rate_moved_fails_at_gate_rates():
    found = judged(panel(10, {}), panel(10, {8: 8}), "rates")
    reasons = [r for r in found.reasons if r.startswith(findings.RATES_REASONS)]
    assert len(reasons) == 1 and "sweep/bf16 position 8 reference~edge continuation divergence" in reasons[0], reasons
    assert "baseline 0/10, new 8/10" in reasons[0] and "p = 0.00781" in reasons[0], reasons[0]


def test_a_value_whose_continuation_moved_within_chance_passes_at_gate_rates():
    found = judged(panel(10, {}), panel(10, {8: 2}), "rates")
    assert not [r for r in found.reasons if r.startswith(findings.RATES_REASONS)], found.reasons
    assert any(m.measure == "position 8 reference~edge continuation divergence" and m.p == 0.5 for m in found.lines)


def test_vacuous_points_are_not_paired_for_the_rates():
    vacuous = VACUOUS
    new = panel(10, {8: 8})
    for r in new:
        r["sweep"][1]["served"] = vacuous
    found = judged(panel(10, {}), new, "rates")
    assert not [r for r in found.reasons if r.startswith(findings.RATES_REASONS)], found.reasons
    assert any("10 sweep points both runs hold not paired" in n for n in found.notes), found.notes


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_a_replica_that_differs_at_an_earlier_point_fails_at_every_gate(gate):
    baseline = panel(3, {})
    new = copy.deepcopy(baseline)
    new[0]["sweep"][0] = point(7, replica=False)
    found = judged(baseline, new, gate)
    assert any(r.startswith("sweep gate: 1 of 3 points: at position 7") and "sweep row r00 (bf16): edge~edge_replica"
               in r for r in found.reasons), found.reasons


def test_an_exact_cell_s_sweep_that_diverges_at_a_point_fails():
    baseline = panel(3, {}, precision="fp32")
    found = judged(baseline, panel(3, {8: 1}, precision="fp32"), "rates")
    assert any(r.startswith("sweep gate:") and "at position 8" in r and "sweep.suffix_divergence_allowed.fp32" in r
               for r in found.reasons), found.reasons
    allowed = judged(panel(3, {}), panel(3, {8: 1}), "rates")  # bf16: the contract defaults allow it
    assert not [r for r in allowed.reasons if r.startswith("sweep gate:")], allowed.reasons
