"""replaytests.outputs.compare: one test per reason the gate fails, the PASS case, notes, and bad input to
`replaytests compare`. Records are hand-built (no model): a family's headline comparison with chosen
booleans, its replica pairs exact unless told otherwise.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from test_report import comparison, record, typed, write_ledger_file

from replaytests.cli import main
from replaytests.inputs.contract import default_gates
from replaytests.outputs import compare as comparing
from replaytests.outputs.compare import causes, gates_of
from replaytests.outputs.findings import Findings


def compare(baseline: list[dict], new: list[dict], *args, **kwargs) -> Findings:
    """The gate on hand-built records (ledger lines), read as the ledger's reader reads them."""
    return comparing.compare(typed(baseline), typed(new), *args, **kwargs)

CONTRACT = Path(__file__).resolve().parents[2] / "contracts" / "cpu-tiny.yaml"
# family: (headline pair, replica pairs)
PAIRS = {"crossing": ("incremental~prefill", ("incremental~incremental_replica", "prefill~prefill_replica")),
         "live": ("live~prefill", ("live~live_replica", "prefill~prefill_replica")),
         "bridge": ("live~incremental", ())}


def make(family: str, row: str, precision: str = "bf16", replica: dict | None = None, **headline) -> dict:
    """A record of `family`; `replica` overrides fields of its first replica pair, `headline` its headline pair."""
    pair, replicas = PAIRS[family]
    comps = {name: comparison() | (replica or {} if i == 0 else {}) for i, name in enumerate(replicas)}
    return record(family, row, precision, comps | {pair: comparison(**headline)})


def run(rows: int = 4) -> list[dict]:
    """A passing run: crossing at both precisions, live and bridge at BF16."""
    return ([make("crossing", f"r{i}", p) for i in range(rows) for p in ("bf16", "fp32")]
            + [make("live", f"r{i}") for i in range(rows)] + [make("bridge", f"r{i}") for i in range(rows)])


def diverging(family: str, rows: int, divergent: int) -> list[dict]:
    """`rows` BF16 records of `family`, the first `divergent` with differing suffixes."""
    return [make(family, f"r{i:02d}", suffix_equal=i >= divergent, first_divergence=0 if i < divergent else None)
            for i in range(rows)]


def transplant(row: str, role: str, *outcomes: str) -> dict:
    """A transplant record (families/transplant.py) with one outcome per direction, the same for its K-only and V-only
    parts; a divergent row's minimal layers where its recipient followed the donor (all 4 layers)."""
    directions = ("prefill<-incremental", "incremental<-prefill")
    outcome = {d: {"outcome": o, "first_divergence_vs_donor": None, "first_divergence_vs_own": None}
               for d, o in zip(directions, outcomes, strict=True)}
    return record("transplant", row, "bf16", {"incremental~prefill": comparison(suffix_equal=role == "control")},
                  role=role, transplants=outcome, layers=4,
                  parts={part: {d: o | {"cache_digest": "0" * 64, "suffix": [1]} for d, o in outcome.items()}
                         for part in ("k_only", "v_only")},
                  minimal_layers=None if role == "control" else
                  {d: [0, 3] if o["outcome"] == "follows_donor" else None for d, o in outcome.items()})


def test_identical_runs_pass_with_a_verdict_table():
    result = compare(run(), run())
    assert result.passed, f"identical runs failed: {result.reasons}"
    lines = result.text().splitlines()
    assert (lines[0], lines[-1]) == ("PASS at --gate bits: bits held; trajectories held; rates held", "PASS"), (
        lines[0], lines[-1])
    assert lines[1:3] == ["moved: bf16: bit-identical (40 arms in 3 constructions)",
                          "moved: fp32: bit-identical (16 arms in 2 constructions)"], lines[1:3]
    lines = [line for line in lines if not line.startswith("moved: ")]
    assert re.split(r"\s{2,}", lines[2]) == ["family", "precision", "measure", "rows", "baseline [Wilson 95%]",
                                            "new [Wilson 95%]", "p", "verdict"], lines[2]
    assert any(" 4/4 [51.0, 100.0]% " in line for line in lines), "counts without their interval"
    verdicts = {line.split()[-1] for line in lines[3:-1]}
    assert verdicts == {"ok"}, f"verdicts of a passing comparison: {verdicts}"


