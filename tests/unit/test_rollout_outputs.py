"""The outputs read the rollout families (outputs/rollout_families.py): the run report's rollout section
(report.json, report.md, report.html, summary.md) and `replaytests compare` at its three levels. Records are
hand-built (no model): each arm's per-token log-probabilities chosen here, every expected number computed in the
test from those records with outputs/mismatch.py's definitions.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import NamedTuple

import numpy as np
import pytest
from test_report import LAYERS, comparison, typed, write_ledger_file

from replaytests.cli import main
from replaytests.inputs.contract import default_gates
from replaytests.outputs import compare as comparing
from replaytests.outputs import findings, ledger, report_html, rollout_families, sections, summary
from replaytests.outputs.mismatch import Scored, Thresholds, row_measures, run_measures
from replaytests.outputs.records import Record
from replaytests.outputs.report import build_report
from replaytests.outputs.stats import sign_flip, smallest_p

LENGTH = 12
PAIRS = (("live", "live_replica"), ("incremental", "incremental_replica"), ("prefill", "prefill_replica"),
         ("live", "incremental"), ("live", "prefill"))
HOSTILE = "r|<img src=x onerror=alert(1)>"


def logprobs(row: int, scale: float) -> tuple[list[float], list[float]]:
    """A row's live log-probabilities (float32 values, as the engine records them) and the recompute's: the live
    ones moved by `scale` times a per-token offset (0 at every fourth token: some tokens bitwise equal)."""
    rng = np.random.default_rng(row)
    live = (-rng.uniform(0.1, 4.0, LENGTH)).astype(np.float32)
    offset = rng.normal(0, 1, LENGTH) * (np.arange(LENGTH) % 4 != 0)
    return [float(v) for v in live], [float(v) for v in (live + scale * offset).astype(np.float32)]


def measured(a: dict, b: dict, thresholds: Thresholds) -> dict:
    """A pair's rollout measures as families/rollout.py records them (mismatch.row_measures)."""
    m = row_measures(Scored("", np.asarray(a["suffix"]), np.asarray(a["logprobs"], dtype=np.float64),
                            np.asarray(b["logprobs"], dtype=np.float32)), thresholds)
    return {"logprobs_exact": m.bitwise_equal == m.tokens, "logprob_tokens": m.tokens,
            "logprob_tokens_equal": m.bitwise_equal, "abs_dlogp_max": m.abs_delta_max,
            "abs_dlogp_median": m.abs_delta_median, "abs_dlogp_p99": m.abs_delta_p99, "k3": m.k3,
            "outside_bounds": m.outside_bounds, "first_exceeding": m.first_exceeding}


def arm(tokens: list[int], values: list[float]) -> dict:
    return {"suffix": tokens, "answer": "", "correct": None, "cache_digest": "c" * 64, "logits_digest": "l" * 64,
            "layer_digests": {"k": ["k" * 16] * LAYERS, "v": ["v" * 16] * LAYERS},
            "z_sha256": "z" * 64, "margins": [0.5] * len(tokens), "logprobs": values,
            "top2": [[t, t + 1] for t in tokens], "logprobs_mode": "fp32-log-softmax-full-vocab"}


def rollout(row: str, index: int, scale: float = 1e-3, family: str = "rollout", precision: str = "bf16",
            tokens: list[int] | None = None, control: float = 0.0) -> dict:
    """A rollout record: live and teacher forcing (incremental) equal unless `control` moves the latter, the
    recompute (prefill) moved by `scale`; each replica equal to its arm."""
    live, prefill = logprobs(index, scale)
    incremental = logprobs(index + 1000, control)[1] if control else live
    tokens = tokens or [10 + index] * LENGTH
    arms = {name: arm(tokens, values) for name, values in (("live", live), ("incremental", incremental),
                                                             ("prefill", prefill))}
    arms |= {f"{name}_replica": dict(a) for name, a in arms.items()}
    thresholds = Thresholds()
    comps = {f"{a}~{b}": comparison(cache_exact=arms[a]["logprobs"] == arms[b]["logprobs"])
             | measured(arms[a], arms[b], thresholds) for a, b in PAIRS}
    settings = {"mode": "greedy", "length": LENGTH, "seed": None, "temperature": 0.0, "top_p": 1.0,
                "ratio_low": thresholds.ratio_low, "ratio_high": thresholds.ratio_high,
                "delta_threshold": thresholds.delta}
    return {"schema": ledger.SCHEMA, "family": family, "row": row, "precision": precision, "prefix_len": 10,
            "cell_digest": "d" * 64, "expected_answer": "a", "status": "ok", "arms": arms, "comparisons": comps,
            "rollout": settings}


