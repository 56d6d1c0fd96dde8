"""The edge sweep on vLLM (engine/vllm/sweep.py, docs/vllm.md "Edge sweep"), in child conformance runs started side by
side (each on a core of its own), each small by its contract's sweep keys:

- the tiny causal bank's first row at BF16 under the AVX2 pin, every axis: each point's counters are the engine
  arithmetic a server owes (a hit reuses whole blocks, a chunked prefill takes ceil(p / budget) steps, a batch runs
  in one step, a start is the engine's first request), and a point whose hit the engine did not count is reported
  vacuous, never passed;
- SmolLM2's first row at BF16, the batch axis only, once under contracts/cpu-smollm2-vllm-avx512.yaml (vLLM's
  kernels at AVX-512, where batch invariance does not hold) and once under the AVX2 pin: the must-fail control. The
  sweep must report the AVX-512 run's batch points as not exact, and the pinned run's as exact on the same row;
- the tiny model's kv-fp8 cell (an AVX-512 pin), the fp8 axis only, where the CPU runs an fp8 cache at all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")

from vllm_runs import CONTRACT, REPO, _finish, _records, _start

SMOLLM2_BANK = REPO / "fixtures" / "banks" / "smollm2-causal.jsonl"
PINS = {"avx512": REPO / "contracts" / "cpu-smollm2-vllm-avx512.yaml",
        "avx2": REPO / "contracts" / "cpu-smollm2-vllm.yaml"}
BATCHES = [1, 8]


def _avx512() -> bool:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return any(line.startswith("flags") and {"avx512f", "amx_tile"} & set(line.split()) for line in text.splitlines())


def _contract(root: Path, name: str, extends: Path, sweep: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(f"extends: {extends}\nname: {name}\npanels: {{sweep: 1}}\nsweep: {sweep}\n")
    return path


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The runs, started together and waited for: name -> (the process, its run directory), None where skipped."""
    from replaytests.inputs import models

    root, contracts = tmp_path_factory.mktemp("sweep"), tmp_path_factory.mktemp("sweep-contracts")
    started = {"tiny": _start(root, "tiny", "--rows", "0:1", "--precision", "bf16", "-k", "sweep",
                              contract=_contract(contracts, "tiny", CONTRACT, "{multiples: 1, batch_sizes: [1, 4]}"))}
    model = models.prepared("smollm2")
    for pin, contract in PINS.items():
        if model is not None and (pin == "avx2" or _avx512()):
            small = _contract(contracts, pin, contract, f"{{axes: [batch], batch_sizes: {BATCHES}}}")
            started[pin] = _start(root, pin, "--rows", "0:1", "--precision", "bf16", "-k", "sweep", "--model",
                                  str(model), bank=SMOLLM2_BANK, contract=small)
    if _avx512():
        started["fp8"] = _start(root, "fp8", "--rows", "0:1", "--precision", "kv-fp8", "-k", "sweep",
                                contract=_contract(contracts, "fp8", REPO / "contracts" / "cpu-tiny-vllm-cells.yaml",
                                                   "{axes: [fp8_position]}"))
    return {name: _finish(run) for name, run in started.items()}


def _sweep(sweeps, name: str) -> dict:
    if name not in sweeps:
        pytest.skip({"avx512": "this CPU has no AVX-512: the control's pin cannot apply",
                     "fp8": "vLLM's CPU attention runs an fp8 K/V cache only with AVX-512 or AMX kernels"}.get(
                         name, "SmolLM2 is not prepared here: run `replaytests models prepare smollm2`"))
    proc, run = sweeps[name]
    assert proc.returncode == 0, f"the {name} sweep run failed:\n{proc.stdout[-4000:]}"
    (record,) = _records(run, "sweep")
    assert record["status"] == "ok", record.get("reason")
    return record


def _points(record: dict, axis: str) -> list[dict]:
    return [point for point in record["sweep"] if point["axis"] == axis]