@pytest.mark.parametrize(("family", "fields", "expected"), [
    pytest.param("crossing", {"cache_exact": False}, "incremental~incremental_replica (cache_exact false)",
                 id="crossing-cache"),
    pytest.param("crossing", {"suffix_equal": False}, "incremental~incremental_replica (suffix_equal false)",
                 id="crossing-suffix"),
    pytest.param("live", {"cache_exact": False, "suffix_equal": False},
                 "live~live_replica (cache_exact false, suffix_equal false)", id="live-both"),
])
def test_replica_not_exact_fails(family, fields, expected):
    records = [make(family, "r0", replica=fields), make(family, "r1")]
    result = compare(records, records)
    assert result.reasons == [f"replicas exact: {family}/r0/bf16 {expected}"], result.reasons


@pytest.mark.parametrize("field", ["cache_exact", "logits_exact", "suffix_equal"])
def test_bridge_not_bit_exact_fails(field):
    records = [make("bridge", "r0"), make("bridge", "r1")]
    records[1]["comparisons"]["live~incremental"][field] = False
    result = compare(records, records)
    assert f"bridge bit exact: bridge/r1/bf16 live~incremental ({field} false)" in result.reasons, result.reasons
    assert not [r for r in result.reasons if not r.startswith("bridge bit exact")], f"other reasons: {result.reasons}"


@pytest.mark.parametrize(("path", "value", "expected"), [
    pytest.param(("arms", "prefill", "suffix", 1), 9, "trajectory changed: crossing/r2/fp32: arms.prefill.suffix[1]: "
                 "baseline 2, now 9", id="trajectory"),
    pytest.param(("arms", "incremental", "cache_digest"), "d" * 64,
                 "changed: crossing/r2/fp32: arms.incremental.cache_digest: baseline", id="cache-digest"),
    pytest.param(("comparisons", "incremental~prefill", "k_rel_l2"), 1e-3,
                 "changed: crossing/r2/fp32: comparisons.incremental~prefill.k_rel_l2: baseline 0.0, now 0.001",
                 id="drift"),
])
def test_changed_record_fails_naming_the_first_changed_leaf(path, value, expected):
    baseline = run()
    new = copy.deepcopy(baseline)
    target = next(r for r in new if (r["family"], r["row"], r["precision"]) == ("crossing", "r2", "fp32"))
    *parents, leaf = path
    for step in parents:
        target = target[step]
    target[leaf] = value
    result = compare(baseline, new)
    assert [r.startswith(expected) for r in result.reasons] == [True], result.reasons


def test_allowed_changes_are_notes():
    baseline, new = diverging("crossing", 4, 0), diverging("crossing", 4, 1)
    result = compare(baseline, new, gate="rates")
    assert result.passed, f"changes failed at --gate rates: {result.reasons}"
    assert [n for n in result.notes if n.startswith("trajectory changed: crossing/r00/bf16: ")], result.notes
    assert "changed (allowed)" in result.text(), result.text()


@pytest.mark.parametrize(("family", "divergent", "level", "fails"), [
    pytest.param("crossing", 10, 0.05, True, id="crossing-0-to-10-of-20-beyond-chance"),
    pytest.param("crossing", 2, 0.05, False, id="crossing-0-to-2-of-20-within-chance"),
    pytest.param("live", 5, 0.05, False, id="live-0-to-5-p-0.0625-at-0.05"),
    pytest.param("live", 5, 0.1, True, id="live-0-to-5-p-0.0625-at-0.1"),
    pytest.param("bridge", 6, 0.05, True, id="bridge-0-to-6-beyond-chance"),
])
def test_divergence_rate_change_fails_only_beyond_chance(family, divergent, level, fails):
    result = compare(diverging(family, 20, 0), diverging(family, 20, divergent), level, gate="rates")
    rates = [r for r in result.reasons if r.startswith("divergence rate changed beyond chance")]
    pair = PAIRS[family][0]
    assert bool(rates) == fails, f"0/20 -> {divergent}/20 at level {level}: {rates}"
    if fails:
        p = 2 * 0.5 ** divergent
        assert rates[0] == (f"divergence rate changed beyond chance: {family}/bf16 {pair} suffix divergence: "
                            f"baseline 0/20, new {divergent}/20 (baseline only 0, new only {divergent}), "
                            f"McNemar p = {p:.3g} < {level:g}"), rates[0]


