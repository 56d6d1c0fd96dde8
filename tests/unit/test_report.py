"""replaytests.outputs.report: report.json from hand-built ledger records, its Markdown and HTML twins, collation
of several ledgers, bad input, and `replaytests report`.

The `paper` fixtures rebuild docs/protocol.md §12's counts as ledger records (200 rows, BF16 and FP32), so the
report's tables can be checked against the paper's figures.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from replaytests.cli import main
from replaytests.errors import ConfigError, LedgerError
from replaytests.files import dumps
from replaytests.outputs import causal, ledger
from replaytests.outputs.ledger import collate
from replaytests.outputs.records import Record
from replaytests.outputs.report import build_report, write_report
from replaytests.outputs.runs import report_meta, run_meta
from replaytests.outputs.sections import markdown
from replaytests.outputs.stats import as_json, wilson
from replaytests.outputs.verdict import Verdict

LAYERS = 3


def typed(records: list) -> list[Record]:
    """Hand-built records (ledger lines, as JSON) read as the ledger's reader reads them."""
    return [r if isinstance(r, Record) else Record.of(r) for r in records]


def comparison(*, cache_exact: bool = True, suffix_equal: bool = True, answer_equal: bool = True,
               correct_equal: bool = True, first_divergence: int | None = None, max_abs: float = 0.0,
               rel_l2: float = 0.0, logits_max_abs: float = 0.0) -> dict:
    """A complete ledger comparison (docs/ledger.md); drift is the same in K and V and in every layer."""
    drift = {f"{kv}_{name}": value for kv in "kv" for name, value in (("rel_l2", rel_l2), ("max_abs", max_abs))}
    per_layer = {f"{name}_per_layer": [value] * LAYERS for name, value in drift.items()}
    return {"cache_exact": cache_exact, **drift, **per_layer, "logits_exact": cache_exact,
            "logits_max_abs": logits_max_abs, "argmax_equal": True, "suffix_equal": suffix_equal,
            "first_divergence": first_divergence, "margins_at_divergence": None if suffix_equal else [0.5, 0.25],
            "top1_at_divergence": None if suffix_equal else [1.5, 1.25], "first_token_equal": first_divergence != 0,
            "answer_equal": answer_equal, "correct_equal": correct_equal}


def record(family: str, row: str, precision: str, comparisons: dict, correct: dict | None = None, **extra) -> dict:
    """A ledger record; every arm named in a comparison key gets an arm entry, `correct` maps arm -> label."""
    names = sorted({arm for pair in comparisons for arm in pair.split("~")})
    arms = {arm: {"suffix": [1, 2], "answer": "a", "correct": (correct or {}).get(arm), "cache_digest": "c" * 64,
                  "layer_digests": {"k": ["k" * 16] * LAYERS, "v": ["v" * 16] * LAYERS},
                  "logits_digest": "l" * 64, "z_sha256": "z" * 64, "margins": [0.5, None]} for arm in names}
    return {"schema": ledger.SCHEMA, "family": family, "row": row, "precision": precision, "prefix_len": 10,
            "cell_digest": "d" * 64, "expected_answer": "a", "status": "ok", "arms": arms, "comparisons": comparisons,
            **extra}


def excluded(family: str, row: str, precision: str, reason: str) -> dict:
    return {"schema": ledger.SCHEMA, "family": family, "row": row, "precision": precision, "prefix_len": 10,
            "cell_digest": "d" * 64, "expected_answer": "a", "status": "excluded", "reason": reason}


def crossing(row: str, precision: str = "bf16", correct: dict | None = None, **headline) -> dict:
    """A crossing record with exact replicas and the given incremental~prefill comparison."""
    return record("crossing", row, precision, {
        "incremental~incremental_replica": comparison(), "prefill~prefill_replica": comparison(),
        "incremental~prefill": comparison(**headline)}, correct)


# docs/protocol.md §12: BF16 Table 4 drift (FP32 beside it); suffixes differ on 166 rows, answers on 49,
# correctness labels on 20 (9 first-arm-only correct, 11 second-arm-only); 84 rows both correct.
DRIFT = {"bf16": {"max_abs": 4.409, "rel_l2": 0.01224, "logits_max_abs": 0.4375},
         "fp32": {"max_abs": 0.001857, "rel_l2": 4.270e-6, "logits_max_abs": 1.044e-4}}


def paper_row(first: str, second: str, i: int, precision: str) -> tuple[dict, dict]:
    bf16 = precision == "bf16"
    # First divergence 4 on one row, 453 on one, 88 on the rest: median 88, range 4-453.
    position = 4 if i == 0 else 453 if i == 165 else 88
    headline = comparison(cache_exact=False, suffix_equal=not (bf16 and i < 166), answer_equal=not (bf16 and i < 49),
                          correct_equal=not (bf16 and i < 20), first_divergence=position if bf16 and i < 166 else None,
                          **DRIFT[precision])
    labels = {first: i < 9 or 20 <= i < 104, second: 9 <= i < 104} if bf16 else dict.fromkeys((first, second), i < 104)
    pairs = {f"{first}~{first}_replica": comparison(), f"{second}~{second}_replica": comparison(),
             f"{first}~{second}": headline}
    return pairs, labels


def paper_records(family: str, first: str, second: str) -> list[dict]:
    return [record(family, f"r{i:03d}", precision, *paper_row(first, second, i, precision))
            for i in range(200) for precision in ("bf16", "fp32")]