def run(rows: int = 4, **kwargs) -> list[dict]:
    return [rollout(f"row-{i}", i, **kwargs) for i in range(rows)]


def expected(records: list[dict], pair: str) -> dict:
    """The run-level measures of `pair` computed here from the records' log-probabilities."""
    a, b = pair.split("~")
    return run_measures([Scored(r["row"], np.asarray(r["arms"][a]["suffix"]),
                                np.asarray(r["arms"][a]["logprobs"], dtype=np.float64),
                                np.asarray(r["arms"][b]["logprobs"], dtype=np.float32)) for r in records],
                        Thresholds()).to_json()


# ---- the report ----

class Case(NamedTuple):
    id: str
    family: str
    pair: str


CASES = [Case(f"{family}-{pair}", family, pair) for family in ("rollout", "rollout_sampled")
         for pair in (f"{a}~{b}" for a, b in PAIRS)]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_the_report_holds_the_measures_of_the_records(case):
    records = run(6, family=case.family, scale=0.02)
    found = build_report(typed(records), {})["rollouts"][case.family]["bf16"]["pairs"][case.pair]
    want = expected(records, case.pair)
    for name in ("tokens", "tokens_bitwise_equal", "abs_delta_max", "abs_delta_median", "abs_delta_p99"):
        assert found[name] == pytest.approx(want[name], rel=1e-12, abs=0), f"{case.pair} {name}: report vs records"
    for name in ("bitwise_equal", "abs_delta_mean", "k3", "outside_bounds"):
        for part in ("estimate", "ci_low", "ci_high", "n"):
            assert found[name][part] == pytest.approx(want[name][part], rel=1e-12, abs=0), f"{case.pair} {name} {part}"
    assert found["rows_exceeding"] == want["rows_exceeding"], f"{case.pair}: rows past the threshold"


@pytest.mark.parametrize("pair", [pytest.param(f"{a}~{b}", id=f"{a}~{b}") for a, b in PAIRS])
def test_each_record_s_own_measures_agree_with_the_report_s_rows(pair):
    """The report re-reads the log-probabilities; its per-row measures are the ones each record holds."""
    records = run(5, scale=0.02)
    a, b = pair.split("~")
    for r in records:
        m = row_measures(Scored(r["row"], np.asarray(r["arms"][a]["suffix"]),
                                np.asarray(r["arms"][a]["logprobs"], dtype=np.float64),
                                np.asarray(r["arms"][b]["logprobs"], dtype=np.float32)), Thresholds())
        held = r["comparisons"][pair]
        assert (held["k3"], held["logprob_tokens_equal"]) == (m.k3, m.bitwise_equal), f"{r['row']} {pair}"


