"""The conversation family in the report, compare, summary.md and the README table, on hand-built records (no model):
the rates per turn index with their Wilson intervals, the re-rendered mismatches and why, the accumulation test with
its must-fail controls (too few conversations, a divergence that recedes), and every output showing a divergence
that only an earlier turn holds (the last turn, which the record's own comparisons are, agreeing)."""

from __future__ import annotations

import copy
import importlib.util
from typing import NamedTuple

import pytest
from test_report import comparison, record, typed, write_ledger_file

from replaytests.families.registry import FAMILIES
from replaytests.inputs.options import REPO
from replaytests.outputs import compare as comparing
from replaytests.outputs import conversation_report, conversation_section, findings, report_html, sections, summary
from replaytests.outputs.report import build_report, checked_verdict
from replaytests.outputs.stats import wilson
from replaytests.outputs.verdict import Verdict

FAMILY = FAMILIES["conversation"]
PAIRS = [f"{a}~{b}" for a, b in FAMILY.pairs]
REPLAY, RERENDERED = "session~replay", "session~rerendered"
EQUAL = {"ids_equal": True, "length": 10, "shared": 10, "first_difference": None, "turn": None, "segment": None,
         "reason": None, "turns_not_round_tripping": []}


def rerendered(reason: str, turn: int = 1, segment: str = "assistant") -> dict:
    return EQUAL | {"ids_equal": False, "shared": 4, "first_difference": 4, "turn": turn, "segment": segment,
                    "reason": reason}


def turn(k: int, diverge: tuple[str, ...] = (), answers: tuple[str, ...] = (), flips: tuple[str, ...] = (),
         cache: tuple[str, ...] = (), ids: dict | None = None) -> dict:
    """Turn k: every pair of the family compared, `diverge` pairs' assistant turns differing (and `answers`' answers,
    `flips`' correctness labels, `cache`'s caches and logits)."""
    comps = {pair: comparison(suffix_equal=pair not in diverge, answer_equal=pair not in answers,
                              correct_equal=pair not in flips, cache_exact=pair not in cache,
                              first_divergence=3 if pair in diverge else None) for pair in PAIRS}
    arms = record("conversation", "x", "bf16", comps, {arm: k % 2 == 0 for arm in FAMILY.arms})["arms"]
    return {"turn": k, "history_len": 10 * k, "expected_answer": "a", "session_matches_bank": True, "arms": arms,
            "comparisons": comps, "rerendered": ids or EQUAL}


def conversation(row: str, turns: list[dict], precision: str = "bf16") -> dict:
    """A conversation record: its arms and comparisons are its last turn's, as families/conversation.py writes."""
    return record("conversation", row, precision, turns[-1]["comparisons"], turns=turns) | {
        "arms": turns[-1]["arms"]}


def diverging_at(rows: int, at: dict[int, int], pair: str = REPLAY, depth: int = 3, precision: str = "bf16",
                 offset: int = 0) -> list[dict]:
    """`rows` conversations of `depth` turns; at turn k (a key of `at`) the first at[k] of them diverge in `pair`."""
    return [conversation(f"c{offset + i:02d}", [turn(k, (pair,) if i < at.get(k, 0) else ()) for k in
                                                range(1, depth + 1)], precision) for i in range(rows)]


def built(records: list[dict], meta: dict | None = None) -> dict:
    return build_report(typed(records), meta or {})


# ---- rates per turn ----

class Rates(NamedTuple):
    id: str
    rows: int
    at: dict[int, int]  # turn -> conversations whose assistant turn diverges there


RATES = [Rates("none", 5, {}), Rates("grows", 5, {2: 2, 3: 4}), Rates("turn-two-only", 4, {2: 3}),
         Rates("every-turn", 3, {1: 3, 2: 3, 3: 3})]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in RATES])
def test_each_turn_counts_the_conversations_that_diverge_there_with_a_wilson_interval(case):
    cell = built(diverging_at(case.rows, case.at))["conversations"]["bf16"]
    for t in cell["turns"]:
        found = t["pairs"][REPLAY]["suffix_divergence"]
        expected = wilson(case.at.get(t["turn"], 0), case.rows)
        assert found == expected, f"turn {t['turn']}: {found}, expected {expected}"