@pytest.fixture(scope="module")
def paper():
    records = paper_records("crossing", "incremental", "prefill") + paper_records("live", "live", "prefill")
    return build_report(typed(records), {"model": "paper-14b"})


def at(report: dict, *path: str):
    for step in path:
        report = report[step]
    return report


@pytest.mark.parametrize(("path", "k", "n"), [
    pytest.param(("crossing", "bf16", "replicas_exact"), 200, 200, id="crossing-bf16-replicas"),
    pytest.param(("crossing", "bf16", "pairs", "incremental~prefill", "cache_exact"), 0, 200, id="crossing-bf16-cache"),
    pytest.param(("crossing", "bf16", "pairs", "incremental~prefill", "suffix_divergence"), 166, 200,
                 id="crossing-bf16-suffix"),
    pytest.param(("crossing", "bf16", "pairs", "incremental~prefill", "answer_divergence"), 49, 200,
                 id="crossing-bf16-answer"),
    pytest.param(("crossing", "bf16", "pairs", "incremental~prefill", "correctness_divergence"), 20, 200,
                 id="crossing-bf16-correctness"),
    pytest.param(("crossing", "fp32", "pairs", "incremental~prefill", "suffix_divergence"), 0, 200,
                 id="crossing-fp32-suffix"),
    pytest.param(("crossing", "bf16", "pairs", "incremental~prefill", "argmax_differs"), 0, 200,
                 id="crossing-bf16-argmax"),
    pytest.param(("live", "bf16", "accuracy", "arms", "live"), 93, 200, id="live-accuracy-live"),
    pytest.param(("live", "bf16", "accuracy", "arms", "prefill"), 95, 200, id="live-accuracy-prefill"),
    pytest.param(("live", "fp32", "pairs", "live~prefill", "correctness_divergence"), 0, 200, id="live-fp32-flips"),
])
def test_paper_counts_are_wilson_proportions(paper, path, k, n):
    family, precision, *rest = path
    got = at(paper, "families", family, "precisions", precision, *rest)
    assert got == wilson(k, n), f"{'/'.join(path)}: {got}, expected {k}/{n} with its Wilson interval"


@pytest.mark.parametrize(("family", "pair"), [pytest.param("crossing", "incremental~prefill", id="crossing"),
                                              pytest.param("live", "live~prefill", id="live")])
@pytest.mark.parametrize(("metric", "b", "p", "diff", "ci"), [
    pytest.param("suffix_divergence", 166, 2.14e-50, 0.83, (0.775, 0.880), id="suffix"),
    pytest.param("answer_divergence", 49, 3.55e-15, 0.245, (0.185, 0.305), id="answer"),
    pytest.param("correctness_divergence", 20, 1.91e-6, 0.10, (0.060, 0.145), id="correctness"),
])
def test_paired_reduction_bf16_to_fp32_matches_paper(paper, family, pair, metric, b, p, diff, ci):
    (reduction,) = at(paper, "families", family, "reductions", pair)
    test = reduction["metrics"][metric]
    assert (reduction["from"], reduction["to"], reduction["rows"]) == ("bf16", "fp32", 200), reduction
    assert (test["mcnemar"].b, test["mcnemar"].c) == (b, 0), f"{metric}: discordant counts {test['mcnemar']}"
    assert test["mcnemar"].p == pytest.approx(p, rel=5e-3), f"{metric}: McNemar p {test['mcnemar'].p}, paper {p}"
    boot = test["difference"]
    assert boot.diff == pytest.approx(diff, abs=1e-12), f"{metric}: difference {boot.diff}, paper {diff}"
    assert (boot.ci_low, boot.ci_high) == pytest.approx(ci, abs=0.015), f"{metric}: CI vs paper {ci}: {boot}"
    assert (boot.seed, boot.resamples) == (0, 10_000), f"{metric}: bootstrap seed/resamples {boot}"


def test_live_accuracy_difference_matches_paper_exp1(paper):
    accuracy = at(paper, "families", "live", "precisions", "bf16", "accuracy")
    assert (accuracy["x"], accuracy["y"]) == ("prefill", "live"), accuracy
    mcnemar, boot = accuracy["mcnemar"], accuracy["difference"]
    assert (mcnemar.b, mcnemar.c) == (11, 9), f"discordant (prefill only, live only) {mcnemar}"
    assert mcnemar.p == pytest.approx(0.824, abs=5e-4), f"McNemar p {mcnemar.p}, paper 0.824"
    assert boot.diff == pytest.approx(0.01, abs=1e-12), f"prefill - live {boot.diff}, paper +1.0 pp"
    assert (boot.ci_low, boot.ci_high) == pytest.approx((-0.035, 0.055), abs=0.015), f"CI {boot}"