def markdown_row(text: str, label: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    assert lines, f"no table line {label!r} in:\n{text}"
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", lines[0])[2:-1]]


def test_report_md_shows_the_measures_of_each_pair():
    records = run(4, scale=0.02)
    report = build_report(typed(records), {"options": {"backend": "hf"}})
    text = sections.markdown(report)
    assert "### Rollout fidelity (rollout), bf16, runtime hf" in text, "the cell and runtime title the table"
    k3 = markdown_row(text, "k3 KL(live ‖ replay) per token (95% CI)")
    header = markdown_row(text, "")
    for pair in (f"{a}~{b}" for a, b in PAIRS):
        want = expected(records, pair)["k3"]
        column = next(i for i, name in enumerate(header) if name.startswith(pair))
        assert k3[column] == f"{want['estimate']:.4g} [{want['ci_low']:.4g}, {want['ci_high']:.4g}]", pair


def test_the_headline_pair_s_worst_tokens_carry_each_arm_s_top2():
    records = run(3, scale=0.02)
    report = build_report(typed(records), {})
    worst = report["rollouts"]["rollout"]["bf16"]["pairs"]["live~prefill"]["worst"]
    by_row = {r["row"]: r for r in records}
    for w in worst:
        record = by_row[w["row"]]
        assert w["token"] == record["arms"]["live"]["suffix"][w["position"]], f"{w}: the token of the live arm"
        assert w["top2"] == {arm: record["arms"][arm]["top2"][w["position"]] for arm in ("live", "prefill")}, w
    text = sections.markdown(report)
    first = worst[0]
    assert (f"| {first['row']} | {first['position']} | {first['token']} | {first['live']:.9g} | "
            f"{first['replay']:.9g} |") in text, "the worst token's line in report.md"


def test_a_delta_of_zero_is_counted_not_dropped_from_the_log_axis():
    records = run(4, scale=0.02)
    found = build_report(typed(records), {})["rollouts"]["rollout"]["bf16"]["pairs"]
    control, recompute = found["live~incremental"]["distribution"], found["live~prefill"]["distribution"]
    assert (control["zero"], control["tokens"], control["counts"]) == (4 * LENGTH, 4 * LENGTH, []), control
    equal = sum(np.sum(np.asarray(r["arms"]["live"]["logprobs"]) == np.asarray(r["arms"]["prefill"]["logprobs"]))
                for r in records)
    assert recompute["zero"] == equal and recompute["zero"] + sum(recompute["counts"]) == recompute["tokens"], \
        f"every token in a bin or in the zero column: {recompute}"
    page = report_html.page(build_report(typed(records), {}))
    assert "Bitwise equal at every token: live~incremental" in page, "the exact pairs are named, not drawn"
    assert f"{equal} of {4 * LENGTH} tokens with delta = 0" in page, "the zero column's count in the plot"


def test_a_cell_whose_every_pair_is_bitwise_equal_says_so_instead_of_an_empty_plot():
    page = report_html.page(build_report(typed(run(2, scale=0.0)), {}))
    assert "every pair bitwise equal at every token" in page, "a line of text where no delta is drawn"


@pytest.mark.parametrize("output", ["report.md", "report.html", "summary.md"])
def test_a_hostile_row_id_is_text_in_every_output(output):
    records = [rollout(HOSTILE, 0, scale=0.5), *run(2, scale=1e-6)]
    report = build_report(typed(records), {})
    text = {"report.md": lambda: sections.markdown(report), "report.html": lambda: report_html.page(report),
            "summary.md": lambda: summary.markdown(build_report(typed(records), {}), {})}[output]()
    assert "<img" not in text, f"{output}: the row id became markup"
    if output == "report.md":
        line = next(line for line in text.splitlines() if line.startswith("| r\\|&lt;img"))
        assert line.count(" | ") == 7, f"the worst tokens' 8 columns, the row id's '|' escaped: {line}"
    if output == "report.html":
        assert "r|&lt;img src=x onerror=alert(1)&gt;" in text, "escaped, in the worst tokens"


def test_summary_md_shows_the_headline_and_the_control():
    records = run(4, scale=0.02)
    text = summary.markdown(build_report(typed(records), {}), {})
    for pair in ("live~prefill", "live~incremental"):
        want = expected(records, pair)
        line = next((line for line in text.splitlines() if line.startswith(f"| rollout | bf16 | {pair} |")), None)
        assert line is not None, f"no summary line for {pair}:\n{text}"
        assert f"| {want['tokens_bitwise_equal']}/{want['tokens']} |" in line, f"{pair} bitwise count: {line}"
    assert "live~live_replica" not in text.split("## Rollouts")[1], "summary.md shows the headline and control only"


def test_the_rollout_families_are_not_read_as_unknown_or_headline_families():
    """They are in the registry but not in shapes.SHAPES: no crash, no 'other families' section, their replica
    pairs in layer 1's table."""
    report = build_report(typed(run(2)), {})
    text = sections.markdown(report)
    assert "Other families" not in text, "a registered family rendered as unknown"
    assert "| rollout | bf16 | live~live_replica | 2/2" in text, "the rollout replicas in the replica table"


def test_a_rollout_control_that_is_not_bit_exact_contradicts_a_passing_verdict():
    records = [rollout("row-0", 0, control=1e-3), *run(2)[1:]]
    verdict = build_report(typed(records), {"verdict": {"result": "pass", "tests": {}, "failures": []}})["verdict"]
    assert verdict.result == "fail" and "the rollout control" in verdict.contradicted, verdict


# ---- compare ----

def judged(baseline: list[dict], new: list[dict], gate: str):
    return comparing.compare(typed(baseline), typed(new), gate=gate)


class Change(NamedTuple):
    id: str
    edit: object  # records -> records (the new run)
    fails_at: tuple[str, ...]  # the gates it fails


def moved_logprob(records: list[dict]) -> list[dict]:
    out = copy.deepcopy(records)
    for name in ("prefill", "prefill_replica"):
        out[0]["arms"][name]["logprobs"][3] = float(np.float32(out[0]["arms"][name]["logprobs"][3] - 1e-3))
    a, b = out[0]["arms"]["live"], out[0]["arms"]["prefill"]
    out[0]["comparisons"]["live~prefill"] |= measured(a, b, Thresholds())
    return out


def moved_tokens(records: list[dict]) -> list[dict]:
    out = copy.deepcopy(records)
    for a in out[0]["arms"].values():
        a["suffix"][5] += 1
    return out


CHANGES = [Change("nothing", lambda rs: copy.deepcopy(rs), ()),
           Change("a-logprob", moved_logprob, ("bits",)),
           Change("a-response-token", moved_tokens, ("bits", "trajectories"))]


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
@pytest.mark.parametrize("change", [pytest.param(c, id=c.id) for c in CHANGES])
def test_compare_judges_a_rollout_change_at_its_level(change, gate):
    baseline = run(4, scale=0.02)
    found = judged(baseline, change.edit(baseline), gate)
    assert found.passed == (gate not in change.fails_at), f"{change.id} at --gate {gate}: {found.reasons}"


def shifted_baseline(rows: int) -> list[dict]:
    """A baseline whose live~prefill mismatch is larger in every row (k3 per row shifted on purpose)."""
    return run(rows, scale=0.05)


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_the_same_rollout_run_passes_at_every_gate(gate):
    records = run(8, scale=0.02)
    found = judged(records, copy.deepcopy(records), gate)
    assert found.passed and found.found == {"bits": 0, "trajectories": 0, "rates": 0}, found.text()


def test_a_shifted_rollout_mismatch_fails_at_gate_rates():
    new = run(8, scale=0.02)
    found = judged(shifted_baseline(8), new, "rates")
    reasons = [r for r in found.reasons if r.startswith(findings.ROLLOUT_RATES_REASON)]
    assert reasons and "live~prefill k3 per token" in found.text(), found.text()
    base_k3 = [r["comparisons"]["live~prefill"]["k3"] for r in shifted_baseline(8)]
    new_k3 = [r["comparisons"]["live~prefill"]["k3"] for r in new]
    assert f"p = {sign_flip(new_k3, base_k3).p:.3g}" in reasons[0], reasons[0]


def test_too_few_rows_for_the_rates_test_are_noted_not_passed_silently():
    found = judged(shifted_baseline(4), run(4, scale=0.02), "rates")
    assert found.passed, "4 rows cannot reach p < 0.05: no finding"
    assert any("4 paired rows cannot show a change" in note and "at least 6 rows" in note for note in found.notes), \
        found.notes


@pytest.mark.parametrize(("gate", "elsewhere", "fails"), [
    pytest.param("rates", False, True, id="gate-rates-judges-it"),
    pytest.param("rates", True, True, id="gate-rates-judges-it-against-another-platform"),
    pytest.param(None, True, False, id="another-platform-records-it-as-drift"),
])
def test_the_run_s_rates_check_judges_a_moved_rollout_mismatch_or_records_it_as_platform_drift(gate, elsewhere, fails):
    """suite/baseline.baseline_rates: the mismatch is made of log-probabilities' bits, which may differ across
    platforms; against another platform's baseline it is drift (with its numbers), unless --gate rates asks."""
    from types import SimpleNamespace

    from replaytests.suite.baseline import baseline_rates

    platform = ["environment.cpu_isa AVX2 (baseline) vs DEFAULT (here)"] if elsewhere else []
    replay = SimpleNamespace(options=SimpleNamespace(gate=gate), baseline=typed(shifted_baseline(8)),
                             contract=SimpleNamespace(gates=default_gates()),
                             plan=SimpleNamespace(audited=lambda records: records), baseline_platform=platform)
    failures, drift = baseline_rates(replay, typed(run(8, scale=0.02)))
    found, other = ([f.message for f in failures], drift) if fails else (drift, failures)
    assert found and not other, (failures, drift)  # the k3 per token and the mean |delta logp| both moved
    assert all(m.startswith(f"{findings.ROLLOUT_RATES_REASON}: rollout/bf16 live~prefill") for m in found), found
    assert fails or all(m.endswith("(against a baseline made on another platform: recorded, not judged; --gate "
                                   "rates judges it)") for m in found), found


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_a_rollout_control_that_is_not_bit_exact_fails_at_every_gate(gate):
    baseline = run(3)
    new = [rollout("row-0", 0, control=1e-3), *copy.deepcopy(baseline[1:])]
    found = judged(baseline, new, gate)
    assert any(r.startswith("rollout control bit exact: rollout/row-0/bf16 live~incremental") for r in found.reasons), \
        found.reasons


@pytest.mark.parametrize("family", ["rollout", "rollout_sampled"])
def test_a_replica_failure_names_the_gate_section_its_family_is_judged_by(family):
    """Both rollout families are judged by `gates.rollout` (their registry records' gate_section): a replica pair
    that differs names that gate, the one a contract can set, never one named after the family."""
    record = rollout("row-0", 0, family=family)
    record["comparisons"]["live~live_replica"]["suffix_equal"] = False
    judgement = default_gates().replicas(Record.of(record), "live~live_replica")
    assert judgement.failed and "(gate rollout.replicas_exact: required)" in judgement.message, judgement


@pytest.mark.parametrize(("gate", "status"), [("rates", 1), ("trajectories", 1)])
def test_the_command_exits_1_on_a_moved_rollout_mismatch(tmp_path, capsys, gate, status):
    base = write_ledger_file(tmp_path / "base.jsonl", shifted_baseline(8))
    new = write_ledger_file(tmp_path / "new.jsonl", run(8, scale=0.02))
    assert main(["compare", str(base), str(new), "--gate", gate]) == status
    out = capsys.readouterr().out
    if gate == "rates":
        assert "reason: rollout mismatch changed beyond chance: rollout/bf16 live~prefill" in out, out
    else:  # the log-probabilities changed, the tokens did not: allowed at trajectories, so only the rates fail
        assert "trajectories held" in out and "bits changed" in out, out


# ---- the paired test ----

class Flip(NamedTuple):
    id: str
    x: list[float]
    y: list[float]


FLIPS = [Flip("all-up-6", [2, 3, 4, 5, 6, 7], [1] * 6), Flip("mixed-7", [1.0, -2.0, 3.5, 0.5, 2.0, -0.5, 1.0], [0] * 7),
         Flip("zero", [1.0] * 5, [1.0] * 5), Flip("one-row", [3.0], [1.0])]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FLIPS])