@pytest.mark.parametrize(("outcomes", "gates", "expected"), [
    pytest.param(["follows_donor"] * 4, None, [], id="all-follow"),
    pytest.param(["follows_donor"] * 3 + ["keeps_own"], None,
                 ["transplant gate: transplant/bf16 incremental<-prefill: follows donor 3/4 divergent rows, below the "
                  "donor recovery gate 1"], id="one-keeps-own"),
    pytest.param(["follows_donor"] * 3 + ["third"], 0.75, [], id="3-of-4-at-gate-0.75"),
])
def test_donor_recovery_below_its_gate_fails(outcomes, gates, expected, regated):
    records = [transplant(f"d{i}", "divergent", "follows_donor", o) for i, o in enumerate(outcomes)]
    gate = None if gates is None else regated(default_gates(), "transplant", donor_recovery=gates)
    result = compare(records, records, gates=gate)
    assert result.reasons == expected, result.reasons


def test_control_with_a_third_trajectory_fails():
    records = [transplant("c0", "control", "third", "follows_donor"), transplant("c1", "control", "keeps_own",
                                                                                  "follows_donor")]
    result = compare(records, records)
    assert result.reasons == ["transplant gate: transplant/bf16 prefill<-incremental: third trajectory 1/2 control "
                              "rows, above the gate 0"], result.reasons


def test_transplant_gates_come_from_the_contract_or_its_defaults():
    gates = gates_of()
    for family in ("transplant", "replication", "conversation_transplant"):
        assert [gates.setting(family, key) for key in ("donor_recovery", "controls_third_trajectory")] == \
            [(1.0, "transplant.donor_recovery"), (0, "transplant.controls_third_trajectory")], (family, gates)
    tiny = gates_of(CONTRACT)
    assert tiny.settings["transplant"] == {"donor_recovery": 1.0, "controls_third_trajectory": 0}, \
        "cpu-tiny keeps the default gates"


def test_missing_rows_are_noted_and_a_vanished_precision_fails():
    baseline = run()
    new = [r for r in baseline if r["precision"] != "fp32" and (r["family"], r["row"]) != ("live", "r3")]
    new.append(make("bridge", "r9"))
    result = compare(baseline, new)
    assert result.reasons == ["crossing/fp32: 4 records in the baseline, none in the new run"], result.reasons
    assert "live: 1 rows only in the baseline (bf16: r3)" in result.notes, result.notes
    assert "bridge: 1 rows only in the new run (bf16: r9)" in result.notes, result.notes


def test_excluded_rows_in_the_new_run_are_noted():
    excluded = {k: v for k, v in make("crossing", "r9").items() if k not in ("arms", "comparisons")}
    result = compare(run(), [*run(), excluded | {"status": "excluded", "reason": "BoundaryMismatch: x"}])
    assert result.passed, result.reasons
    assert "crossing/bf16: 1 records excluded in the new run (fail-closed checks): r9" in result.notes, result.notes


@pytest.fixture
def runs(tmp_path):
    """A baseline run directory (with run.json) and a new one whose crossing diverges on every row."""
    baseline = write_ledger_file(tmp_path / "base" / "ledger.jsonl", diverging("crossing", 12, 0)).parent
    new = write_ledger_file(tmp_path / "new" / "ledger.jsonl", diverging("crossing", 12, 12)).parent
    for path, torch in ((baseline, "2.12"), (new, "2.13")):
        (path / "run.json").write_text(json.dumps({"platform": {"software.torch": torch}}), encoding="utf-8")
    return baseline, new