@pytest.mark.parametrize(("precision", "name", "stat", "expected"), [
    pytest.param("bf16", "cache_max_abs", "max", 4.409, id="bf16-cache-max-abs"),
    pytest.param("fp32", "cache_max_abs", "max", 0.001857, id="fp32-cache-max-abs"),
    pytest.param("bf16", "k_rel_l2", "median", 0.01224, id="bf16-k-rel-l2"),
    pytest.param("fp32", "v_rel_l2", "median", 4.270e-6, id="fp32-v-rel-l2"),
    pytest.param("bf16", "logits_max_abs", "max", 0.4375, id="bf16-logits-max-abs"),
    pytest.param("fp32", "logits_max_abs", "max", 1.044e-4, id="fp32-logits-max-abs"),
    pytest.param("bf16", "first_divergence", "median", 88, id="bf16-first-divergence-median"),
    pytest.param("bf16", "first_divergence", "min", 4, id="bf16-first-divergence-min"),
    pytest.param("bf16", "first_divergence", "max", 453, id="bf16-first-divergence-max"),
    pytest.param("bf16", "first_divergence", "n", 166, id="bf16-first-divergence-n"),
    pytest.param("fp32", "first_divergence", "n", 0, id="fp32-nothing-diverges"),
])
def test_table4_spreads(paper, precision, name, stat, expected):
    got = at(paper, "families", "crossing", "precisions", precision, "pairs", "incremental~prefill", name, stat)
    assert got == pytest.approx(expected, rel=1e-12), f"{precision} {name} {stat}: {got}, paper {expected}"


def test_cache_max_abs_is_the_largest_of_k_and_v_over_rows():
    rows = [crossing("a", cache_exact=False, max_abs=0.5), crossing("b", cache_exact=False, max_abs=0.25)]
    rows[1]["comparisons"]["incremental~prefill"]["v_max_abs"] = 2.0
    spread = at(build_report(typed(rows), {}), "families", "crossing", "precisions", "bf16", "pairs",
                "incremental~prefill", "cache_max_abs")
    assert (spread["max"], spread["min"], spread["n"]) == (2.0, 0.5, 2), f"max(K, V) per row, then over rows: {spread}"


def test_per_layer_drift_is_the_mean_over_rows():
    rows = [crossing("a", rel_l2=1e-3), crossing("b", rel_l2=3e-3)]
    pair = at(build_report(typed(rows), {}), "families", "crossing", "precisions", "bf16", "pairs",
              "incremental~prefill")
    assert pair["k_rel_l2_per_layer_mean"] == pytest.approx([2e-3] * LAYERS, rel=1e-12), pair["k_rel_l2_per_layer_mean"]


def test_excluded_rows_are_listed_and_in_no_denominator():
    records = [crossing("a"), crossing("b", suffix_equal=False, first_divergence=3),
               excluded("crossing", "c", "bf16", "PhysicalBatchDesync: step 4 differs")]
    report = build_report(typed(records), {})
    summary = at(report, "families", "crossing", "precisions", "bf16")
    assert (summary["rows"], summary["ok"], summary["excluded"]) == (3, 2, 1), summary
    assert summary["pairs"]["incremental~prefill"]["suffix_divergence"] == wilson(1, 2), "denominator is ok rows"
    assert report["excluded"] == [{"family": "crossing", "row": "c", "precision": "bf16",
                                   "reason": "PhysicalBatchDesync: step 4 differs"}], report["excluded"]
    assert report["records"] == {"total": 3, "ok": 2, "excluded": 1}, report["records"]


def test_reductions_pair_rows_by_id_present_at_both_precisions():
    records = [crossing("a", "bf16", suffix_equal=False, first_divergence=0), crossing("a", "fp32"),
               crossing("b", "bf16", suffix_equal=False, first_divergence=0),
               excluded("crossing", "b", "fp32", "BoundaryMismatch: x"),
               crossing("c", "fp32", suffix_equal=False, first_divergence=0)]
    (reduction,) = at(build_report(typed(records), {}), "families", "crossing", "reductions", "incremental~prefill")
    suffix = reduction["metrics"]["suffix_divergence"]
    assert reduction["rows"] == 1, f"only row a is ok at both precisions: {reduction['rows']}"
    assert (suffix["bf16"], suffix["fp32"]) == (wilson(1, 1), wilson(0, 1)), suffix


def test_no_reductions_with_one_precision():
    family = at(build_report(typed([crossing("a", "bf16")]), {}), "families", "crossing")
    assert "reductions" not in family, f"reductions with BF16 only: {family.get('reductions')}"


def test_no_accuracy_without_expected_answers():
    summary = at(build_report(typed([crossing("a")]), {}), "families", "crossing", "precisions", "bf16")
    assert "accuracy" not in summary, f"accuracy without labels: {summary.get('accuracy')}"


def bridge(row: str, **headline) -> dict:
    return record("bridge", row, "bf16", {"live~incremental": comparison(**headline)}, z_matches_bank=True)


def test_bridge_bit_exact_needs_cache_logits_and_suffix():
    records = [bridge("a"), bridge("b", suffix_equal=False, first_divergence=0), bridge("c", cache_exact=False)]
    summary = at(build_report(typed(records), {}), "families", "bridge", "precisions", "bf16")
    assert summary["pairs"]["live~incremental"]["bit_exact"] == wilson(1, 3), summary["pairs"]
    assert summary["z_matches_bank"] == wilson(3, 3), summary["z_matches_bank"]


def test_batch_counts_per_pair():
    pairs = {"incremental_pair~incremental_singleton": comparison(),
             "prefill_pair~prefill_singleton": comparison(cache_exact=False, suffix_equal=False, first_divergence=2)}
    family = at(build_report(typed([record("batch", "a", "fp32", pairs)]), {}), "families", "batch")
    got = {name: (p["cache_exact"].k, p["logits_exact"].k, p["suffix_divergence"].k)
           for name, p in family["precisions"]["fp32"]["pairs"].items()}
    expected = {"incremental_pair~incremental_singleton": (1, 1, 0), "prefill_pair~prefill_singleton": (0, 0, 1)}
    assert got == expected, f"(cache exact, logits exact, suffix divergent) per pair: {got}"
    assert family["headline_pairs"] == list(pairs), family["headline_pairs"]


