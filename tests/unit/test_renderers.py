"""The report's renderers: report.md and report.html in the paper's order (the verdict and the headline
first), the run details, and plots whose labels and axes stay readable (structure and geometry read
from the SVG, not pixels). tools/screenshots.py shows the same pages in a browser."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
from test_report import PASSED, comparison, crossing, excluded, record, typed

from replaytests.families.registry import LAYERS
from replaytests.inputs.options import REPO
from replaytests.outputs import ledger, plots, report_html, runs, sections
from replaytests.outputs.report import build_report
from replaytests.outputs.stats import wilson

FAILED_VERDICT = {"result": "fail", "tests": {"passed": 10, "failed": 1},
                  "failures": [{"check": "test_incremental_vs_prefill_suffix[fp32-r7]",
                                "message": "crossing row r7 (fp32): suffixes diverge at suffix index 3"}],
                  "platform": "device_kind cpu, cpu_isa AVX2", "bank": "bank.jsonl, made on this platform",
                  "baseline": "none", "platform_drift": [], "drift": []}
META = {"verdict": FAILED_VERDICT, "contract": {"name": "cpu-tiny", "sha256": "d" * 64, "path": "c.yaml"},
        "options": {"bank": "bank.jsonl", "model": "m", "precision": "both"},
        "manifest": {"bank_sha256": "b" * 64, "model_sha256": "a" * 64},
        "run": {"name": "night-7", "started": "2026-12-01T02:00:00+00:00", "finished": "2026-12-01T02:05:00+00:00",
                "seconds": 300.0, "interrupted": False}}


@pytest.fixture(scope="module")
def report():
    records = [crossing(f"r{i}", precision, suffix_equal=not (precision == "bf16" and i < 2), cache_exact=False,
                        first_divergence=5 if precision == "bf16" and i < 2 else None, rel_l2=1e-3)
               for i in range(6) for precision in ("bf16", "fp32")]
    records += [record("bridge", "r0", p, {"live~incremental": comparison()}) for p in ("bf16", "fp32")]
    records.append(excluded("crossing", "r9", "bf16", "physical batch rows differ"))
    return build_report(typed(records), META)


def headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


def test_markdown_puts_verdict_and_headline_first_then_the_layers_in_order(report):
    text = sections.markdown(report)
    found = headings(text)
    layers = [title for title, _ in LAYERS.values()]
    assert found[:2] == ["## FAIL (1 failed, 10 passed)", "## Headline: every family and precision"], found
    assert found[2:6] == [f"## {n}. {title}" for n, title in enumerate(layers, start=1)], found
    assert found[-2:] == ["## Plots", "## Run details"], found
    first_screen = text[:text.index("## 1.")]
    assert "FAILED test_incremental_vs_prefill_suffix[fp32-r7]: crossing row r7 (fp32)" in first_screen, \
        "the failing row and its reason are not on the first screen"
    assert "| crossing | bf16 | 7 | 1 | 6/6 | 0/6 | 2/6 | 0/6 | 0/6 |" in first_screen, first_screen
    assert "| crossing | r9 | bf16 | physical batch rows differ |" in first_screen, "excluded rows not listed"


def test_html_has_the_same_order_with_plots_before_the_run_details(report):
    page = report_html.page(report)
    found = re.findall(r"<h2>([^<]*)</h2>", page)
    assert found[0].startswith("FAIL") and found[1] == "Headline: every family and precision", found
    assert found[-2:] == ["Plots", "Run details"], found
    assert '<section class="verdict fail">' in page, "the verdict box does not carry its result"
    assert page.index("<svg") > page.index("4. Causal state sufficiency"), "plots come after the layers"


def test_run_details_are_one_compact_table_and_every_input_is_folded(report):
    table = dict(sections.details(report).rows)
    assert table["contract"] == "cpu-tiny (sha256 dddddddddddd…, c.yaml)", table
    assert table["run"] == ("name night-7, started 2026-12-01T02:00:00+00:00, finished 2026-12-01T02:05:00+00:00, "
                            "300 s"), table
    assert table["bank"] == "bank.jsonl (sha256 bbbbbbbbbbbb…)", table
    text = sections.markdown(report)
    assert text.index("<details><summary>Every input</summary>") > text.index("## Run details"), \
        "the full inputs are not folded below the run details"


def test_the_run_details_platform_is_the_verdicts_line_without_a_backends_settings():
    """The run details' platform row is the one line the verdict and the run header say (runs.describe_platform):
    field names and values in run.json's order; a backend's settings section (runtime.vllm) is the serving premise's,
    never printed as a Python dict (it was, in every vLLM and llama.cpp report)."""
    platform = {"software.vllm": "0.32.0", "hardware.device_kind": "cpu", "runtime.vllm": {"block_size": 32},
                "environment.cpu_isa": "AVX2", "hardware.gpu_name": None}
    table = dict(sections.details(build_report([], META | {"platform": platform})).rows)
    assert table["platform"] == "cpu_isa AVX2, device_kind cpu, vllm 0.32.0", table["platform"]
    assert table["platform"] == runs.describe_platform(dict(reversed(platform.items()))), "the order is the dict's"


def test_long_cells_may_wrap_and_short_ones_never(report):
    page = report_html.page(report)
    assert "td.long{white-space:normal" in page and "white-space:nowrap" in page
    long_cells = re.findall(r"<td class=long>([^<]*)</td>", page)
    assert long_cells and all(len(cell) > 48 for cell in long_cells), long_cells
    assert not [c for c in re.findall(r"<td>([^<]*)</td>", page) if len(c) > 48], "a long cell that cannot wrap"


def label_boxes(svg: str) -> list[tuple[float, float, float, str]]:
    """(x_left, x_right, y, text) of every text element, from its anchor and the layout's character width."""
    boxes = []
    for x, y, anchor, rest, label in re.findall(
            r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)"([^>]*)>([^<]*)</text>', svg):
        if "rotate" in rest:  # an axis title set vertically, beside the tick labels
            continue
        width = len(label) * plots.CHAR
        left = {"start": float(x), "middle": float(x) - width / 2, "end": float(x) - width}[anchor]
        boxes.append((left, left + width, float(y), label))
    return boxes