def test_cli_compare_names_the_root_cause_first_and_a_few_examples(runs, capsys):
    baseline, new = runs
    code = main(["compare", str(baseline), str(new / "ledger.jsonl")])
    lines = capsys.readouterr().out.splitlines()
    cause = "the platform: software.torch 2.12 (baseline) vs 2.13 (new)"
    levels = "bits changed (12 records); trajectories changed (12 records); rates changed (1 rate)"
    assert (code, lines[0], lines[-1]) == (1, f"FAIL: 13 reasons at --gate bits: {levels}; the runs differ in {cause}",
                                           "FAIL: 13 reasons"), (code, lines[0], lines[-1])
    assert f"cause: {cause}" in lines, lines[:4]
    changed = [line for line in lines if line.startswith("reason: trajectory changed: ")]
    assert len(changed) == 3 and "reason: ... and 9 more trajectory changed reasons (--verbose lists them)" in lines, \
        changed
    rates = [line for line in lines if line.startswith("reason: divergence rate changed beyond chance")]
    assert len(rates) == 1, rates


def test_cli_compare_verbose_lists_every_reason(runs, capsys):
    baseline, new = runs
    assert main(["compare", str(baseline), str(new), "--verbose"]) == 1
    reasons = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reason: ")]
    assert len(reasons) == 13, f"12 changed rows and one rate change: {reasons}"


def test_digests_of_another_manifest_schema_are_no_cause():
    """A model digest defined differently (bank manifest schema 1 vs 2) is not a changed model."""
    base = {"manifest": {"schema": "replaytests.bank-manifest/1", "bank_sha256": "b", "model": {"sha256": "old"}}}
    new = {"manifest": {"schema": "replaytests.bank-manifest/2", "bank_sha256": "b", "model": {"sha256": "new"}}}
    assert causes(base, new) == [], causes(base, new)
    new["manifest"] |= {"schema": base["manifest"]["schema"], "bank_sha256": "c"}
    found = causes(base, new)
    assert len(found) == 2 and found[0].startswith("the input bank: ") and found[1].startswith("the input model: "), \
        found


def test_a_contract_that_moved_is_no_cause(tmp_path):
    run = {"contract": {"name": "c", "path": "/a/c.yaml", "sha256": "1" * 64}, "platform": {"software.torch": "2"}}
    assert causes(run, run | {"contract": run["contract"] | {"path": "/b/c.yaml"}}) == [], "a path alone is no cause"


def test_cli_compare_passes_identical_runs_and_says_they_are_one(runs, capsys):
    code = main(["compare", str(runs[0]), str(runs[0])])
    lines = capsys.readouterr().out.splitlines()
    assert (code, lines[-1]) == (0, "PASS"), f"exit {code}"
    assert "both sides are one run (given twice, or a copy)" in lines[0], lines[0]


def test_two_runs_with_equal_records_are_not_called_one_run(tmp_path, capsys):
    """An upgrade that moved nothing gives equal records from two runs: that is a result, not a mistake."""
    records = diverging("crossing", 4, 1)
    runs = [write_ledger_file(tmp_path / name / "ledger.jsonl", records).parent for name in ("old", "new")]
    for run, started in zip(runs, ("2026-12-01T00:00:00", "2026-12-02T00:00:00"), strict=True):
        (run / "run.json").write_text(json.dumps({"run": {"name": run.name, "started": started}}), encoding="utf-8")
    assert main(["compare", str(runs[0]), str(runs[1])]) == 0
    assert "one run" not in capsys.readouterr().out.splitlines()[0]
    assert main(["compare", str(runs[0]), str(runs[0] / "ledger.jsonl")]) == 0
    assert "both sides are one run" in capsys.readouterr().out.splitlines()[0]


def test_cli_compare_refuses_runs_in_which_nothing_could_be_judged(tmp_path, capsys):
    """Every record failed closed in one run: nothing was judged, so no PASS."""
    records = diverging("crossing", 4, 0)
    excluded = [r | {"status": "excluded", "reason": "PhysicalBatchDesync: copies differ"} for r in records]
    baseline = write_ledger_file(tmp_path / "base" / "ledger.jsonl", records).parent
    new = write_ledger_file(tmp_path / "new" / "ledger.jsonl", excluded).parent
    code = main(["compare", str(baseline), str(new)])
    err = capsys.readouterr().err
    assert code == 4 and "each of the 4 records in common failed closed (excluded) in one run or both: nothing could " \
        "be judged" in err, (code, err)