def test_unknown_family_is_rendered_generically():
    comps = {"incremental~prefill_recipient": comparison(suffix_equal=False)}
    records = [record("future", "a", "bf16", comps), excluded("future", "b", "bf16", "FailClosed: y")]
    report = build_report(typed(records), {})
    family = report["families"]["future"]
    pair = family["precisions"]["bf16"]["pairs"]["incremental~prefill_recipient"]
    assert (family["known"], family["precisions"]["bf16"]["excluded"]) == (False, 1), family
    found = (pair["rows"], pair["cache_exact"], pair["suffix_divergence"])
    assert found == (1, wilson(1, 1), wilson(1, 1)), pair
    assert "## future: every pair" in markdown(report), "generic table missing from report.md"


def iter_objects(value):
    """Every JSON object nested in `value`, depth first."""
    if isinstance(value, dict):
        yield value
    for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        yield from iter_objects(child)


def test_every_statistic_in_report_json_has_the_documented_shape(paper):
    shapes = {"wilson": {"k", "n", "rate", "ci_low", "ci_high", "method"}, "mcnemar-exact": {"b", "c", "p", "method"},
              "paired-percentile-bootstrap": {"diff", "ci_low", "ci_high", "seed", "resamples", "n", "level", "method"}}
    written = json.loads(dumps(as_json(paper)))  # as report.json holds it
    found = {obj["method"]: obj for obj in iter_objects(written) if "method" in obj}
    assert set(found) == set(shapes), f"statistic kinds {sorted(found)}"
    bad = [obj for obj in iter_objects(written) if obj.get("method") in shapes and set(obj) != shapes[obj["method"]]]
    assert not bad, f"statistics with other keys than documented: {bad[:2]}"
    fractions = [obj for obj in iter_objects(written) if obj.get("method") == "wilson"
                 and not 0 <= obj["ci_low"] <= obj["rate"] <= obj["ci_high"] <= 1]
    assert not fractions, f"Wilson objects outside [0, 1] or unordered: {fractions[:2]}"


@pytest.mark.parametrize("line", [
    pytest.param("| suffix divergence | 166/200 = 83.0% [77.2, 87.6] | 0/200 = 0.0% [0.0, 1.9] | "
                 "+83.0 pp [+78.0, +88.0], p = 2.14e-50; bf16 only 166, fp32 only 0 (200 rows) |",
                 id="suffix-reduction"),
    pytest.param("| cache max \\|Δ\\| (max over rows) | 4.409 | 0.001857 |  |", id="cache-max-abs"),
    pytest.param("| first divergence, median (range) | 88 (4-453), n = 166 | none diverge |  |", id="first-divergence"),
    pytest.param("- **model**: paper-14b", id="meta"),
])
def test_markdown_shows_the_papers_table(paper, line):
    text = markdown(paper)
    assert line in text.splitlines(), f"line not in report.md: {line!r}"


def test_markdown_live_accuracy_difference(paper):
    lines = [line for line in markdown(paper).splitlines() if line.startswith("| accuracy prefill - live, paired |")]
    assert len(lines) == 1, f"accuracy difference lines {lines}"
    expected = "+1.0 pp [-3.5, +5.5], p = 0.824; prefill only 11, live only 9 (200 rows)"
    assert lines[0].split(" | ")[1] == expected, lines[0]


def test_report_works_without_meta_or_records(tmp_path):
    paths = write_report(tmp_path / "out", typed([]), {})
    report = json.loads(paths[0].read_text(encoding="utf-8"))
    assert (report["families"], report["meta"], report["records"]["total"]) == ({}, {}, 0), report
    assert "(no run metadata given)" in paths[1].read_text(encoding="utf-8"), "report.md without a meta note"


@pytest.fixture
def hostile(tmp_path):
    """A report whose row ids, reasons and meta carry markup."""
    records = [crossing("<b>r1</b>", suffix_equal=False, first_divergence=1, cache_exact=False, rel_l2=1e-3),
               crossing("r2", "fp32"), excluded("crossing", "<script>alert(1)</script>", "bf16", "Boom: a | b & <c>")]
    return write_report(tmp_path / "report", typed(records),
                        {"model": "<img src=x onerror=alert(1)>", "env": {"torch": "2"}})


def test_html_is_standalone_and_escaped(hostile):
    html = hostile[2].read_text(encoding="utf-8")
    assert not re.search(r"<(script|img|link|iframe)\b|<[^>]*\s(src|href)=", html), "markup or a network reference"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, "the excluded row id is not shown escaped"
    assert "Boom: a | b &amp; &lt;c&gt;" in html, "the exclusion reason is not shown escaped"


def test_html_has_the_three_kinds_of_plot(hostile):
    html = hostile[2].read_text(encoding="utf-8")
    titles = re.findall(r"<svg [^>]*><title>([^<]*)</title>", html)
    titles = [unescape(t) for t in titles]
    expected = {"per-layer K and V", "first-divergence position", "Divergence of each family's headline pair"}
    kinds = {kind for kind in expected if any(kind in t for t in titles)}
    assert kinds == expected, f"plots: {titles}"


