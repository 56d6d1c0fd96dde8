"""The rollout families on llama.cpp (docs/llamacpp.md, "Rollouts"), on the embedded tiny model converted to a
bf16 GGUF by llama.cpp's converter (its weights bit for bit), the tiny causal bank and
contracts/cpu-tiny-llamacpp.yaml: the arms' definitions, the teacher-forcing control seen passing and failing,
both families as a user runs them, and one cross-runtime row end to end (a llama.cpp rollout exported as a
dump and recomputed by transformers on the checkpoint the GGUF holds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if os.environ.get("REPLAYTESTS_REQUIRE_LLAMACPP") != "1":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (bash tools/install-llamacpp.sh)")

from llamacpp_premise import vocab_mismatches, weight_mismatches

from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.engine.rollout import SUITE_LOGPROBS, row_seed
from replaytests.families import rollout as rollout_family

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "models" / "tiny-qwen2"
CONTRACT = REPO / "contracts" / "cpu-tiny-llamacpp.yaml"
BANK = REPO / "fixtures" / "banks" / "tiny-causal.jsonl"
LENGTH = 32  # the contract's rollout.length (its default)
ACCEPT = ("--accept-changed", "model", "--accept-changed", "tokenizer")  # the bank was frozen on the checkpoint


def test_a_live_step_is_the_suites_log_softmax_of_llamacpps_logits(runtime, rows):
    """The definition, from the outside: the first response token is the first maximal id of the logits one
    call over z gives, and its log-probability is their FP32 log-softmax at that id, bit for bit."""
    z = rows[0].tokens
    live = runtime.rollout(z, LENGTH, None)
    logits = runtime.probe(z)
    assert logits.dtype == torch.float32 and logits.numel() == runtime.model.n_vocab, (logits.dtype, logits.shape)
    assert live.tokens[0] == int(logits.argmax()), (live.tokens[0], int(logits.argmax()))
    assert live.logprobs[0] == float(torch.log_softmax(logits, dim=-1)[live.tokens[0]]), live.logprobs[0]
    assert live.logprobs_mode == SUITE_LOGPROBS and len(live.tokens) == len(live.logprobs) == LENGTH


def test_the_recompute_is_one_call_with_every_token_an_output(runtime, rows):
    """prefill is one llama_decode call over z + response (llama.cpp's own count of calls and evaluated tokens),
    and the end state holds every token of both."""
    z = rows[0].tokens
    response = runtime.rollout(z, LENGTH, None).tokens
    calls = runtime.context.calls
    prefill = runtime.replay("prefill", z, response)
    assert runtime.context.calls - calls == 1, f"the recompute made {runtime.context.calls - calls} calls"
    saved = prefill.end.state
    assert (saved.prefill_steps, saved.evaluated, saved.length) == (1, len(z) + LENGTH, len(z) + LENGTH), saved
    assert prefill.end.tokens == z + response and prefill.tokens == response


def test_a_sampled_rollout_is_drawn_again_from_its_seed(runtime, rows, contract):
    """The per-row seed reproduces the tokens (a fresh context too); another seed draws others."""
    z, seed = rows[0].tokens, row_seed(contract.settings["rollout"]["seed"], rows[0].id)
    first, again = runtime.rollout(z, LENGTH, seed), runtime.rollout(z, LENGTH, seed, "live_replica")
    assert (first.tokens, first.logprobs) == (again.tokens, again.logprobs), "the same seed drew another rollout"
    others = [runtime.rollout(z, LENGTH, seed + k).tokens for k in (1, 2)]
    assert any(tokens != first.tokens for tokens in others), "three seeds drew one rollout: the seed is not used"


def test_teacher_forcing_fed_a_wrong_token_is_found(runtime, rows, contract, monkeypatch):
    """Must-fail control of live~incremental: clean, the replay on the live schedule is the live rollout bit for
    bit (the premise); with one response token corrupted on its way into the replay (a detokenize-retokenize
    slip), the log-probabilities after it must differ and the record must say so."""
    row = rows[0]
    clean = rollout_family.run(runtime, row, contract.settings["rollout"])
    assert clean.ok and clean.comparisons["live~incremental"].logprobs_exact, \
        f"premise: clean teacher forcing is not bit-exact here ({clean.comparisons['live~incremental']})"
    feed = Runtime.feed

    def corrupted(self, context, tokens, step):
        if step == "incremental response token 3":
            tokens = [(tokens[0] + 1) % self.model.n_vocab]
        return feed(self, context, tokens, step)

    monkeypatch.setattr(Runtime, "feed", corrupted)
    faulty = rollout_family.run(runtime, row, contract.settings["rollout"])
    assert faulty.ok, faulty.reason
    found = faulty.comparisons["live~incremental"]
    assert not found.logprobs_exact and not found.cache_exact, f"a corrupted replay passed as live: {found}"
    assert found.logprob_tokens_equal >= 4, f"tokens before the fault changed too: {found}"
    assert faulty.comparisons["live~prefill"].logprobs_exact == clean.comparisons["live~prefill"].logprobs_exact


@pytest.fixture(scope="module")
def rollout_run(gguf, tmp_path_factory):
    """Two rows, both rollout families, as a user runs them."""
    root = tmp_path_factory.mktemp("rollout")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-q", "--backend", "llamacpp", "--model", str(gguf), "--bank", str(BANK), "--contract",
         str(CONTRACT), "--precision", "fp32", "--rows", "2", "-k", "rollout", *ACCEPT, "--report-dir", str(root),
         "--run-name", "tiny"], cwd=root, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, f"the llama.cpp rollout run failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    return root / "tiny"


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]


def test_both_rollout_families_record_their_measures(rollout_run, contract):
    records = _records(rollout_run)
    assert sorted((r["family"], r["row"]) for r in records) == sorted(
        (f, r) for f in ("rollout", "rollout_sampled") for r in ("tiny-000", "tiny-001")), records
    for record in records:
        assert record["status"] == "ok", record.get("reason")
        spec = record["rollout"]
        sampled = record["family"] == "rollout_sampled"
        seed = contract.settings["rollout"]["seed"]
        assert spec["seed"] == (row_seed(seed, record["row"]) if sampled else None), spec
        assert {arm["logprobs_mode"] for arm in record["arms"].values()} == {SUITE_LOGPROBS}, record["arms"].keys()
        assert all(len(arm["logprobs"]) == len(arm["suffix"]) == LENGTH for arm in record["arms"].values())
        for pair, measures in record["comparisons"].items():
            assert measures["logprob_tokens"] == LENGTH and measures["k3"] is not None, (record["row"], pair, measures)
            assert measures["abs_dlogp_max"] is not None and measures["outside_bounds"] is not None, (pair, measures)


def test_teacher_forcing_and_the_replicas_are_the_live_rollout_bit_for_bit(rollout_run):
    """The control of every record: teacher forcing on the live schedule and each replica reproduce the live
    log-probabilities exactly (what the recompute shows beside it is data, printed)."""
    for record in _records(rollout_run):
        comparisons = record["comparisons"]
        for pair in ("live~incremental", "live~live_replica", "incremental~incremental_replica",
                     "prefill~prefill_replica"):
            assert comparisons[pair]["logprobs_exact"], (record["family"], record["row"], pair, comparisons[pair])
        shown = comparisons["live~prefill"]
        print(f"{record['family']} {record['row']} live~prefill: {shown['logprob_tokens_equal']}/"
              f"{shown['logprob_tokens']} equal, max |d| {shown['abs_dlogp_max']}")


def test_a_llamacpp_rollout_is_recomputed_on_transformers(rollout_run, gguf, tmp_path):
    """The cross-runtime row end to end: the run's live rollouts exported as a dump and recomputed by
    transformers (fp32) on the checkpoint the GGUF was converted from. Premise: the checkpoint has the GGUF's
    token ids and weights; then the report carries every row's measures."""
    size, tokens = vocab_mismatches(gguf, TINY)
    assert size == 269 and not tokens, f"token ids differ from the GGUF's: {tokens[:5]}"
    count, weights = weight_mismatches(gguf, TINY)
    assert count == 50 and not weights, f"GGUF tensors the checkpoint does not hold: {weights[:5]}"
    dump, out = tmp_path / "dump.jsonl", tmp_path / "check"
    cli = [sys.executable, "-m", "replaytests.cli", "rollouts"]
    exported = subprocess.run([*cli, "export", str(rollout_run / "ledger.jsonl"), "--out", str(dump)],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    lines = [json.loads(line) for line in dump.read_text().splitlines()]
    live = {f"{r['row']}/{r['family']}/fp32": r["arms"]["live"] for r in _records(rollout_run)}
    assert {line["id"]: (line["response_ids"], line["logprobs"]) for line in lines} == {
        key: (arm["suffix"], arm["logprobs"]) for key, arm in live.items()}, "the dump is not the live rollouts"
    checked = subprocess.run([*cli, "check", str(dump), "--model", str(TINY), "--contract",
                              str(REPO / "contracts" / "cpu-tiny.yaml"), "--precision", "fp32", "--out", str(out)],
                             capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    report = json.loads((out / "rollouts.json").read_text())
    assert report["precision"] == "fp32" and len(report["rows"]) == len(lines) == 4, report.get("rows")
    for row in report["rows"]:
        assert row["tokens"] == LENGTH and row["k3"] is not None and row["abs_delta_max"] is not None, row
    print(f"llama.cpp (bf16 GGUF) -> transformers fp32: {report['run']}")