@pytest.mark.parametrize(("content", "message"), [
    pytest.param(None, r"cannot read ledger: No such file or directory", id="missing"),
    pytest.param("", r"empty ledger \(no records\)", id="empty"),
    pytest.param('{"schema": "replaytests.ledger/9"}\n', r":1: field 'schema' is 'replaytests.ledger/9'",
                 id="other-schema"),
])
def test_cli_compare_bad_input_is_one_line_exit_4(runs, tmp_path, capsys, content, message):
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    code = main(["compare", str(runs[0]), str(bad)])
    err = capsys.readouterr().err
    assert code == 4, f"exit {code}, stderr {err!r}"
    assert re.fullmatch(rf"replaytests: error: {re.escape(str(bad))}.*{message}.*\n", err), err


@pytest.mark.parametrize("spelling", ["--alpha", "--level"])
@pytest.mark.parametrize("level", ["0", "1", "x"])
def test_cli_compare_alpha_must_be_a_fraction(runs, level, spelling, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(runs[0]), str(runs[1]), spelling, level])
    assert stop.value.code == 4, f"{spelling} {level}: exit {stop.value.code}"
    assert "argument --alpha/--level: expected a number between 0 and 1" in capsys.readouterr().err


@pytest.mark.parametrize(("follows", "thirds", "outcomes"), [
    pytest.param({"p<-i": (2, 2)}, {"p<-i": (0, 8)}, ["pass"], id="met"),
    pytest.param({"p<-i": (0, 0)}, {"p<-i": (0, 8)}, ["recorded"], id="no-divergent-row-not-established"),
    pytest.param({"p<-i": (2, 2)}, {"p<-i": (0, 0)}, ["recorded"], id="no-control-not-established"),
    pytest.param({"p<-i": (1, 2)}, {"p<-i": (0, 0)}, ["fail", "recorded"], id="below-gate-and-no-control"),
])
def test_a_transplant_gate_on_no_rows_is_not_established(follows, thirds, outcomes):
    """0/0 is no evidence: the gate says "not established", never "met"."""
    from replaytests.outputs.transplant_outcome import gate_text

    judged = default_gates().transplant_family("transplant", follows, thirds)
    assert [j.outcome for j in judged] == outcomes, judged
    text = gate_text(judged)
    assert text.startswith({"pass": "met", "recorded": "not established"}.get(outcomes[0], "NOT MET")), text


def _on(runtime: str, records: list[dict], moved: dict[str, int] | None = None) -> list[dict]:
    """`records` as a run of `runtime` made them: on vLLM no cache is measured and the logits digests are of
    top-k rows (never the Hugging Face ones); `moved` gives each arm's suffix changed on its first N rows."""
    out = copy.deepcopy(records)
    for made in out if runtime == "vllm" else ():
        for name, arm in made["arms"].items():
            arm |= {"cache_digest": None, "layer_digests": None, "logits_digest": "t" * 64}
            if int(made["row"].lstrip("r")) < (moved or {}).get(name, 0):
                arm["suffix"] = [9, 9]
        for metrics in made["comparisons"].values():
            metrics["cache_exact"] = None
    return out


@pytest.mark.parametrize(("gate", "moved", "passed", "counts"), [
    pytest.param("trajectories", {}, True, {"incremental": (4, 4), "prefill": (4, 4)}, id="same-trajectories"),
    pytest.param("trajectories", {"prefill": 1}, False, {"incremental": (4, 4), "prefill": (3, 4)},
                 id="one-prefill-moved"),
    pytest.param("rates", {"prefill": 1}, True, {"incremental": (4, 4), "prefill": (3, 4)}, id="rates-allow-it"),
])
def test_two_runtimes_are_compared_arm_by_arm_on_the_families_both_ran(gate, moved, passed, counts):
    hf = run()
    vllm = [r for r in _on("vllm", run(), moved) if r["family"] != "bridge"]  # a backend without K/V: no bridge
    vllm.append(make("crossing", "r0") | {"family": "serving"})  # a family only the serving engine runs
    result = compare(hf, vllm, gate=gate, runtimes=("hf", "vllm"))
    assert result.passed is passed, (result.reasons, result.notes)
    assert "families only the baseline (hf) ran, not compared: bridge" in result.notes, result.notes
    assert "families only the new run (vllm) ran, not compared: serving" in result.notes, result.notes
    assert not any(note.startswith("changed: ") for note in result.notes), "bits listed across runtimes"
    seen = {line.measure.partition(":")[0]: line.new for line in result.lines
            if line.group == ("crossing", "bf16") and "hf vs vllm" in line.measure}
    assert {arm: seen[arm] for arm in counts} == counts, seen