def test_markdown_escapes_table_pipes_and_html(hostile):
    """A row id or a reason is text in report.md: a pipe does not split a cell, and a tag is not HTML."""
    text = hostile[1].read_text(encoding="utf-8")
    assert "| crossing | &lt;script>alert(1)&lt;/script> | bf16 | Boom: a \\| b & &lt;c> |" in text.splitlines(), text
    assert "<script>" not in text and "<c>" not in text, "raw HTML from a record reached report.md"


def test_the_summarys_audit_line_shows_a_changed_row_id_as_text():
    """The baseline records a run changed are named by their keys in summary.md's audit line, a line of its own
    outside any table: a bank row id with markup is text there, as in report.md."""
    from replaytests.outputs import summary

    audits = [{"key": ("crossing", "<img src=x onerror=alert(1)>", "bf16"), "changes": ["cache_digest"], "leaves": 9},
              {"key": ("crossing", "r2", "bf16"), "changes": [], "leaves": 9}]
    text = summary.markdown(build_report(typed([crossing("r2")]), {}), {}, audits)
    (line,) = [line for line in text.splitlines() if line.startswith("ledger audit:")]
    assert "<img" not in text and line.endswith("changed: crossing/&lt;img src=x onerror=alert(1)>/bf16"), line


def test_write_report_leaves_no_temporary_files(hostile):
    names = sorted(p.name for p in hostile[0].parent.iterdir())
    assert names == ["report.html", "report.json", "report.md"], names


def test_unwritable_report_dir_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(blocker / 'out'))}: cannot write report: "):
        write_report(blocker / "out", typed([crossing("a")]), {})


