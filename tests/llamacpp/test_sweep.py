"""The edge sweep on llama.cpp (docs/llamacpp.md, "Edge sweep"; engine/llamacpp/sweep.py): the prefix's length
around runtime.llamacpp.chunk, one call against calls of the chunk (position) and a fresh chunked prefix against a
prompt-cache hit (prefix_hit). On the embedded tiny model (bf16 GGUF, chunk 32) and on SmolLM2's Q4_1 GGUF (chunk
64): llama.cpp's own counters prove each arm is the construction it names, each pass leaves the state a fresh
construction leaves, and the sweep is seen failing where a fault is real (flash attention on; an arm that made one
call past the chunk; a point past the context).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("REPLAYTESTS_REQUIRE_LLAMACPP") != "1":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (bash tools/install-llamacpp.sh)")

from replaytests.engine.llamacpp import sweep as llamacpp_sweep
from replaytests.engine.llamacpp.context import Context
from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.families import sweep
from replaytests.families.registry import SWEEP_HEADLINE
from replaytests.inputs.bank import read_bank
from replaytests.inputs.contract import load_contract
from replaytests.inputs.models import shipped_gguf

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"multiples": 1, "stride": 64, "continuation": 4}  # the first and last multiple of the chunk, 4 tokens
PAIRS = ("reference~reference_replica", "edge~edge_replica", SWEEP_HEADLINE)


def _swept(runtime, row):
    record = sweep.run(runtime, row, SETTINGS)
    assert record.ok, record.reason
    return record


def _points(record, axis: str) -> dict:
    return {point.value: point for point in record.sweep if point.axis == axis}


def _check_counters(record, row, chunk: int, n_ctx: int) -> None:
    """Every arm's counters are the construction it names: the reference one call of the whole prefix in one
    physical batch, the edge a call per chunk (the last ending at the point), each hit one token evaluated and every
    other token of the point read from the cache, the hit axis's references the position axis's edges."""
    position, hit = _points(record, "position"), _points(record, "prefix_hit")
    assert sorted(position) == sorted(hit) and max(position) == row.prefix_len, (sorted(position), sorted(hit))
    assert any(value > chunk for value in position), f"no point past the chunk of {chunk}: nothing crosses an edge"
    for value, point in position.items():
        for arm in ("reference", "reference_replica"):
            counted = point.served[arm]
            assert (counted["prefill_steps"], counted["evaluated"], counted["n_ubatch"]) \
                == (1, row.prefix_len, n_ctx), \
                (value, arm, counted)
        for arm in ("edge", "edge_replica"):
            counted = point.served[arm]
            assert (counted["prefill_steps"], counted["evaluated"], counted["cached_tokens"], counted["n_ubatch"]) \
                == (-(-value // chunk), value, 0, chunk), (value, arm, counted)
        for arm in ("edge", "edge_replica"):
            counted = hit[value].served[arm]
            assert (counted["prefill_steps"], counted["evaluated"], counted["cached_tokens"]) == (1, 1, value - 1), \
                (value, arm, counted)
        for reference, edge in (("reference", "edge"), ("reference_replica", "edge_replica")):
            assert hit[value].arms[reference] == point.arms[edge], (value, reference)
            assert dict(hit[value].served[reference]) == dict(point.served[edge]), (value, reference)


@pytest.fixture(scope="module")
def tiny_records(runtime, rows):
    return [_swept(runtime, row) for row in rows[:2]]


@pytest.mark.parametrize("index", [0, 1])
def test_every_arm_is_the_construction_it_names(tiny_records, rows, contract, index):
    """The premise at every point, from llama.cpp's counters (and the gate that reads them), then the gates."""
    record, settings = tiny_records[index], contract.runtime("llamacpp")
    _check_counters(record, rows[index], settings["chunk"], settings["n_ctx"])
    gates = contract.gates
    assert gates.sweep_premise(record).outcome == "pass", gates.sweep_premise(record)
    for pair in PAIRS:
        judgement = gates.sweep_replicas(record, pair) if "replica" in pair else gates.sweep_divergence(record, pair)
        assert judgement.outcome == "pass", judgement
    assert sweep.other_tokens(record, rows[index]) is None


def test_each_pass_leaves_the_state_a_fresh_construction_leaves(runtime, rows, contract):
    """A pass serves every point (a state saved at each, the positions past it dropped): at each point its state and
    logits are, byte for byte, those of the construction built alone in a fresh context."""
    z, chunk = rows[0].tokens, contract.runtime("llamacpp")["chunk"]
    values = [value for value, _ in sweep.positions((("chunk", chunk),), len(z), SETTINGS["multiples"])]
    passes = {"one call": llamacpp_sweep.one_call(runtime, z, values, "reference"),
              "chunked": llamacpp_sweep.chunked(runtime, z, values, "edge"),
              "hit": llamacpp_sweep.hits(runtime, z, values, "edge")}
    for value in values:
        fresh = {}
        context = runtime._context(chunk)  # the point's prefix in calls of the chunk (Context.feed splits it)
        fresh["chunked"] = (runtime.feed(context, z[:value], "chunked").numpy(), context.save())
        context.clear()  # an earlier request over the whole prefix, then the point's prefix on its cache
        runtime.feed(context, z, "earlier request")
        context.truncate(value - 1)
        fresh["hit"] = (runtime.feed(context, z[value - 1:value], "hit").numpy(), context.save())
        context.close()
        context = runtime._context(runtime.settings["n_ctx"])  # the whole prefix in one call, cut at the point
        runtime.feed(context, z, "one call")
        context.truncate(value)
        fresh["one call"] = (None, context.save())
        context.close()
        for name, (logits, state) in fresh.items():
            built = passes[name][value]
            assert built.state == state, f"{name} at {value}: the pass's state is not the fresh construction's"
            assert logits is None or (built.logits == logits).all(), f"{name} at {value}: logits differ"