def test_sign_flip_enumerates_every_assignment(case):
    # Reference: every sign assignment enumerated here, by itertools, p = share with |mean| >= the observed.
    d = np.subtract(case.x, case.y)
    means = [abs(np.dot(signs, d)) / len(d) for signs in itertools.product((1, -1), repeat=len(d))]
    want = np.mean([m >= abs(d.mean()) - 1e-12 for m in means])
    got = sign_flip(case.x, case.y)
    assert got.exact and got.p == pytest.approx(want, abs=1e-12), f"{case.id}: p {got.p} vs enumerated {want}"


def test_sign_flip_draws_where_enumerating_is_too_much_and_never_gives_zero():
    got = sign_flip([1.0] * 20, [0.0] * 20, resamples=2000)
    assert not got.exact and got.p == pytest.approx(1 / 2001, abs=1e-15), got
    assert smallest_p(20, 2000) == pytest.approx(1 / 2001, abs=1e-15) and smallest_p(6) == pytest.approx(2 / 64)


def test_sign_flip_refuses_unpaired_rows():
    with pytest.raises(ValueError, match="must pair the same rows, got lengths 2 and 3"):
        sign_flip([1.0, 2.0], [1.0, 2.0, 3.0])


def test_the_report_keeps_the_rollout_replicas_count_for_the_history():
    records = run(3)
    records[1]["comparisons"]["live~live_replica"]["suffix_equal"] = False
    found = build_report(typed(records), {})["families"]["rollout"]["precisions"]["bf16"]["replicas_exact"]
    assert (found.k, found.n) == (2, 3), f"rows whose every replica pair is exact: {found}"