def test_the_interval_is_the_reference_wilson_interval():
    # 2 of 5 conversations, Wilson 95% (R: binom::binom.confint(2, 5, methods = "wilson")): [0.1176, 0.7693]
    found = built(diverging_at(5, {3: 2}))["conversations"]["bf16"]["turns"][2]["pairs"][REPLAY]["suffix_divergence"]
    assert (found.ci_low, found.ci_high) == pytest.approx((0.1176, 0.7693), abs=5e-5), found


@pytest.mark.parametrize("measure, edit", [("answer_divergence", {"answers": (RERENDERED,)}),
                                           ("correctness_divergence", {"flips": (RERENDERED,)}),
                                           ("cache_differs", {"cache": (RERENDERED,)}),
                                           ("logits_differ", {"cache": (RERENDERED,)})])
def test_each_measure_counts_only_its_own_field(measure, edit):
    records = [conversation("c0", [turn(1), turn(2, **edit), turn(3)]), conversation("c1", [turn(1), turn(2), turn(3)])]
    turns = built(records)["conversations"]["bf16"]["turns"]
    assert [t["pairs"][RERENDERED][measure].k for t in turns] == [0, 1, 0], measure
    assert [t["pairs"][RERENDERED]["suffix_divergence"].k for t in turns] == [0, 0, 0], "no assistant turn differs"


def test_a_cache_not_measured_is_not_counted_as_exact_or_not():
    records = diverging_at(2, {})
    for t in records[0]["turns"]:
        t["comparisons"][REPLAY] |= {"cache_exact": None, **{f"{kv}_{m}": None for kv in "kv"
                                                             for m in ("rel_l2", "max_abs", "rel_l2_per_layer",
                                                                       "max_abs_per_layer")}}
    pair = built(records)["conversations"]["bf16"]["turns"][1]["pairs"][REPLAY]
    assert "cache_differs" not in pair and "logits_differ" in pair, sorted(pair)


def test_a_conversation_with_fewer_turns_counts_only_at_the_turns_it_reached():
    records = [*diverging_at(2, {2: 2}), conversation("short", [turn(1), turn(2, (REPLAY,))])]
    turns = built(records)["conversations"]["bf16"]["turns"]
    assert [(t["rows"], t["pairs"][REPLAY]["suffix_divergence"].k) for t in turns] == [(3, 0), (3, 3), (2, 0)]


def test_re_rendered_mismatches_are_counted_with_why_and_where():
    records = [conversation("c0", [turn(1), turn(2, ids=rerendered("lossy decode: U+FFFD")),
                                   turn(3, ids=rerendered("lossy decode: U+FFFD"))]),
               conversation("c1", [turn(1), turn(2, ids=rerendered("template: dropped <|/answer|>", 2, "user")),
                                   turn(3)])]
    turns = built(records)["conversations"]["bf16"]["turns"]
    assert [t["rerendered"]["differ"].k for t in turns] == [0, 2, 1]
    assert turns[1]["rerendered"]["reasons"] == {"lossy decode": 1, "template": 1}, turns[1]["rerendered"]
    assert turns[1]["rerendered"]["segments"] == {"turn 1 assistant": 1, "turn 2 user": 1}, turns[1]["rerendered"]


def test_every_replica_is_checked_at_every_turn_not_only_the_last():
    records = diverging_at(3, {})
    records[1]["turns"][0]["comparisons"]["session~session_replica"]["suffix_equal"] = False  # turn 1 only
    report = built(records, {"verdict": {"result": "pass", "tests": {"passed": 1}, "failures": []}})
    cell = report["conversations"]["bf16"]
    assert cell["replicas"]["session~session_replica"].k == 2, cell["replicas"]
    assert report["families"]["conversation"]["precisions"]["bf16"]["replicas_exact"].k == 2
    assert report["verdict"].result == "fail", "a replica that differs at turn 1 contradicts a pass"
    assert "conversation replicas (every turn)" in report["verdict"].contradicted, report["verdict"]


def test_a_turn_one_control_that_differs_contradicts_a_pass():
    from replaytests.inputs.contract import default_gates

    records = diverging_at(2, {1: 1})  # session~replay differs at turn 1: the control, one call each
    found = checked_verdict(Verdict("pass", {"passed": 1}), typed(records), default_gates())
    assert found.result == "fail" and "the conversation control (turn 1)" in found.contradicted, found


# ---- does divergence accumulate? ----

class Accumulation(NamedTuple):
    id: str
    rows: int
    at: dict[int, int]
    b: int  # conversations diverging at the last turn only
    c: int  # at the first only
    p: float  # two-sided exact McNemar: min(1, 2 P[X <= min(b, c)]), X ~ Bin(b + c, 1/2)
    reading: str
    too_few: bool