def test_every_point_counts_what_the_engine_owes(sweeps):
    record = _sweep(sweeps, "tiny")
    assert {p["axis"] for p in record["sweep"]} == {"block_position", "chunk_position", "batch", "start"}
    for point in record["sweep"]:
        served, p = point["served"], point["value"]
        where = f"{point['axis']} {p}: {served}"
        cold = [arm for arm in served if not (point["axis"] == "block_position" and arm.startswith("edge"))]
        assert all(served[arm]["cached_tokens"] == 0 for arm in cold), where
        for arm in ("edge", "edge_replica"):
            got = served[arm]
            if point["axis"] == "block_position":  # whole blocks, the prompt's last token recomputed
                assert got["cached_tokens"] == (p - 1) // 32 * 32, where
                assert got["schedule"] == [p - got["cached_tokens"]], where
            elif point["axis"] == "chunk_position":
                assert got["prefill_steps"] == math.ceil(p / 32) and sum(got["schedule"]) == p, where
            elif point["axis"] == "batch":
                assert got["co_scheduled"] == got["batch"] == p + 1 and len(got["others"]) == p, where
            else:
                assert got["request_index"] == p, where
        assert all(served[arm]["request_index"] == 0 for arm in served if point["axis"] == "start"
                   and arm.startswith("reference")), where
    assert [p["value"] for p in _points(record, "batch")] == [1, 4]


def test_a_hit_the_engine_did_not_count_is_vacuous_never_passed(sweeps):
    """At 31 and 32 tokens no whole block lies before the prompt's last token: the engine reuses nothing, and the
    point is reported vacuous by the premise test (an expected failure naming it), and reference~edge is judged only
    at the points whose premise held."""
    record = _sweep(sweeps, "tiny")
    hits = {p["value"]: p["served"]["edge"]["cached_tokens"] for p in _points(record, "block_position")}
    assert hits[31] == hits[32] == 0 and hits[33] == 32, hits
    proc, _ = sweeps["tiny"]
    def outcomes(test: str) -> list[str]:
        return [line for line in proc.stdout.splitlines() if test in line
                and line.startswith(("PASSED", "XFAIL", "FAILED"))]

    premise = outcomes("test_sweep_premise")
    assert len(premise) == 1 and premise[0].startswith("XFAIL"), premise
    assert "vacuous" in premise[0] and "at block_position 31" in premise[0] and "block_position 33" not in premise[0]
    # the divergence is judged only where the premise held: the vacuous points are not judged at all
    assert [line.split(" ")[0] for line in outcomes("test_sweep_reference_vs_edge")] == ["PASSED"]


def _batch_exact(record: dict) -> dict[int, bool]:
    """Each batch point: the row alone and the row in the batch bitwise equal at the boundary and every continuation
    step (the replicas must be, or nothing is measured)."""
    out = {}
    for point in _points(record, "batch"):
        c = point["comparisons"]
        assert all(c[pair]["logits_exact"] and c[pair]["steps_exact"] for pair in
                   ("reference~reference_replica", "edge~edge_replica")), f"replicas differ at batch {point['value']}"
        assert point["served"]["edge"]["co_scheduled"] == point["value"] + 1, point["served"]["edge"]
        out[point["value"]] = c["reference~edge"]["logits_exact"] and c["reference~edge"]["steps_exact"]
    return out


def test_the_batch_axis_fails_without_the_pin_and_the_pinned_run_is_judged_against_it(sweeps):
    """The must-fail control (docs/vllm.md): vLLM's AVX-512 kernels change a row's decode steps when other requests
    share them, and the sweep reports it; under the AVX2 pin the same row's batch points are exact."""
    unpinned, pinned = _batch_exact(_sweep(sweeps, "avx512")), _batch_exact(_sweep(sweeps, "avx2"))
    assert set(unpinned) == set(pinned) == set(BATCHES)
    assert not all(unpinned.values()), f"the AVX-512 run's batch points are all exact: no failure seen {unpinned}"
    assert all(pinned.values()), f"under the AVX2 pin a batch point is not exact: {pinned}"
    # the pinned run holds where the unpinned one does not
    assert [n for n, exact in unpinned.items() if not exact and pinned[n]], (unpinned, pinned)


def test_the_fp8_axis_sits_on_the_decode_tile_and_decodes_the_last_token(sweeps):
    record = _sweep(sweeps, "fp8")
    points = _points(record, "fp8_position")
    assert {95, 96, 97} <= {p["value"] for p in points}, [p["value"] for p in points]
    for point in points:
        edge = point["served"]["edge"]
        assert edge["schedule"] == [point["value"] - 1, 1] and edge["decoded"] == 1, edge
        assert point["served"]["reference"]["schedule"] == [point["value"]]
    cells = {cell["name"]: cell for cell in json.loads((sweeps["fp8"][1] / "run.json").read_text())["cells"]}
    assert cells["kv-fp8"]["kv_cache"]["format"] == "fp8_e4m3"
