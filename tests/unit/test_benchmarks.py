"""The benchmark scripts run end to end at toy sizes and write what their README promises (no timing
is asserted: the numbers are measurements, not gates)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import forkserver
import pytest

from replaytests.inputs.contract import load_contract

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    proc = forkserver.run([sys.executable, str(BENCHMARKS / "run.py"), "--smoke", "--precision", "fp32",
                           "--out", str(out)], cwd=REPO)
    return proc, out


@pytest.mark.e2e  # spawns a whole run
def test_smoke_run_succeeds_and_prints_the_tables(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, f"benchmarks/run.py --smoke failed:\n{proc.stderr[-3000:]}"
    for header in ("| precision | prefix | steps | suite ms/step |", "| precision | prefix | crossing row s |"):
        assert header in proc.stdout, f"no table starting {header!r} in stdout:\n{proc.stdout[-2000:]}"
    assert out.with_suffix(".md").read_text(encoding="utf-8") in proc.stdout, "the .md file is not the printed summary"


@pytest.mark.e2e  # spawns a whole run
def test_smoke_json_holds_environment_and_every_measurement(smoke_run):
    _, out = smoke_run
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["schema"] == "replaytests.benchmarks/1", f"schema {result['schema']!r}"
    env = result["environment"]
    wanted = (("software", "torch"), ("software", "transformers"), ("environment", "cpu_threads"), ("hardware", "cpu"))
    for path in wanted:
        value = env
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        assert value not in (None, ""), f"environment.{'.'.join(path)} missing from {sorted(env)}"
    lengths = result["settings"]["lengths"]
    decodes = result["decode"]["fp32"]
    assert [d["prefix_len"] for d in decodes] == lengths, f"decode prefix lengths {[d['prefix_len'] for d in decodes]}"
    for d in decodes:
        suite, generate, bare = (d["runs"][side][0] for side in ("suite", "generate", "bare"))
        assert suite["forward_calls"] == generate["forward_calls"] == bare["forward_calls"] == d["steps"] > 0, (
            f"prefix {d['prefix_len']}: suite {suite['forward_calls']}, generate() {generate['forward_calls']} and "
            f"bare loop {bare['forward_calls']} forward calls, {d['steps']} steps")
        assert 0 < d["summary"]["suite_outside_fraction"] < 1, f"outside fraction {d['summary']}"
    for row in result["rows"]["fp32"]:
        assert row["held_bytes"] >= 4 * row["cache_bytes_per_boundary"] > 0, (
            f"prefix {row['prefix_len']}: held {row['held_bytes']} bytes while the four arms' boundaries "
            f"({row['cache_bytes_per_boundary']} bytes each) are alive")
    assert set(result["fits"]["fp32"]) >= {"suite_outside_per_step_slope", "row_wall_slope", "row_held_bytes_slope"}


@pytest.mark.e2e  # spawns a one-row audit of the crossing tests (the profile computes every family itself)
def test_audit_benchmark_profiles_every_family_and_times_a_worker_run(tmp_path):
    out = tmp_path / "audit.json"
    proc = forkserver.run([sys.executable, str(BENCHMARKS / "audit.py"), "--rows", "1", "--workers", "1",
                           "--select", "crossing", "--out", str(out)], cwd=REPO)
    assert proc.returncode == 0, f"benchmarks/audit.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    result = json.loads(out.read_text(encoding="utf-8"))
    profiled = {(f["family"], f["precision"]) for f in result["profile"]["families"]}
    assert {("crossing", "bf16"), ("crossing", "fp32"), ("batch", "fp32"), ("transplant", "bf16")} <= profiled, profiled
    crossing = next(f for f in result["profile"]["families"] if f["family"] == "crossing")
    assert crossing["phases"]["incremental"] > 0 and crossing["phases"]["suffix"] > 0, crossing
    assert result["profile"]["arms"]["shared"] > 0, "no arm was shared between families"
    platform = result["profile"]["platform"]
    assert platform["environment.cpu_isa"] and platform["machine_cpu_isa"], f"CPU capability not recorded: {platform}"
    (run,) = result["workers"]  # one run: no other ledger to be the same as (same_ledger None, not true)
    assert run["exit"] == 0 and run["records"] > 0 and run["same_ledger"] is None and run["wall_s"] > 0, run
    assert result["select"] == "crossing" and 'picked by -k "crossing":' in (
        out.with_suffix(".md").read_text(encoding="utf-8")), "the worker run's selection is not reported"


def test_the_audit_benchmarks_table_shows_a_selection_as_text():
    """The -k expression a user gave reaches the Markdown as text: no table cell split, no HTML."""
    platform = {"hardware.cpu": "c", "machine_cpu_isa": "AVX2", "environment.cpu_isa": "AVX2",
                "software.torch": "t", "software.transformers": "tr"}
    result = {"rows": "1", "command": "c", "select": "a|b <img src=x onerror=alert(1)>",
              "profile": {"platform": platform, "seconds": 1.0, "arms": {"built": 1, "shared": 0}, "families": []},
              "workers": [{"workers": "1", "wall_s": 1.0, "peak_rss_mib": None, "exit": 0, "same_ledger": None}]}
    text = _load("audit").markdown(result)
    assert 'picked by -k "a\\|b &lt;img src=x onerror=alert(1)>":' in text, text


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--lengths", "256,abc"], "--lengths: expected comma-separated integers", id="lengths-not-int"),
    pytest.param(["--lengths", "1024,256"], "--lengths: expected increasing positive integers", id="lengths-order"),
    pytest.param(["--caps", "32/96"], "--caps: expected BRANCH/MERGE/ANSWER", id="caps"),
    pytest.param(["--precision", "fp16"], "--precision: expected one or both of bf16, fp32", id="precision"),
    pytest.param(["--reps", "0"], "--reps: expected a positive integer", id="reps"),
    pytest.param(["--lengths", "40"], "--lengths: 40 is shorter than 106", id="lengths-too-short"),
    pytest.param(["--caps", "8/6/2", "--row-lengths", "33,64"], "--row-lengths: 33 is shorter than 34",
                 id="row-lengths-too-short"),
])
def test_bad_argument_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        _load("run").parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, f"exit code {exc.value.code} for {argv}"
    assert err.count("\n") == 1 and message in err, f"expected one line with {message!r}, got {err!r}"


def test_large_model_problems_have_the_asked_sizes(tmp_path):
    out = tmp_path / "problems.jsonl"
    sizes = _load("large_model").write_problems(out, count=3, min_bytes=100, max_bytes=300, seed=0)
    prompts = [json.loads(line)["prompt"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert sizes == [100, 200, 300], f"sizes {sizes}"
    assert [len(p.encode("ascii")) for p in prompts] == sizes, "a prompt is not ASCII of the asked byte size"


def test_large_model_contract_extends_h200(tmp_path):
    out = tmp_path / "contract.yaml"
    _load("large_model").write_contract(out, bank=None, device="cpu")
    contract = load_contract(out)
    assert (contract.name, contract.device, contract.caps) == ("h200-large-random", "cpu", load_contract(
        REPO / "contracts" / "h200.yaml").caps), f"got {contract.name}, {contract.device}, {contract.caps}"


def test_audit_extrapolation_scales_each_family_and_names_what_it_did_not_time(tmp_path):
    """Seconds per record times a whole run's records; a family the profile did not time is named."""
    from replaytests.outputs import ledger
    from replaytests.outputs.records import Record

    counts = {("crossing", "bf16"): 4, ("crossing", "fp32"): 4, ("transplant", "bf16"): 2, ("replication", "bf16"): 1}
    ledger.write_ledger(tmp_path / "ledger.jsonl", [
        Record.of({"schema": ledger.SCHEMA, "family": f, "row": f"r{n}", "precision": p, "prefix_len": 1,
                   "cell_digest": "d", "expected_answer": None, "status": "excluded", "reason": "counted, not read"})
        for (f, p), count in counts.items() for n in range(count)])
    profiled = {"families": [{"family": "crossing", "precision": "bf16", "rows": 2, "seconds": 2.0},
                             {"family": "crossing", "precision": "fp32", "rows": 2, "seconds": 1.0},
                             {"family": "transplant", "precision": "bf16", "rows": 1, "seconds": 3.0}]}
    got = _load("audit").extrapolate(profiled, tmp_path / "ledger.jsonl")
    assert (got["cpu_s"], got["two_workers_floor_s"]) == (12.0, 6.0), got
    assert got["left_out"] == {"replication bf16": 1}, got["left_out"]


