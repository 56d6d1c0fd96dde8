"""The rollout families on the tiny model (`model`): a record carries every arm's log-probabilities and every
pair's measures, the measures are the ones outputs/mismatch computes from those numbers, the control (teacher
forcing on the live schedule) holds bit for bit and fails where one live number is perturbed, the sampled
rollout is a function of its recorded seed, and the gates judge the trainer's recompute by the contract's
bounds. Without the model: the per-row seed, the gates on hand-built records, and `rollouts export`'s refusals."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from replaytests.cli import main
from replaytests.engine.rollout import row_seed
from replaytests.families.registry import FAMILIES, ROLLOUT_FAMILIES
from replaytests.inputs.contract import load_contract
from replaytests.inputs.gates import ROLLOUT_CONTROL, ROLLOUT_RECOMPUTE
from replaytests.inputs.rollouts import read_dump
from replaytests.outputs.mismatch import Scored, Thresholds, row_measures
from replaytests.outputs.records import Record

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"length": 12, "seed": 0, "ratio_bounds": [0.5, 2.0], "delta_threshold": 0.05}


def test_the_row_seed_is_a_function_of_the_contract_seed_and_the_row():
    assert row_seed(0, "tiny-000") == row_seed(0, "tiny-000")
    seeds = {row_seed(seed, row) for seed in (0, 1) for row in ("tiny-000", "tiny-001")}
    assert len(seeds) == 4, f"per-row seeds collide: {seeds}"
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.fixture(scope="module")
def records(request, bank_rows):
    """Both families' records of the shortest bank row, at BF16 and FP32 (the runtimes loaded once)."""
    row = min(bank_rows, key=lambda r: (r.prefix_len, r.id))
    out = {}
    for cell in ("bf16", "fp32"):
        runtime = request.getfixturevalue(f"{cell}_runtime")
        for name in ROLLOUT_FAMILIES:
            out[name, cell] = FAMILIES[name].run(runtime, row, SETTINGS)
    return out


@pytest.mark.model
@pytest.mark.parametrize("cell", ["bf16", "fp32"])
@pytest.mark.parametrize("name", ROLLOUT_FAMILIES)
def test_a_record_carries_every_arm_and_the_measures_of_its_numbers(records, name, cell):
    record = records[name, cell]
    assert record.ok, record.reason
    assert set(record.arms) == set(FAMILIES[name].arms)
    live = record.arms["live"]
    assert len(live.suffix) == len(live.logprobs) == len(live.top2) == SETTINGS["length"]
    assert all(arm.suffix == live.suffix for key, arm in record.arms.items() if not key.startswith("live")), (
        "a replay was not given the live tokens")
    assert all(lp <= 0 for lp in live.logprobs), f"a log-probability above 0: {max(live.logprobs)}"
    thresholds = Thresholds(*SETTINGS["ratio_bounds"], SETTINGS["delta_threshold"])
    for a, b in FAMILIES[name].pairs:
        got = record.comparisons[f"{a}~{b}"]
        want = row_measures(Scored("", np.asarray(live.suffix), np.asarray(record.arms[a].logprobs, dtype=np.float64),
                                   np.asarray(record.arms[b].logprobs, dtype=np.float32)), thresholds)
        assert (got.logprob_tokens, got.logprob_tokens_equal, got.k3, got.abs_dlogp_max, got.outside_bounds,
                got.first_exceeding) == (want.tokens, want.bitwise_equal, want.k3, want.abs_delta_max,
                                         want.outside_bounds, want.first_exceeding), f"{a}~{b}"
        assert got.logprobs_exact == (want.bitwise_equal == want.tokens), f"{a}~{b}"


@pytest.mark.model
@pytest.mark.parametrize("cell", ["bf16", "fp32"])
@pytest.mark.parametrize("name", ROLLOUT_FAMILIES)
def test_teacher_forcing_on_the_live_schedule_and_every_replica_are_bit_exact(records, name, cell,
                                                                              tiny_contract):
    record = records[name, cell]
    gates = tiny_contract.gates
    assert gates.control(record).outcome == "pass", gates.control(record).message
    for pair in FAMILIES[name].replicas:
        assert gates.replicas(record, pair).outcome == "pass", gates.replicas(record, pair).message


@pytest.mark.model
def test_the_greedy_live_choice_is_the_top1_and_the_sampled_draw_follows_its_seed(records):
    greedy = records["rollout", "bf16"].arms["live"]
    assert [ids[0] for ids in greedy.top2] == list(greedy.suffix), "a greedy token is not its step's top-1"
    sampled = records["rollout_sampled", "bf16"]
    assert sampled.rollout.seed == row_seed(SETTINGS["seed"], sampled.row)
    assert sampled.arms["live"].suffix != greedy.suffix, "the sampled rollout is the greedy one (no sampling?)"