def test_two_runtimes_cannot_be_gated_on_bits(tmp_path, capsys):
    sides = []
    for name, backend in (("hf", "hf"), ("vllm", "vllm")):
        path = write_ledger_file(tmp_path / name / "ledger.jsonl", _on(backend, run())).parent
        (path / "run.json").write_text(json.dumps({"options": {"backend": backend}}), encoding="utf-8")
        sides.append(str(path))
    assert main(["compare", *sides]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the runs were made by other runtimes (hf vs vllm)" in err[0], err
    assert main(["compare", *sides, "--gate", "trajectories"]) == 0, capsys.readouterr().out[-2000:]


# Issue 47: a gate met on nothing is no pass (replicas never compared, rows excluded, a cell redefined or
# of unknown gates).

def without_replicas(records: list[dict], kept: tuple[str, ...] = ()) -> list[dict]:
    """`records` with every replica comparison removed but `kept` (a ledger edited, or a runtime that lost them)."""
    return [r | {"comparisons": {pair: c for pair, c in r["comparisons"].items()
                                 if not pair.endswith("_replica") or pair in kept}} for r in records]


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
@pytest.mark.parametrize("kept", [(), ("incremental~incremental_replica",)], ids=["none", "one-of-two"])
def test_records_without_their_replica_pairs_fail_at_every_level(gate, kept):
    new = without_replicas(run(), kept)
    result = compare(new, new, gate=gate)
    expected = "replicas exact: crossing/r0/bf16 " + "; ".join(
        f"{pair} (not recorded)" for pair in PAIRS["crossing"][1] if pair not in kept)
    assert expected in result.reasons, result.reasons
    assert len(result.reasons) == 12, f"one reason per crossing (8) and live (4) record: {result.reasons}"
    line = next(m for m in result.lines if m.group == ("crossing", "bf16") and m.measure == "replicas exact")
    assert (line.new, line.ok) == ((0, 4), False), f"replicas of no comparison counted as exact: {line}"


def test_missing_replicas_fail_even_where_the_contract_allows_inexact_ones(regated):
    lenient = default_gates()
    for section in ("crossing", "live", "serving"):
        lenient = regated(lenient, section, replicas_exact=False)
    new = without_replicas(run())
    result = compare(run(), new, gates=lenient, gate="rates")
    assert "replicas exact: live/r3/bf16 live~live_replica (not recorded); prefill~prefill_replica (not recorded)" in \
        result.reasons, result.reasons


def test_cli_compare_fails_a_ledger_whose_replica_comparisons_were_removed(tmp_path, capsys):
    base = write_ledger_file(tmp_path / "base" / "ledger.jsonl", run())
    new = write_ledger_file(tmp_path / "new" / "ledger.jsonl", without_replicas(run()))
    assert main(["compare", str(base), str(new), "--gate", "rates"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "FAIL: 12 reasons", lines[-1]
    assert ("reason: replicas exact: crossing/r0/bf16 incremental~incremental_replica (not recorded); "
            "prefill~prefill_replica (not recorded)") in lines, lines


def fail_closed(record: dict, reason: str = "BoundaryMismatch: x") -> dict:
    return {k: v for k, v in record.items() if k not in ("arms", "comparisons")} | {"status": "excluded",
                                                                                      "reason": reason}


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_rows_the_baseline_judged_and_the_new_run_excluded_fail_at_every_level(gate):
    baseline = diverging("crossing", 48, 0)
    new = [fail_closed(r) if i < 47 else r for i, r in enumerate(baseline)]
    result = compare(baseline, new, gate=gate)
    reason = ("excluded: crossing/bf16: 47 of 48 rows ok in the baseline failed closed in the new run (r00, r01, r02, "
              "r03, r04, ...; r00: BoundaryMismatch: x)")
    assert reason in result.reasons, result.reasons
    assert gate != "rates" or result.reasons == [reason], f"other reasons at --gate rates: {result.reasons}"
    assert not any(note.startswith("crossing/bf16: ") for note in result.notes), result.notes


def test_a_family_and_cell_with_no_testable_row_fails():
    """Excluded in both runs: no row could be judged, so nothing in that family and cell passed."""
    records = [fail_closed(r) if r["family"] == "live" else r for r in run()]
    result = compare(records, records, gate="rates")
    assert result.reasons == ["no testable row: live/bf16: each of the new run's 4 records was excluded (fail-closed "
                              "checks): nothing in this family and cell could be judged"], result.reasons
    assert "live/bf16: 4 records excluded in the new run (fail-closed checks): r0, r1, r2, r3" in result.notes


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_a_cell_whose_definition_changed_fails_at_every_level(gate):
    new = [r | {"cell_digest": "e" * 16} if r["precision"] == "fp32" else r for r in run()]
    result = compare(run(), new, gate=gate)
    reason = ("cell fp32: definition changed (digest dddddddddddd… vs eeeeeeeeeeee…, baseline vs new): its records "
              "are of another cell under the same name")
    assert reason in result.reasons, result.reasons
    assert gate != "rates" or result.reasons == [reason], f"other reasons at --gate rates: {result.reasons}"


def test_a_cell_the_gates_do_not_name_is_exact():
    """Without a divergence gate for a cell, its divergence is judged as in an exact cell, never allowed."""
    records = [make("crossing", "r0", "kv-hqq4", suffix_equal=False, first_divergence=0)]
    result = compare(records, records)
    assert result.reasons == ["kv-hqq4 divergence: crossing/r0/kv-hqq4 incremental~prefill suffixes diverge at suffix "
                              "index 0 (gate crossing.suffix_divergence_allowed.kv-hqq4: false)"], result.reasons


def test_cli_compare_refuses_a_cell_of_unknown_gates(tmp_path, capsys):
    """Without --contract (or under one that does not declare it) a cell's gates are unknown: refused, never
    taken as allowed to diverge; under the contract that declares it, judged by its gates."""
    records = [make("crossing", f"r{i}", "w-int8", suffix_equal=False, first_divergence=0) for i in range(2)]
    base = write_ledger_file(tmp_path / "base" / "ledger.jsonl", records).parent
    new = write_ledger_file(tmp_path / "new" / "ledger.jsonl", records).parent
    (new / "run.json").write_text(json.dumps({"contract": {"path": "contracts/x.yaml"}}), encoding="utf-8")
    hint = "pass --contract with the contract the runs were made under (run.json names contracts/x.yaml)"
    assert main(["compare", str(base), str(new), "--gate", "rates"]) == 4
    err = capsys.readouterr().err
    assert err == ("replaytests: error: compare: the gates of cell w-int8 are unknown (without --contract, compare "
                   f"knows only the paper's cells: bf16, fp32); {hint}\n"), err
    assert main(["compare", str(base), str(new), "--gate", "rates", "--contract", str(CONTRACT)]) == 4
    err = capsys.readouterr().err
    assert err == (f"replaytests: error: compare: the gates of cell w-int8 are unknown (not declared by --contract "
                   f"{CONTRACT}); {hint}\n"), err
    declaring = CONTRACT.with_name("cpu-tiny-cells.yaml")
    assert main(["compare", str(base), str(new), "--gate", "rates", "--contract", str(declaring)]) == 0, \
        f"{declaring.name} allows w-int8 crossings to diverge: {capsys.readouterr()}"


def test_a_transplant_panel_without_divergent_rows_establishes_no_donor_recovery():
    controls = [transplant(f"c{i}", "control", "keeps_own", "keeps_own") for i in range(3)]
    result = compare(controls, controls)
    assert result.passed, result.reasons
    assert {"transplant gate: transplant/bf16 incremental<-prefill: donor recovery not established (0 testable "
            "divergent rows)", "transplant gate: transplant/bf16 prefill<-incremental: donor recovery not established "
            "(0 testable divergent rows)"} <= set(result.notes), result.notes
    assert not [m for m in result.lines if m.measure.endswith("follows donor")], "donor recovery over 0 rows tabled"
