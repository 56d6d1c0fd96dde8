"""`replaytests selftest`: every fault found by its check on the embedded default, and a disabled check
reported as a miss with exit 1 (a selftest that cannot fail proves nothing)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from replaytests.cli import main
from replaytests.engine import comparisons
from replaytests.errors import ConfigError
from replaytests.families import bridge, crossing
from replaytests.families.registry import CROSS, FAMILIES
from replaytests.inputs import cpu_isa
from replaytests.outputs import rundir
from replaytests.selftest import faults, matrix, trials
from replaytests.selftest.command import output, shortest_row
from replaytests.selftest.matrix import CONTROL_FAILED, DETECTED, MISSED, NOT_RUN, Cell, judged

pytestmark = pytest.mark.selftest

NOT_RUN_HERE = {"prefix-cache hit on a stale block"}  # needs a serving backend (vllm, llama.cpp)
# Faults that may not run on a platform, each with the reason the run's own data must give: a CPU without
# AVX-512 has no other level to drift to; with DEFAULT kernels the row's incremental and prefill caches can be
# bitwise equal, and a transplant that copies nothing is then a transplant.
NOT_RUN_WHERE = {"kernels at AVX512, contract pins AVX2": "this CPU lacks AVX-512",
                 "transplant swaps nothing": "the incremental and prefill caches are bitwise equal here"}


def test_every_fault_is_detected_on_the_embedded_default(tmp_path, capsys):
    assert main(["selftest", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "selftest.json").read_text(encoding="utf-8"))
    outcomes = {(cell["fault"], cell["check"]): cell["outcome"] for cell in written["cells"]}
    assert written["passed"] and len(outcomes) == len(written["cells"]) >= 12
    not_run = {cell["fault"]: cell["detail"] for cell in written["cells"] if cell["outcome"] == NOT_RUN}
    assert not_run.keys() >= NOT_RUN_HERE, not_run
    unexplained = {f: d for f, d in not_run.items() if f not in NOT_RUN_HERE and NOT_RUN_WHERE.get(f, "\0") not in d}
    assert not unexplained, f"a fault not run without its platform's reason: {unexplained}"
    assert all(outcome == DETECTED for (fault, _), outcome in outcomes.items() if fault not in not_run), outcomes
    assert all(cell["control"] == "passed" for cell in written["cells"] if cell["outcome"] == DETECTED)
    assert "| K +1 ULP, prefill | crossing prefill~prefill_replica cache" in (tmp_path / "selftest.md").read_text()
    assert printed.splitlines()[1].split() == ["fault", "check", "outcome", "control", "finding"]
    assert printed.rstrip().endswith("verdict: PASS (every fault run was detected, every control passed)")


def test_a_disabled_cache_comparison_is_reported_missed(tmp_path, capsys, monkeypatch):
    """The cache comparison made to call every cache equal: the ULP fault it exists to find is missed by
    the crossing's and the bridge's checks (the audit, which reads digests, still finds it), exit 1."""
    compare = comparisons._compare_caches
    monkeypatch.setattr(comparisons, "_compare_caches", lambda a, b: compare(a, b) | {"cache_exact": True})
    monkeypatch.setattr(trials, "TRIALS", (trials.ulp_cells,))
    assert main(["selftest", "--out", str(tmp_path)]) == 1
    missed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{MISSED}: ")]
    assert [line.partition(" -> ")[2].partition(":")[0] for line in missed] == [
        "crossing prefill~prefill_replica cache (gates.replicas)",
        "bridge live~incremental bit-exact (gates.bridge.exact)"]
    written = json.loads((tmp_path / "selftest.json").read_text(encoding="utf-8"))
    assert [cell["outcome"] for cell in written["cells"]] == [MISSED, MISSED, DETECTED] and not written["passed"]


def test_a_shifted_position_is_found_by_the_audit_alone(bf16_runtime, tiny_contract, bank_rows):
    """Every construction shares the shift, so the checks that compare constructions pass (the README and
    docs/ci.md say so); the ledger audit against the run without it finds it."""
    bench = trials.Bench(tiny_contract, bf16_runtime, shortest_row(bank_rows))
    shifted = faults.shifted_position(bf16_runtime, bench.row.prefix_len // 2)
    record, gates = crossing.run(shifted, bench.row), tiny_contract.gates
    judgements = [gates.replicas(record, pair) for pair in FAMILIES["crossing"].replicas]
    judgements += [gates.divergence(record, CROSS), gates.control(bridge.run(shifted, bench.row))]
    assert [j.outcome for j in judgements] == ["pass"] * 4, [j.message for j in judgements]
    assert [cell.outcome for cell in trials.position_cells(bench)] == [DETECTED]


def test_the_avx512_row_is_not_run_without_avx512(monkeypatch, tiny_contract):
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: {"avx2", "fma"})
    (cell,) = trials.isa_cells(SimpleNamespace(contract=tiny_contract))
    assert (cell.outcome, cell.detail) == (NOT_RUN, "this CPU lacks AVX-512 (avx512f, avx512bw, avx512vl, avx512dq)")


def test_the_mask_row_is_not_run_where_nothing_is_hidden():
    (cell,) = trials.mask_cells(SimpleNamespace(contract=SimpleNamespace(visibility="causal")))
    assert (cell.outcome, cell.detail) == (NOT_RUN, "contract visibility 'causal' hides no key")


def test_a_check_that_fails_without_the_fault_is_a_failed_control():
    assert judged("f", "c", "it failed anyway", "found").outcome == CONTROL_FAILED
    assert judged("f", "c", None, None).outcome == MISSED
    assert judged("f", "c", None, "found") == Cell("f", "c", DETECTED, "found", "passed")


def test_a_trial_that_raises_is_a_failing_cell_and_the_others_run(monkeypatch):
    def broken(bench):
        raise RuntimeError("boom")

    monkeypatch.setattr(trials, "TRIALS", (broken, trials.serving_cells))
    cells = trials.run_all(SimpleNamespace())
    assert [(c.fault, c.outcome, c.detail) for c in cells] == [
        ("broken", matrix.ERROR, "RuntimeError: boom"),
        ("prefix-cache hit on a stale block", NOT_RUN,
         "needs a serving backend (one with chunked_prefill, prefix_cache: vllm, llamacpp); its own tests run it")]
    assert matrix.exit_code(cells) == 1


def test_exit_code_and_failure_lines():
    cells = [Cell("a", "x", DETECTED, "found", "passed"), Cell("b", "y", NOT_RUN, "needs vllm")]
    assert matrix.exit_code(cells) == 0 and not matrix.failures(cells)
    cells += [Cell("c", "z", MISSED, "the check passed with the fault in place", "passed"),
              Cell("d", "w", CONTROL_FAILED, "found", "failed anyway")]
    assert matrix.exit_code(cells) == 1
    assert matrix.failures(cells) == ["missed: c -> z: the check passed with the fault in place",
                                      "control failed: d -> w: failed anyway"]


def test_the_matrix_is_written_as_json_and_markdown(tmp_path):
    cells = [Cell("a", "x", DETECTED, "found | piped <b>", "passed")]
    paths = matrix.write(tmp_path / "out", cells, {"row": "r"})
    assert [p.name for p in paths] == list(matrix.FILES)
    document = json.loads(paths[0].read_text(encoding="utf-8"))
    assert document["schema"] == matrix.SCHEMA and document["passed"] and document["row"] == "r"
    assert "| a | x | detected | passed | found \\| piped &lt;b> |" in paths[1].read_text(encoding="utf-8")


def test_the_default_output_is_a_new_directory_in_a_report_root_a_run_still_accepts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    directory = output(None, {})()
    assert directory.resolve().parent == tmp_path / "reports" and directory.is_dir() and "-selftest-" in directory.name
    rundir.check_root(tmp_path / "reports", {})  # an audit there afterwards is not refused
    assert not (tmp_path / "reports" / "latest").exists()


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "file").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        output(tmp_path / "file", {})


def test_the_transplant_row_is_not_run_where_the_caches_are_equal():
    """With DEFAULT kernels tiny-000's incremental and prefill caches came out bitwise equal: a transplant that
    copies nothing is then a transplant, so the fault is not run (it was reported missed, failing the selftest)."""
    crossing_record = SimpleNamespace(title="crossing row r (bf16)",
                                      comparisons={trials.CROSS: SimpleNamespace(cache_exact=True)})
    (cell,) = trials.transplant_cells(SimpleNamespace(crossing=crossing_record))
    assert cell.outcome == NOT_RUN and "caches are bitwise equal here" in cell.detail, cell