def overlaps(boxes) -> list[tuple[str, str]]:
    return [(a[3], b[3]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if abs(a[2] - b[2]) < plots.FONT and a[0] < b[1] and b[0] < a[1]]


LONG_LABELS = [(("batch bf16", "incremental_pair~incremental_singleton"), [(0, "suffix", wilson(0, 12))]),
               (("crossing bf16",), [(0, "suffix", wilson(2, 48)), (1, "answer", wilson(0, 48))]),
               *(((f"family{i} fp32",), [(0, "suffix", wilson(i, 12))]) for i in range(8))]


@pytest.mark.parametrize("svg", [
    pytest.param(plots.interval_plot("rates", LONG_LABELS, ["suffix", "answer"]), id="interval-plot"),
    pytest.param(plots.histogram("one row", [7]), id="histogram-one-row"),
    pytest.param(plots.drift_plot("drift", {("bf16", "K"): [0, 1e-3, 4e-3], ("bf16", "V"): [0, 9e-4, 3e-3],
                                            ("fp32", "K"): [1e-7, 4e-7, 5e-7], ("fp32", "V"): [1e-7, 4e-7, 5e-7]}),
                 id="drift-plot"),
    pytest.param(plots.time_plot("history", [f"2026-12-{d:02d} 02:00" for d in range(1, 31)],
                                 {"bf16 suffix": [wilson(d % 5, 48) for d in range(30)]}), id="time-plot"),
])
def test_no_two_labels_overlap(svg):
    assert not overlaps(label_boxes(svg)), f"overlapping labels: {overlaps(label_boxes(svg))}"


def test_histogram_of_one_row_has_an_axis_around_it():
    svg = plots.histogram("one row", [7])
    ticks = [label for _, _, _, label in label_boxes(svg) if label.isdigit()]
    assert ticks[-1] == "10" and "1" in ticks, f"x ticks 0..10 and a count axis of 1: {ticks}"
    bars = re.findall(r'<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"', svg)
    assert len(bars) == 1 and float(bars[0]) < 60, f"one narrow bar, not one filling the axis: {bars}"


def test_series_differ_by_more_than_colour():
    shapes = {shape for _, shape, _ in plots.SERIES}
    dashes = {dash for _, _, dash in plots.SERIES}
    assert len(shapes) == len(dashes) == len(plots.SERIES), "series must differ in marker and dash (greyscale)"


def test_a_drift_plot_of_exact_layers_only_is_not_drawn():
    assert plots.drift_plot("exact", {("bf16", "K"): [0.0, 0.0]}) is None


def _screenshots():
    spec = importlib.util.spec_from_file_location("screenshots", REPO / "tools" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bad_ledger(tmp: Path) -> list[str]:
    (tmp / "run").mkdir()
    (tmp / "run" / "ledger.jsonl").write_text('{"schema": "replaytests.ledger/5", "family": 3}\n')
    return [str(tmp / "run")]


def _bad_history(tmp: Path) -> list[str]:
    shutil.copytree(REPO / "fixtures" / "ledgers" / "cpu-tiny-xeon", tmp / "run")  # a finished run, a small one
    (tmp / "h.jsonl").write_text(json.dumps({"schema": "replaytests.history/1", "date": "2026-12-01", "label": None,
                                             "ledger": "x", "ledger_sha256": "0" * 64,
                                             "families": {"live": {"bf16": 3}}}) + "\n")
    return [str(tmp / "run"), "--history", str(tmp / "h.jsonl")]


@pytest.mark.parametrize(("inputs", "line"), [
    pytest.param(_bad_ledger, r"run/ledger\.jsonl:1: ledger record .*field 'family': expected a string, got 3",
                 id="bad-ledger"),
    pytest.param(_bad_history, r"h\.jsonl:1: field 'families\.live\.bf16' must be an object with rows, excluded and "
                               r"pairs, got 3", id="bad-history"),
])
def test_screenshots_of_bad_input_is_one_line(tmp_path, monkeypatch, capsys, inputs, line):
    monkeypatch.setenv("CHROMIUM", "/bin/true")  # found, never reached: the inputs are read first
    monkeypatch.setattr("sys.argv", ["screenshots.py", *inputs(tmp_path), "--out", str(tmp_path / "shots")])
    code = _screenshots().main()
    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (2, 1), f"exit {code}, stderr {err!r}"
    assert re.match(rf"screenshots: error: .*{line}$", err.strip()), err


ECHO_SECTION = '''"""A report section module of a family the outputs have never seen (outputs/family_sections.py)."""
from replaytests.outputs.tables import Table

TERMINAL = True
HEADLINE_SCOPE = "at every echo"
HEADLINE_DIVERGENCES = False


def headline_comparisons(record, pair):
    return [record.comparisons["echo~pair"]]


def build(records, runtime, cells, pairs):
    echoes = [r for r in records if r.family == "echo"]
    cells = sorted({r.precision for r in echoes})
    return {"echoes": {"rows": [r.row for r in echoes], "cells": cells}} if echoes else {}


def replica_rows(report):
    cells = (report.get("echoes") or {}).get("cells", ())
    return [("echo", cell, "echo~echo_replica (every echo)", "3/3") for cell in cells]


def fidelity(report):
    if "echoes" not in report:
        return [], [], []
    rows = tuple((row,) for row in report["echoes"]["rows"])
    return [Table("Echo table", ("row",), rows)], [Table("Echo folded", ("row",), rows)], ["Echo line <b>"]


def summary_table(report):
    return Table("Echo summary", ("rows",), ((str(len(report["echoes"]["rows"])),),), "echo note") \\
        if "echoes" in report else None


def figures(report):
    return ["<p>echo figure</p>"] if "echoes" in report else []


def failing(record, gates):
    return ["the echo check"]


def compare(out, group, base, new, gates, alpha):
    out.notes.append(f"echo compared {'/'.join(group)}: {len(base)} and {len(new)} rows")
'''


@pytest.mark.parametrize("named", [True, False], ids=["named", "not-named"])
def test_a_family_naming_a_report_section_module_is_shown_by_every_renderer(tmp_path, monkeypatch, named):
    """A new family whose registry record names a report section module, and nothing else: its keys are in report.json,
    its rows, tables, lines, summary table and figures in report.md, report.html, summary.md and the terminal, its
    checks in `compare` and in the report's check of a run's pass, where the built-in sections' are
    (outputs/family_sections.py); the control: the same family naming none is shown in none of them."""
    from dataclasses import replace

    from replaytests.families.registry import FAMILIES
    from replaytests.outputs import summary
    from replaytests.outputs.compare import compare
    from replaytests.outputs.shapes import NO_REPLICAS

    (tmp_path / "echo_section.py").write_text(ECHO_SECTION)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(FAMILIES, "echo", replace(FAMILIES["crossing"], name="echo", title="Echo",
                                                  report_section="echo_section" if named else ""))
    records = typed([record("echo", row, "bf16", {"incremental~prefill": comparison(),
                                                  "echo~pair": comparison(cache_exact=False)}) for row in ("e1", "e2")])
    built = build_report(records, {})
    page, md = report_html.page(built), sections.markdown(built)
    replica_row = "| echo | bf16 | echo~echo_replica (every echo) | 3/3 |"
    # the headline row reads what the section's headline_comparisons gives (echo~pair: cache differs) and no divergence
    headline = ["echo", "bf16", "2", "0", NO_REPLICAS, "0/2", "-", "-", "-"]
    found = {"report.json": "echoes" in built, "headline row": headline in built["headline"]["rows"],
             "replica row": replica_row in md, "fidelity table": "Echo table" in md,
             "folded table": "Echo folded" in md, "line": "Echo line" in md,
             "summary.md": "Echo summary" in summary.markdown(built, {}),
             "terminal": "Echo summary" in summary.text_table(built), "figure": "<p>echo figure</p>" in page,
             "compare": "echo compared echo/bf16: 2 and 2 rows" in compare(records, records).notes,
             "verdict": "the echo check" in str(build_report(records, {"verdict": PASSED})["verdict"].contradicted)}
    assert found == dict.fromkeys(found, named), f"named {named}: {found}"
    assert "Echo line <b>" not in page and ("Echo line &lt;b&gt;" in page) == named, "a section's line not escaped"


def test_the_interval_plot_names_the_pair_of_a_family_with_several_even_one_this_install_does_not_know():
    """report.html's interval plot labels a row with its pair where the family has several headline pairs: a family of
    a plugin not installed here shows every pair it holds, each row named (its label was only `family cell`)."""
    tiny = REPO / "fixtures" / "ledgers" / "cpu-tiny"
    report = build_report(ledger.collate([tiny / "ledger.jsonl"]), runs.report_meta([tiny]))
    crossing_bf16 = report["families"]["crossing"]["precisions"]["bf16"]
    pair = next(iter(crossing_bf16["pairs"].values()))
    report["families"] = {"crossing": report["families"]["crossing"], "ghost": {"precisions": {"bf16": {
        **crossing_bf16, "pairs": {"a~b": pair, "a~c": pair}}}}}
    figures, _ = report_html.report_plots(report)
    labels = re.findall(r'text-anchor="end"[^>]*>([^<]*)<', figures[0])
    assert {"ghost bf16", "a~b", "a~c"} <= set(labels) and "incremental~prefill" not in labels, labels