def write_ledger_file(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_collate_reads_directories_and_files_and_deduplicates(tmp_path):
    shard_a = write_ledger_file(tmp_path / "a" / "ledger.jsonl", [crossing("r1"), crossing("r2")])
    shard_b = write_ledger_file(tmp_path / "b.jsonl", [crossing("r2"), crossing("r3")])
    records = collate([shard_a.parent, shard_b])
    assert [r.row for r in records] == ["r1", "r2", "r3"], "one record per key, sorted"


def test_collate_refuses_the_same_row_with_different_results(tmp_path):
    a = write_ledger_file(tmp_path / "a.jsonl", [crossing("r1")])
    b = write_ledger_file(tmp_path / "b.jsonl", [crossing("r1", suffix_equal=False)])
    with pytest.raises(LedgerError, match=rf"^ledger record crossing/r1/bf16 differs between {re.escape(str(a))} "
                                          rf"and {re.escape(str(b))}$"):
        collate([a, b])


@pytest.mark.parametrize(("content", "message"), [
    pytest.param("", ": empty ledger (no records)", id="empty"),
    pytest.param('{"schema": "replaytests.ledger/9", "family": "crossing"}\n',
                 ":1: field 'schema' is 'replaytests.ledger/9', expected 'replaytests.ledger/1' or "
                 "'replaytests.ledger/2'", id="other-schema"),
    pytest.param(json.dumps(crossing("a")) + "\n" + json.dumps(crossing("b"))[:40] + "\n",
                 ":2: not valid JSON", id="truncated-line"),
    pytest.param(json.dumps({"schema": ledger.SCHEMA, "family": "crossing", "row": "a", "precision": "bf16",
                             "status": "ok"}) + "\n", ":1: ledger record crossing/a/bf16: field 'prefix_len': missing",
                 id="ok-without-fields"),
    pytest.param(json.dumps({k: v for k, v in crossing("a").items() if k != "arms"}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'arms': missing (an 'ok' record holds its arms and "
                 "comparisons)", id="ok-without-arms"),
    pytest.param(json.dumps(crossing("a") | {"cell": "bf16"}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'cell': no Record field has this name", id="misspelt-field"),
    pytest.param(json.dumps(crossing("a") | {"schema": "replaytests.ledger/4", "cell_digest": "d"}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'cell_digest': not a field of replaytests.ledger/4 records "
                 "(it came with replaytests.ledger/5)", id="a-later-field-in-an-earlier-version"),
    pytest.param(json.dumps(excluded("crossing", "a", "bf16", "x") | {"status": "skipped"}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'status': expected 'ok' or 'excluded', got 'skipped'",
                 id="unknown-status"),
    *(pytest.param(json.dumps(crossing("a") | {"comparisons": value}) + "\n",
                   f":1: ledger record crossing/a/bf16: field 'comparisons': expected {shown}",
                   id=f"comparisons-{name}")
      for name, value, shown in (("null", None, "an object, got None"),
                                 ("empty", {}, "a non-empty object in an 'ok' record, got {}"),
                                 ("text", "x", "an object, got 'x'"))),
    pytest.param(json.dumps(crossing("a") | {"arms": {}}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'arms': expected a non-empty object in an 'ok' record, "
                 "got {}", id="arms-empty"),
    pytest.param(json.dumps(crossing("a") | {"comparisons": {"incremental~prefill": {"cache_exact": True}}}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'comparisons.incremental~prefill.k_max_abs': missing",
                 id="hollow-comparison"),
    pytest.param(json.dumps(crossing("a") | {"arms": crossing("a")["arms"] | {"prefill": {**crossing("a")["arms"][
        "prefill"], "suffix": [1, "2"]}}}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'arms.prefill.suffix[1]': expected an integer, got '2'",
                 id="suffix-token-a-string"),
    pytest.param(json.dumps(crossing("a") | {"arms": crossing("a")["arms"] | {"prefill": {**crossing("a")["arms"][
        "prefill"], "correct": 1}}}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'arms.prefill.correct': expected true or false or null, "
                 "got 1",
                 id="label-an-integer"),
    pytest.param(json.dumps(crossing("a") | {"comparisons": {"x~y": comparison()}}) + "\n",
                 ":1: ledger record crossing/a/bf16: comparisons lack the crossing family's pair 'incremental~prefill'",
                 id="no-headline-pair"),
    pytest.param(json.dumps(excluded("crossing", "a", "bf16", "x") | {"reason": None}) + "\n",
                 ":1: ledger record crossing/a/bf16: field 'reason': missing: an excluded record says why",
                 id="excluded-without-reason"),
    pytest.param(json.dumps(crossing("a") | {"row": 7}) + "\n",
                 ":1: ledger record crossing/7/bf16: field 'row': expected a string, got 7",
                 id="numeric-row"),
])
def test_collate_bad_ledger_is_one_line_error(tmp_path, content, message):
    path = tmp_path / "ledger.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LedgerError, match=f"^{re.escape(str(path) + message)}"):
        collate([tmp_path])


def _committed(family: str) -> dict:
    """The embedded default's first committed ok record of a causal family, as JSON."""
    with (Path(__file__).resolve().parents[2] / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl").open() as lines:
        return next(record for line in lines if f'"family": "{family}"' in line
                    and (record := json.loads(line))["family"] == family and record["status"] == "ok")


@pytest.mark.parametrize(("family", "field"), [(family, field) for family, module in causal.outcomes().items()
                                               for field in module.REQUIRED])
def test_an_ok_causal_record_without_a_field_its_outcomes_read_is_one_line(tmp_path, family, field):
    """An ok record of a family with causal outcomes lacking a field its outcome module reads (a hand-edited ledger)
    is refused where the ledger is read, naming the line, the record and the field (it was a traceback in the
    report: the conversation transplant's `turn_splice`)."""
    record = _committed(family)
    assert Record.from_json(record).ok, "premise: the committed record is read"
    record.pop(field)
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    key = "/".join(record[name] for name in ("family", "row", "precision"))
    with pytest.raises(LedgerError, match=f"^{re.escape(f'{path}:1: ledger record {key}: field {field!r} missing')}"):
        collate([tmp_path])


def test_collate_directory_without_ledger(tmp_path):
    with pytest.raises(LedgerError, match=rf"^{re.escape(str(tmp_path / 'ledger.jsonl'))}: cannot read ledger"):
        collate([tmp_path])


def test_cli_report_writes_three_files_and_prints_their_paths(tmp_path, capsys):
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", [crossing("r1"), crossing("r1", "fp32")]).parent
    shard = write_ledger_file(tmp_path / "shard.jsonl", [bridge("r9")])
    code = main(["report", str(run), str(shard), "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    expected = [str(tmp_path / "out" / name) for name in ("report.json", "report.md", "report.html")]
    assert (code, out.out.splitlines()) == (0, expected), f"exit {code}, stdout {out.out!r}, stderr {out.err!r}"
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert set(report["families"]) == {"crossing", "bridge"}, list(report["families"])
    assert report["meta"] == {"ledgers": [str(run), str(shard)]}, report["meta"]


def test_cli_report_defaults_to_the_first_input_directory(tmp_path, capsys):
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", [crossing("r1")]).parent
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    assert (run / "report.json").is_file(), "report.json not written beside the ledger"


def test_cli_report_never_rewrites_a_report_unless_forced(tmp_path, capsys):
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", [crossing("r1")]).parent
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    before = {name: (run / name).read_bytes() for name in ("report.json", "report.md", "report.html")}
    write_ledger_file(run / "ledger.jsonl", [crossing("r1"), crossing("r2")])
    code, err = main(["report", str(run)]), capsys.readouterr().err
    assert (code, err) == (4, f"replaytests: error: {run}: holds report.json, report.md, report.html already; pass "
                              "--out DIR for a new report, or --force to replace them\n"), (code, err)
    assert {name: (run / name).read_bytes() for name in before} == before, "a refused report changed the files"
    assert main(["report", str(run), "--force"]) == 0, capsys.readouterr().err
    assert json.loads((run / "report.json").read_text())["records"]["total"] == 2, "--force did not replace it"


def test_cli_report_reads_a_report_root_through_latest(tmp_path, capsys):
    run = write_ledger_file(tmp_path / "root" / "20261201-000000-abcdef" / "ledger.jsonl", [crossing("r1")]).parent
    (tmp_path / "root" / "latest").symlink_to(run.name)
    assert main(["report", str(tmp_path / "root"), "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "report.json").read_text())["records"]["total"] == 1


def test_cli_report_bad_ledger_is_one_line_exit_4(tmp_path, capsys):
    path = write_ledger_file(tmp_path / "ledger.jsonl", [])
    code = main(["report", str(path)])
    err = capsys.readouterr().err
    assert (code, err) == (4, f"replaytests: error: {path}: empty ledger (no records)\n"), f"exit {code}, {err!r}"


MANIFEST = {"bank": "tiny.jsonl", "bank_sha256": "b" * 64, "rows": 48, "model": {"path": "m", "sha256": "m" * 64},
            "tokenizer": {"files": {"tokenizer.json": "f" * 64}, "sha256": "t" * 64},
            "contract": {"name": "cpu-tiny", "sha256": "k" * 64}}
RUN = {"options": {"precision": "bf16", "rows": None}, "contract": {"name": "cpu-tiny", "sha256": "c" * 64},
       "manifest": MANIFEST, "platform": {"software.torch": "2.13.0", "software.transformers": "5.23.0"},
       "environment": {"threads": 1}}


def run_dir(tmp_path, name: str, run: dict | str) -> Path:
    path = write_ledger_file(tmp_path / name / "ledger.jsonl", [crossing("r1")]).parent
    (path / "run.json").write_text(run if isinstance(run, str) else json.dumps(run), encoding="utf-8")
    return path


def test_cli_report_reads_run_json_into_meta(tmp_path, capsys):
    run = run_dir(tmp_path, "run", RUN)
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    meta = json.loads((run / "report.json").read_text(encoding="utf-8"))["meta"]
    digests = {"bank_sha256": "b" * 64, "model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64,
               "contract_sha256": "k" * 64}
    expected = {"ledgers": [str(run)], **RUN, "options": {"precision": "bf16"}, "manifest": digests}
    assert meta == expected, f"meta: {meta}"
    text = (run / "report.md").read_text(encoding="utf-8").splitlines()
    for line in ("- **contract**:", "  - **name**: cpu-tiny", f"  - **bank_sha256**: {'b' * 64}",
                 "  - **software.torch**: 2.13.0", "  - **threads**: 1"):
        assert line in text, f"report.md header lacks {line!r}"
    assert "<b>tokenizer_sha256</b>: " + "t" * 64 in (run / "report.html").read_text(encoding="utf-8")


def test_report_meta_keeps_differing_runs_apart(tmp_path):
    other = RUN | {"platform": {"software.torch": "2.14.0"}}
    first, second = run_dir(tmp_path, "a", RUN), run_dir(tmp_path, "b", other)
    meta = report_meta([first, second, tmp_path / "a" / "ledger.jsonl"])
    assert set(meta) == {"ledgers", "runs"}, meta
    torch_versions = [run["platform"]["software.torch"] for run in meta["runs"].values()]
    assert torch_versions == ["2.13.0", "2.14.0", "2.13.0"], meta["runs"]


@pytest.mark.parametrize("content", [pytest.param("{", id="truncated"), pytest.param("[]", id="not-an-object")])
def test_cli_report_bad_run_json_is_one_line_exit_4(tmp_path, capsys, content):
    run = run_dir(tmp_path, "run", content)
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    assert (code, err.startswith(f"replaytests: error: {run / 'run.json'}: "), err.count("\n")) == (4, True, 1), err


def test_run_meta_shortens_environment_and_options():
    run = {"options": {"model": "m", "rows": None, "accept_changed": [], "strict_contract": False},
           "environment": {"software": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None},  # as captured
                           "hardware": {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "gpu_name": None},
                           "environment": {"device": "cpu", "cpu_threads": 1}}}
    meta = run_meta(run)
    assert meta["options"] == {"model": "m"}, meta["options"]
    assert meta["environment"] == {"software": "python 3.11.7, torch 2.13.0+cpu",
                                   "device": "cpu: AMD EPYC (AVX2), 1 intra-op thread(s)"}, meta["environment"]


def test_transplant_and_replication_outcomes_are_tabled(repo):
    """A committed baseline's transplant and replication records give their paper-style tables (the one made on
    the Xeon: cpu-tiny/ holds the same families and ten times its bytes, in families these tables do not read)."""
    records = collate([repo / "fixtures" / "ledgers" / "cpu-tiny-xeon"])
    report = build_report(typed(records), {"panels": {"replication": {"min_exact_controls": 6}}})
    causal = report["causal"]
    recovery = causal["transplant"].full["prefill<-incremental"]["follows_donor"]
    assert (recovery.k, recovery.n) == (causal["transplant"].divergent,) * 2, recovery
    assert causal["replication"].min_exact_controls == 6, causal["replication"]
    text = markdown(report)
    for title in ("### Transplant (Table 5), bf16:", "### Replication on a later checkpoint (Table 6), bf16"):
        assert title in text, f"report.md lacks {title!r}"


# Issue 47: replicas of no comparison, two definitions of one cell, and a verdict the records contradict.

def no_replicas(record_: dict, kept: tuple[str, ...] = ()) -> dict:
    return record_ | {"comparisons": {pair: c for pair, c in record_["comparisons"].items()
                                      if not pair.endswith("_replica") or pair in kept}}


def test_replicas_of_no_comparison_are_reported_as_missing_not_exact():
    from replaytests.outputs.summary import text_table

    records = typed([no_replicas(crossing(f"r{i:02d}")) for i in range(48)])
    report = build_report(records, {})
    cell = at(report, "families", "crossing", "precisions", "bf16")
    assert cell["replicas_exact"] is None, f"replicas over no comparison: {cell['replicas_exact']}"
    assert report["headline"]["rows"][0][4] == "none recorded", report["headline"]["rows"][0]
    shown = [line for line in markdown(report).splitlines() if "replicas exact (cache" in line]
    assert shown and all("none recorded" in line for line in shown), shown
    row = re.split(r"\s{2,}", text_table(report).splitlines()[1])
    assert row[4] == "none recorded", f"summary.md's replicas column: {row}"


def test_a_record_lacking_one_replica_pair_is_not_counted_exact():
    records = [crossing(f"r{i}") for i in range(4)]
    records[0] = no_replicas(records[0], kept=("incremental~incremental_replica",))
    report = build_report(typed(records), {})
    exact = at(report, "families", "crossing", "precisions", "bf16", "replicas_exact")
    assert (exact.k, exact.n) == (3, 4), exact
    assert report["headline"]["rows"][0][4] == "3/4", report["headline"]["rows"][0]


def test_collate_refuses_two_definitions_of_one_cell(tmp_path, capsys):
    a = write_ledger_file(tmp_path / "a" / "ledger.jsonl", [crossing("r1")])
    b = write_ledger_file(tmp_path / "b" / "ledger.jsonl", [crossing("r2") | {"cell_digest": "e" * 16}])
    message = (f"cell bf16 has two definitions: digest dddddddddddd… in {a}, eeeeeeeeeeee… in {b} (crossing/r2/bf16); "
               "its records cannot be counted as one cell")
    with pytest.raises(LedgerError, match=f"^{re.escape(message)}$"):
        collate([a, b])
    assert main(["report", str(a.parent), str(b.parent), "--out", str(tmp_path / "out")]) == 4
    assert capsys.readouterr().err == f"replaytests: error: {message}\n"
    assert not (tmp_path / "out").exists(), "a report of two cells under one name was written"


PASSED = {"result": "pass", "tests": {"passed": 12}, "failures": []}
RUN_JSONS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "ledgers").glob("*/run.json"))


def test_every_committed_ledger_has_the_run_json_whose_verdict_is_read_back():
    ledgers = sorted(path.parent for path in RUN_JSONS[0].parent.parent.glob("*/ledger.jsonl")) if RUN_JSONS else []
    assert RUN_JSONS and [path.parent for path in RUN_JSONS] == ledgers, f"run.json beside {ledgers}: {RUN_JSONS}"


@pytest.mark.parametrize("run_json", RUN_JSONS, ids=[path.parent.name for path in RUN_JSONS])
def test_a_recorded_verdict_is_read_and_written_back_as_it_was(run_json):
    """Every committed run's verdict (a Verdict once read) written back holds the same keys, values and order: the
    report.json of an older run does not change when its verdict is read by this version."""
    recorded = json.loads(run_json.read_text(encoding="utf-8"))["verdict"]
    again = Verdict.from_json(recorded).to_json()
    assert json.dumps(again) == json.dumps(recorded), f"{run_json}: the verdict written back differs: {again}"


@pytest.mark.parametrize(("edit", "code", "said"), [
    pytest.param(lambda rs: rs[0]["comparisons"]["prefill~prefill_replica"].update(suffix_equal=False), 1,
                 "FAIL (run.json said PASS: 12 passed; the records show replicas failing in 1 row (crossing/r0/bf16))",
                 id="replica-inexact"),
    pytest.param(lambda rs: rs.__setitem__(slice(None), [no_replicas(r) for r in rs]), 1,
                 "FAIL (run.json said PASS: 12 passed; the records show replicas failing in 2 rows (crossing/r0/bf16, "
                 "crossing/r1/bf16))", id="replicas-removed"),
    pytest.param(lambda rs: rs.append(crossing("r2", "fp32", suffix_equal=False, first_divergence=3)), 1,
                 "FAIL (run.json said PASS: 12 passed; the records show exact-cell suffixes failing in 1 row "
                 "(crossing/r2/fp32))", id="fp32-diverges"),
    pytest.param(lambda rs: None, 0, "PASS (12 passed)", id="records-agree"),
])
def test_cli_report_verdict_agrees_with_the_records(tmp_path, capsys, edit, code, said):
    records = [crossing("r0"), crossing("r1")]
    edit(records)
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", records).parent
    (run / "run.json").write_text(json.dumps({"verdict": PASSED}), encoding="utf-8")
    assert main(["report", str(run)]) == code, capsys.readouterr()
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"verdict: {said}", f"last line printed: {out[-1]!r}"  # the verdict, whatever it is
    assert f"## {said}" in (run / "report.md").read_text(encoding="utf-8").splitlines(), "report.md's verdict"
    result = json.loads((run / "report.json").read_text(encoding="utf-8"))["verdict"]["result"]
    assert result == ("fail" if code else "pass"), f"report.json's verdict: {result}"


def test_a_pass_the_runs_contract_allows_stands(tmp_path, repo):
    """The recomputed checks judge by the run's own contract where its file still has the recorded digest."""
    from replaytests.inputs.contract import load_contract

    contract = tmp_path / "lenient.yaml"
    contract.write_text(f"extends: {repo / 'contracts' / 'cpu-tiny.yaml'}\nname: lenient\n"
                        "gates: {crossing: {replicas_exact: false}}\n", encoding="utf-8")
    records = [crossing("r0"), crossing("r1")]
    records[0]["comparisons"]["prefill~prefill_replica"]["suffix_equal"] = False
    meta = {"verdict": PASSED, "contract": {"path": str(contract), "sha256": load_contract(contract).digest}}
    assert build_report(typed(records), meta)["verdict"].to_json() == PASSED, "a pass its contract allowed: overturned"
    moved = meta | {"contract": {"path": str(contract), "sha256": "0" * 64}}
    assert build_report(typed(records), moved)["verdict"].result == "fail", "judged by a contract that changed"