ACCUMULATIONS = [
    Accumulation("accumulates", 6, {3: 6}, 6, 0, 2 / 64, "accumulates: more at the last turn", False),
    Accumulation("recedes", 8, {1: 7}, 0, 7, 2 / 128, "recedes: more at the first turn", False),
    Accumulation("within-chance", 10, {1: 1, 3: 3}, 2, 0, 0.5, "no difference shown", False),
    # the must-fail control: 5 conversations cannot reach p < 0.05 even when every one diverges only at the end
    Accumulation("too-few", 5, {3: 5}, 5, 0, 2 / 32, "no difference shown", True),
    Accumulation("nothing-diverges", 12, {}, 0, 0, 1.0, "no discordant conversation", False),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ACCUMULATIONS])
def test_the_accumulation_test_pairs_each_conversation_s_first_and_last_turn(case):
    records = diverging_at(case.rows, case.at)
    if case.id == "within-chance":  # one conversation diverges at both turns: concordant, not counted
        records = diverging_at(case.rows, {3: 3})
        records[0]["turns"][0] = turn(1, (REPLAY,))
    found = built(records)["conversations"]["bf16"]["accumulation"][REPLAY]
    m = found["mcnemar"]
    assert (m.b, m.c) == (case.b, case.c), f"last only {m.b}, first only {m.c}"
    assert m.p == pytest.approx(case.p, rel=1e-9), m
    assert found["reading"] == case.reading, found["reading"]
    assert (found["note"] is not None) == case.too_few, found["note"]
    if case.too_few:
        assert "at least 6 are needed" in found["note"], found["note"]


def test_one_turn_conversations_are_not_tested():
    found = built(diverging_at(4, {1: 4}, depth=1))["conversations"]["bf16"]["accumulation"][REPLAY]
    assert found["rows"] == 0 and found["note"].startswith("no conversation with two turns"), found


# ---- what a reader sees ----

def test_report_md_shows_a_divergence_only_an_earlier_turn_holds():
    report = built(diverging_at(4, {2: 1}))
    text = sections.markdown(report)
    row = next(line for line in text.splitlines() if line.startswith(f"| {REPLAY}: assistant turns differ |"))
    assert [cell.strip().split(" ")[0] for cell in row.split("|")[2:-1]] == ["0/4", "1/4", "0/4"], row
    assert "| bf16 | session~replay | 4 |" in text, "the accumulation table has a line per cell and pair"


def test_the_headline_row_counts_a_divergence_at_any_turn():
    rows = summary.table_rows(typed(diverging_at(4, {2: 1})))
    columns = dict(zip(summary.COLUMNS, rows[0], strict=True))
    assert columns["suffix div."] == "1/4", f"turn 2 diverges, the last turn does not: {columns}"
    assert "conversation: session~replay and session~rerendered, at every turn" in summary.HEADLINE_NOTE


def test_summary_and_terminal_show_the_turns():
    records = typed(diverging_at(4, {2: 1, 3: 2}))
    md = summary.markdown(build_report(records, {}), {})
    assert "| bf16 | session~replay | 0/4, 1/4, 2/4 |" in md, md
    assert "Conversations, turn by turn" in summary.text_table(build_report(records, {}))


def test_no_conversation_section_without_conversation_records():
    report = built([record("crossing", "r1", "bf16", {"incremental~prefill": comparison()})])
    assert "conversations" not in report and not conversation_section.figures(report)
    assert conversation_section.summary_table(report) is None


def test_report_html_draws_divergence_by_turn_one_line_per_cell():
    records = [*diverging_at(3, {2: 1}), *diverging_at(3, {3: 2}, precision="fp32")]
    figures = conversation_section.figures(built(records))
    assert len(figures) == len(conversation_report.HEADLINE), "one plot per headline pair"
    assert "turn 2 bf16: 1/3" in figures[0] and "turn 3 fp32: 2/3" in figures[0], figures[0][:400]


def test_a_hostile_reason_and_runtime_are_text_in_report_html():
    hostile = "<img src=x onerror=alert(1)>"
    records = [conversation("c0", [turn(1), turn(2, ids=rerendered(f"{hostile}: why"))])]
    page = report_html.page(built(records, {"options": {"backend": hostile}}))
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


# ---- compare ----