@pytest.mark.e2e  # spawns a run of the model
def test_the_rollout_family_benchmark_runs_at_toy_sizes_and_writes_its_table(tmp_path):
    out = tmp_path / "family.json"
    proc = forkserver.run([sys.executable, str(BENCHMARKS / "rollout_family.py"), "--rows", "1", "--repeats", "1",
                           "--cells", "fp32", "--length", "4", "--out", str(out)], cwd=REPO)
    assert proc.returncode == 0, f"benchmarks/rollout_family.py failed:\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text(encoding="utf-8"))
    measured = result["cells"]["fp32"]
    assert set(measured["seconds_per_row"]) == {"crossing", "rollout", "rollout_sampled", "recompute", "bare"}
    assert all(value > 0 for value in measured["seconds_per_row"].values()), measured["seconds_per_row"]
    assert "| fp32 |" in out.with_suffix(".md").read_text(encoding="utf-8")


@pytest.mark.e2e  # builds models in a subprocess
def test_the_rollout_architecture_benchmark_runs_at_toy_sizes(tmp_path):
    out = tmp_path / "arch.json"
    proc = forkserver.run([sys.executable, str(BENCHMARKS / "rollout_architectures.py"), "--families", "llama,mixtral",
                           "--cells", "bf16", "--rows", "1", "--out", str(out)], cwd=REPO)
    assert proc.returncode == 0, f"benchmarks/rollout_architectures.py failed:\n{proc.stderr[-3000:]}"
    measured = {(m["family"], m["cell"]): m for m in json.loads(out.read_text(encoding="utf-8"))["measured"]}
    assert set(measured) == {("llama", "bf16"), ("mixtral", "bf16")}
    assert all(m["rows"] == 2 and m["tokens"] == 2 * 32 for m in measured.values()), measured  # 2 families x 1 row
    assert "| mixtral | yes | bf16 |" in out.with_suffix(".md").read_text(encoding="utf-8")