def test_an_arm_that_made_one_call_past_the_chunk_is_vacuous(runtime, rows, contract, monkeypatch):
    """Must-fail control of the premise: with every context evaluating up to n_ctx tokens per call (the chunk
    ignored), the chunked arms make one call where the point is past the chunk: the gate reports exactly those
    points as vacuous (the position axis's edges and the hit axis's references), never as a pass."""
    chunk = contract.runtime("llamacpp")["chunk"]
    made = Runtime._context
    monkeypatch.setattr(Runtime, "_context", lambda self, n_batch, sequences=1: made(self, self.settings["n_ctx"],
                                                                                     sequences))
    record = _swept(runtime, rows[0])
    judgement = contract.gates.sweep_premise(record)
    assert judgement.outcome == "recorded", judgement
    position = _points(record, "position")
    for value, point in position.items():
        for axis, arm in (("position", "edge"), ("position", "edge_replica"), ("prefix_hit", "reference"),
                          ("prefix_hit", "reference_replica")):
            said = (f"at {axis} {value} ({point.edge or 'the whole prefix'}): {arm} counted prefill_steps 1, the point "
                    f"needs {-(-value // chunk)}")
            assert (said in judgement.message) == (value > chunk), (said, judgement.message)


@pytest.fixture(scope="module")
def flash(gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("fa") / "fa.yaml"
    path.write_text(f"extends: {REPO / 'contracts' / 'cpu-tiny-llamacpp.yaml'}\nname: tiny-llamacpp-fa\n"
                    "runtime: {llamacpp: {flash_attention: true}}\n")
    contract = load_contract(path)
    return contract, Runtime.load(gguf, contract, "fp32")


def test_flash_attention_is_found_at_every_position_point(flash, rows):
    """Must-fail control of the comparisons: with flash attention on, ggml's CPU kernel takes a tiled path for a
    call of 64 or more query rows, so the whole prefix in one call (123+ rows) and calls of 32 differ at every
    position point, boundary logits and K/V; a hit re-evaluates one token on calls of 32, the same kernel as the
    fresh chunked prefix, and agrees at every point. A continuation that splits is a failure of the fp32 gate."""
    contract, runtime = flash
    failed = []
    for row in rows[:4]:
        record = _swept(runtime, row)
        assert contract.gates.sweep_premise(record).outcome == "pass"
        for value, point in _points(record, "position").items():
            metrics = point.comparisons[SWEEP_HEADLINE]
            assert not metrics.logits_exact and not metrics.cache_exact, (row.id, value, metrics)
        for value, point in _points(record, "prefix_hit").items():
            metrics = point.comparisons[SWEEP_HEADLINE]
            assert metrics.logits_exact and metrics.cache_exact and metrics.suffix_equal, (row.id, value, metrics)
        judgement = contract.gates.sweep_divergence(record, SWEEP_HEADLINE)
        split = [v for v, p in _points(record, "position").items() if not p.comparisons[SWEEP_HEADLINE].suffix_equal]
        assert (judgement.outcome == "fail") == bool(split), (row.id, judgement)
        failed += [(row.id, value) for value in split if f"at position {value} " in judgement.message]
    assert failed, "no continuation split under flash attention in the first 4 rows: the gate was never seen failing"


def test_a_point_past_the_context_is_refused_before_any_call(runtime, rows, contract, monkeypatch):
    """A point whose prefix and continuation do not fit runtime.llamacpp.n_ctx: the row fails closed in one line
    naming the field, before llama.cpp is asked for anything."""
    def refuse(*args, **kwargs):
        raise AssertionError("llama_decode called")

    monkeypatch.setattr(Context, "_decode", refuse)
    record = sweep.run(runtime, rows[0], SETTINGS | {"continuation": contract.runtime("llamacpp")["n_ctx"]})
    assert not record.ok and "runtime.llamacpp.n_ctx" in record.reason and "\n" not in record.reason, record.reason


@pytest.fixture(scope="module")
def smollm2():
    contract = load_contract(REPO / "contracts" / "cpu-smollm2-llamacpp.yaml")
    runtime = Runtime.load(shipped_gguf("smollm2"), contract, "fp32")
    rows = read_bank(REPO / "fixtures" / "banks" / "smollm2-causal.jsonl", runtime.grammar, 8192,
                     contract.caps.suffix_room())
    return contract, runtime, rows[0]


def test_smollm2_row_0(smollm2):
    """SmolLM2's Q4_1 GGUF, row 0 (138 tokens, chunk 64: points 63-65, 127-129, 138): the premise at every point,
    then the gates (replicas bit-exact, no continuation split: the fp32 cell may not diverge)."""
    contract, runtime, row = smollm2
    record = _swept(runtime, row)
    _check_counters(record, row, contract.runtime("llamacpp")["chunk"], contract.runtime("llamacpp")["n_ctx"])
    assert contract.gates.sweep_premise(record).outcome == "pass"
    for pair in PAIRS:
        judgement = (contract.gates.sweep_replicas(record, pair) if "replica" in pair
                     else contract.gates.sweep_divergence(record, pair))
        assert judgement.outcome == "pass", judgement