@pytest.mark.model
def test_must_fail_a_perturbed_live_number_breaks_the_control(bf16_runtime, bank_rows, tiny_contract, monkeypatch):
    """The control can fail: one live log-probability nudged by one float32 step makes live~incremental
    inexact, and the gate fails the row, naming the pair."""
    row = min(bank_rows, key=lambda r: (r.prefix_len, r.id))
    real = type(bf16_runtime).rollout

    def nudged(self, z, length, seed, construction="live"):
        out = real(self, z, length, seed, construction)
        if construction != "live":
            return out
        logprobs = list(out.logprobs)
        logprobs[3] = float(np.nextafter(np.float32(logprobs[3]), np.float32(0)))
        return dataclasses.replace(out, logprobs=logprobs)

    monkeypatch.setattr(type(bf16_runtime), "rollout", nudged)
    record = FAMILIES["rollout"].run(bf16_runtime, row, SETTINGS)
    judgement = tiny_contract.gates.control(record)
    assert judgement.outcome == "fail" and ROLLOUT_CONTROL in judgement.message, judgement
    assert record.comparisons[ROLLOUT_CONTROL].first_exceeding is None  # one ULP is below any threshold
    assert record.comparisons[ROLLOUT_CONTROL].logprob_tokens_equal == SETTINGS["length"] - 1


@pytest.mark.model
def test_the_trainer_recompute_is_judged_by_the_contract_bounds(records, tiny_contract, regated):
    record = records["rollout", "bf16"]
    pair = record.comparisons[ROLLOUT_RECOMPUTE]
    if pair.logprobs_exact:
        pytest.skip("live~prefill is bit-exact at BF16 on this platform: no bound can be crossed")
    gates = tiny_contract.gates
    assert gates.rollout_recompute(record).outcome == "recorded"  # no bound set: data
    assert regated(gates, "rollout", k3_max=pair.k3).rollout_recompute(record).outcome == "pass"
    below = regated(gates, "rollout", k3_max=math.nextafter(pair.k3, 0)).rollout_recompute(record)
    assert below.outcome == "fail" and "rollout.k3_max" in below.message, below
    share = pair.outside_bounds / pair.logprob_tokens
    if share:
        failing = regated(gates, "rollout", outside_bounds_max=math.nextafter(share, 0)).rollout_recompute(record)
        assert failing.outcome == "fail" and "outside_bounds_max" in failing.message, failing


# ---- rollouts export ----

CAUSAL = REPO / "contracts" / "cpu-tiny-vllm.yaml"


def _ledger_run(tmp_path: Path, records: list[Record], contract: Path, bank: Path, backend: str = "hf") -> Path:
    """A run directory as a conformance run leaves it: its ledger and the run.json naming contract and bank."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "ledger.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in records), encoding="utf-8")
    (run / "run.json").write_text(json.dumps({
        "contract": {"name": "x", "path": str(contract), "sha256": load_contract(contract).digest},
        "options": {"bank": str(bank), "backend": backend}}), encoding="utf-8")
    return run / "ledger.jsonl"


def _bank(tmp_path: Path, row) -> Path:
    path = tmp_path / "bank.jsonl"
    path.write_text(json.dumps(row.to_json()) + "\n", encoding="utf-8")
    return path


def test_export_refuses_a_run_under_role_visibility(tmp_path, capsys):
    ledger = _ledger_run(tmp_path, [], REPO / "contracts" / "cpu-tiny.yaml", REPO / "fixtures" / "banks" / "tiny.jsonl")
    assert main(["rollouts", "export", str(ledger), "--out", str(tmp_path / "d.jsonl")]) == 4
    err = capsys.readouterr().err
    assert "protocol.visibility 'roles'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d.jsonl").exists()


@pytest.mark.model
def test_export_writes_the_live_rollouts_as_a_dump(records, bank_rows, tmp_path, capsys):
    """Each ok rollout record's live arm, with the bank row's z as the prompt: the numbers as recorded."""
    row = min(bank_rows, key=lambda r: (r.prefix_len, r.id))
    chosen = [records[name, "bf16"] for name in ROLLOUT_FAMILIES]
    ledger = _ledger_run(tmp_path, chosen, CAUSAL, _bank(tmp_path, row))
    assert main(["rollouts", "export", str(ledger), "--out", str(tmp_path / "d.jsonl")]) == 0, capsys.readouterr()
    dump = read_dump(tmp_path / "d.jsonl")
    assert [r.id for r in dump.rows] == [f"{row.id}/{name}/bf16" for name in ROLLOUT_FAMILIES]
    for got, record in zip(dump.rows, chosen, strict=True):
        live = record.arms["live"]
        assert (list(got.prompt_ids), got.response_ids, got.logprobs) == (row.tokens, live.suffix, live.logprobs)


@pytest.mark.model
@pytest.mark.parametrize(("case", "words"), [("other z", "z digest is not the bank row's"),
                                             ("no such cell", "no ok record"),
                                             ("row not in bank", "is not in the bank")])
def test_export_refuses_what_it_cannot_vouch_for(records, bank_rows, tmp_path, capsys, case, words):
    row = min(bank_rows, key=lambda r: (r.prefix_len, r.id))
    bank_row = {"other z": dataclasses.replace(row, tokens=row.tokens[:-2] + row.tokens[-1:], roles=row.roles[:-1]),
                "row not in bank": dataclasses.replace(row, id="another")}.get(case, row)
    ledger = _ledger_run(tmp_path, [records["rollout", "bf16"]], CAUSAL, _bank(tmp_path, bank_row))
    argv = ["rollouts", "export", str(ledger), "--out", str(tmp_path / "d.jsonl")]
    assert main(argv + (["--precision", "fp16"] if case == "no such cell" else [])) == 4
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d.jsonl").exists()
