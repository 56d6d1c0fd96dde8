"""benchmarks/attention_matrix.py, the SDPA kernel x cell x repeat matrix of benchmarks/gpu_lent.sh: its CPU
smoke at the smallest size writes every entry, the table and the verdict, and a kernel that did not run (not
available, refused by torch, or another kernel running in its place) is never counted as a pass."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _module():
    path = REPO / "benchmarks" / "attention_matrix.py"
    spec = importlib.util.spec_from_file_location("benchmarks_attention_matrix", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


am = _module()
SMALLEST = ("--device", "cpu", "--rows", "1", "--repeats", "1", "--families", "crossing")


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "matrix"
    rc = am.main(["matrix", *SMALLEST, "--out-dir", str(out), *args])
    result = json.loads((out / "attention-matrix.json").read_text(encoding="utf-8"))
    assert rc == (1 if any(u["status"] in ("error", "fallback") for u in result["units"]) else 0), f"exit {rc}"
    assert (out / "attention-matrix.md").read_text(encoding="utf-8") == f"{result['table']}\n\n{result['verdict']}\n"
    return result


@pytest.mark.model
def test_cpu_smoke_writes_every_entry_the_table_and_the_verdict(tmp_path):
    result = _run(tmp_path)
    kernels, cells = result["settings"]["kernels"], result["settings"]["cells"]
    assert kernels == ["math", "flash", "efficient", "cudnn"] and cells == ["bf16", "fp16", "fp32"]
    entries = [(u["kernel"], u["cell"], u["repeat"]) for u in result["units"]]
    assert sorted(entries) == sorted((k, c, 1) for k in kernels for c in cells), f"entries {entries}"
    for unit in result["units"]:
        assert unit["status"] in am.STATUSES, unit
        if unit["kernel"] == "math":  # the one kernel a CPU smoke runs: it ran, and the profiler saw it
            assert unit["status"] == "ran" and unit["kernels_seen"] == ["math"], unit
            assert unit["row_runs"] == 1 and unit["rows"] == [result["settings"]["rows"][0]], unit
        else:
            assert unit["status"] == "not available" and "not available on cpu" in unit["reason"], unit
            assert unit["row_runs"] == 0 and not unit["passed"], unit
        assert unit["passed"] == am.passed(unit), unit
    lines = result["table"].splitlines()
    assert lines[0] == "| SDPA kernel | bf16 | fp16 | fp32 |" and lines[1] == "|---|---|---|---|"
    assert [line.split(" | ")[0] for line in lines[2:6]] == [f"| {k}" for k in kernels]
    assert all(line.count(" | ") == 3 for line in lines[2:6]), lines
    assert result["table"].count("not available on cpu") == 9
    ran = [u for u in result["units"] if u["status"] == "ran"]
    if all(u["passed"] for u in ran):
        assert result["verdict"].startswith(f"verdict: none desynced in {len(ran)} runs ({len(ran)} row runs)")
    else:
        assert result["verdict"].startswith("verdict: desync or replica difference under math"), result["verdict"]
    assert "not available: cudnn at bf16" in result["verdict"]
    machine = result["machine"]
    assert machine["environment"]["software"]["torch"] == torch.__version__
    assert machine["key"].startswith("cpu ") and machine["platform"]["hardware.device_kind"] == "cpu"


@pytest.mark.model
def test_a_kernel_torch_refuses_is_recorded_not_available_never_a_pass(tmp_path):
    """Efficient attention alone on a CPU: torch raises rather than fall back to another kernel; the matrix
    records its refusal, runs no row and counts no pass."""
    result = _run(tmp_path, "--kernels", "efficient", "--cells", "fp32", "--try-all", "--repeats", "2")
    assert len(result["units"]) == 2
    for unit in result["units"]:
        assert unit["status"] == "not available", unit
        assert any(words in unit["reason"] for words in am.REFUSALS), unit["reason"]
        assert unit["row_runs"] == 0 and not unit["passed"], unit
    assert result["verdict"] == "verdict: nothing ran; not available: efficient at fp32"
    assert "not available: No" in result["table"].splitlines()[2]


def _unit(status: str, **counts) -> dict:
    return am.new_unit("flash", "bf16", 1) | {"status": status, "row_runs": 4} | counts


def test_a_kernel_that_did_not_run_as_pinned_never_passes():
    assert am.judge_seen("flash", ["flash"]) == ("ran", None)
    assert am.judge_seen("flash", ["efficient"]) == ("fallback", "pinned flash, torch ran efficient")
    assert am.judge_seen("math", [])[0] == "fallback"  # no SDPA operator seen proves nothing
    assert am.judge_seen(am.CONTROL, ["cudnn"]) == ("ran", None)  # the control takes torch's choice
    assert am.passed(_unit("ran"))
    for status in ("not available", "fallback", "error", "not run"):
        assert not am.passed(_unit(status)), status
    for key in ("desync", "replica_failures", "excluded_other", "errors"):
        assert not am.passed(_unit("ran", **{key: ["crossing tiny-000: x"]})), key
    assert not am.passed(_unit("ran", row_runs=0))


def test_the_verdict_names_the_kernels_that_desync_and_counts_only_runs():
    clean = _unit("ran") | {"kernel": "math"}
    bad = _unit("ran", desync=["live tiny-009: PhysicalBatchDesync: ..."]) | {"kernel": "efficient"}
    refused = _unit("not available", reason="No available kernel", row_runs=0) | {"kernel": "flash"}
    line = am.verdict([clean, bad, refused])
    assert line.startswith("verdict: desync or replica difference under efficient (bf16 repeat 1: 1 desync); "
                           "clean: math (2 runs, 8 row runs)"), line
    assert line.endswith("; not available: flash at bf16"), line
    assert am.verdict([clean, refused]) == "verdict: none desynced in 1 runs (4 row runs); not available: flash at bf16"
    assert am.verdict([refused]) == "verdict: nothing ran; not available: flash at bf16"