# ---- cells against cells ----

def test_each_cell_pair_is_compared_on_the_rows_both_cells_ran():
    """kv-hqq4's recompute moved 50 times more than bf16's on the same rows: the paired test finds it, each cell's
    mean is the mean of its rows' own k3; a row only one cell ran is not paired; a pair with no common row is
    left out."""
    records = run(6, scale=1e-3) + run(6, scale=5e-2, precision="kv-hqq4") + [rollout("row-x", 99, precision="bf16")]
    paired = rollout_families.cell_pairs([Record.of(r) for r in records], [("kv-hqq4", "bf16"), ("fp16", "fp32")])
    assert set(paired) == {"rollout"} and set(paired["rollout"]) == {"kv-hqq4 -> bf16"}, paired
    found = paired["rollout"]["kv-hqq4 -> bf16"]
    assert found["rows"] == 6
    k3 = {cell: np.mean([r["comparisons"]["live~prefill"]["k3"] for r in records
                         if r["precision"] == cell and r["row"] != "row-x"]) for cell in ("kv-hqq4", "bf16")}
    assert found["k3"]["means"] == pytest.approx([k3["kv-hqq4"], k3["bf16"]], rel=1e-12)
    assert found["k3"]["test"].p <= 2 / 2**6 + 1e-12, found["k3"]["test"]  # every row moved the same way
    same = rollout_families.cell_pairs([Record.of(r) for r in run(6) + run(6, precision="fp32")], [("fp32", "bf16")])
    assert same["rollout"]["fp32 -> bf16"]["k3"]["test"].p == 1.0, same  # equal rows: no difference at all