def judged(baseline: list[dict], new: list[dict], gate: str):
    return comparing.compare(typed(baseline), typed(new), gate=gate)


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_the_same_conversation_run_passes_at_every_gate(gate):
    records = diverging_at(8, {2: 2, 3: 3})
    found = judged(records, copy.deepcopy(records), gate)
    assert found.passed and found.found == {"bits": 0, "trajectories": 0, "rates": 0}, found.text()


def test_a_turn_whose_divergence_rate_moved_fails_at_gate_rates():
    found = judged(diverging_at(10, {}), diverging_at(10, {2: 8}), "rates")
    reasons = [r for r in found.reasons if r.startswith(findings.RATES_REASONS)]
    assert reasons and all("turn 2 session~replay" in r for r in reasons), found.reasons
    assert "baseline 0/10, new 8/10" in reasons[0] and "p = 0.00781" in reasons[0], reasons[0]


def test_a_turn_whose_divergence_moved_within_chance_passes_at_gate_rates():
    found = judged(diverging_at(10, {}), diverging_at(10, {2: 2}), "rates")
    assert found.passed, found.reasons


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_a_replica_that_differs_at_an_earlier_turn_fails_at_every_gate(gate):
    baseline = diverging_at(3, {})
    new = copy.deepcopy(baseline)
    new[0]["turns"][1]["comparisons"]["replay~replay_replica"]["cache_exact"] = False
    found = judged(baseline, new, gate)
    assert any(r.startswith("conversation gate: conversation row c00 (bf16)") and "turn 2" in r
               for r in found.reasons), found.reasons


def test_an_exact_cell_s_conversation_that_diverges_at_a_turn_fails():
    baseline = diverging_at(3, {}, precision="fp32")
    found = judged(baseline, diverging_at(3, {2: 1}, precision="fp32"), "rates")
    assert any("conversation gate:" in r and "session~replay assistant turns diverge (turn 2" in r
               for r in found.reasons), found.reasons


def test_the_run_s_rates_check_reads_the_conversation_turns():
    """suite/baseline.baseline_rates keeps the rates reasons: a conversation's is one."""
    from types import SimpleNamespace

    from replaytests.inputs.contract import default_gates
    from replaytests.suite.baseline import baseline_rates

    replay = SimpleNamespace(options=SimpleNamespace(gate="rates"), baseline=typed(diverging_at(10, {})),
                             contract=SimpleNamespace(gates=default_gates()),
                             plan=SimpleNamespace(audited=lambda records: records), baseline_platform=[])
    found, _ = baseline_rates(replay, typed(diverging_at(10, {3: 9})))
    assert found and all("conversation/bf16 turn 3 session~replay" in f.message for f in found), found


# ---- the README table ----

SPEC = importlib.util.spec_from_file_location("readme_tables", REPO / "tools" / "readme_tables.py")
TABLES = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(TABLES)


def _table_rows(text: str, turn_label: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.split("|")[4:5] == [f" {turn_label} "]]


@pytest.mark.parametrize("diverging, shown", [(0, "0/3"), (2, "2/3")], ids=["none", "two"])
def test_the_readme_table_shows_the_divergence_the_ledger_holds(tmp_path, diverging, shown):
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", diverging_at(3, {2: diverging})).parent
    text = TABLES.conversations_table({"tiny": (run,)})
    (row,) = _table_rows(text, "2")
    column = TABLES.CONVERSATION_HEADER.index(f"{REPLAY}: assistant turns differ")
    assert row[column].startswith(shown), row
    (paired,) = _table_rows(text, "first vs last, paired")
    assert paired[column] == "last only 0, first only 0, p = 1 (too few)", f"turn 2 is not the last: {paired}"


def test_the_readme_table_counts_re_rendered_mismatches_with_why(tmp_path):
    records = [conversation("c0", [turn(1), turn(2, ids=rerendered("lossy decode: U+FFFD"))])]
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl", records).parent
    (row,) = _table_rows(TABLES.conversations_table({"tiny": (run,)}), "2")
    assert row[-1].startswith("1/1") and row[-1].endswith("(lossy decode 1)"), row


def test_the_readme_table_has_no_line_for_a_run_without_conversations(tmp_path):
    run = write_ledger_file(tmp_path / "run" / "ledger.jsonl",
                            [record("crossing", "r1", "bf16", {"incremental~prefill": comparison()})]).parent
    assert len(TABLES.conversations_table({"tiny": (run,)}).splitlines()) == 2, "the header alone"
