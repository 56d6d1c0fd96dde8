"""The edge sweep's premise on a serving engine, without vLLM: a point counts only where the engine's own counters
show it crossed its edge, a construction whose counters break what it requires fails, and the batch axis's
requests are drawn deterministically (tests/vllm/test_vllm_sweep.py runs the engine)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_report import comparison, record

from replaytests.engine.vllm import sweep as vllm_sweep
from replaytests.errors import ConfigError
from replaytests.families.registry import FAMILIES
from replaytests.inputs.contract import load_contract
from replaytests.outputs.records import Record

SWEEP = FAMILIES["sweep"]


def _point(axis="block_position", value=65, cached=64, requires=None, premise=None, edge_cached=None) -> dict:
    cold = {"cached_tokens": 0, "requires": {"cached_tokens": [0, 0]}, "premise": {}}
    hit = {"cached_tokens": cached if edge_cached is None else edge_cached, "requires": requires or {},
           "premise": premise if premise is not None else {"cached_tokens": 64}}
    served = {"reference": cold, "reference_replica": dict(cold), "edge": hit, "edge_replica": dict(hit)}
    return {"axis": axis, "value": value, "edge": "runtime.vllm.block_size 32 x2 + 1", "tokens": value,
            "arms": {arm: record("sweep", "r", "bf16", {"a~b": comparison()})["arms"]["a"] for arm in SWEEP.arms},
            "comparisons": {f"{a}~{b}": comparison() for a, b in SWEEP.pairs}, "served": served}


def _record(*points) -> Record:
    fields = record("sweep", "tiny-000", "bf16", {f"{a}~{b}": comparison() for a, b in SWEEP.pairs})
    return Record.of(fields | {"sweep": list(points)})


@pytest.fixture(scope="module")
def gates(repo):
    return load_contract(repo / "contracts" / "cpu-tiny-vllm.yaml").gates


def test_a_hit_the_engine_counted_passes(gates):
    assert gates.sweep_premise(_record(_point())).outcome == "pass"


def test_a_hit_the_engine_did_not_count_is_vacuous_with_its_numbers(gates):
    judgement = gates.sweep_premise(_record(_point(), _point(value=32, cached=0, premise={"cached_tokens": 1})))
    assert judgement.outcome == "recorded", judgement
    assert "at block_position 32" in judgement.message and "edge counted cached_tokens 0" in judgement.message
    assert "at block_position 65" not in judgement.message, judgement.message


def test_a_cold_request_that_read_the_cache_fails(gates):
    stale = _point()
    stale["served"]["reference_replica"]["cached_tokens"] = 32
    judgement = gates.sweep_premise(_record(stale))
    assert judgement.outcome == "fail" and "reference_replica counted cached_tokens 32" in judgement.message


def test_a_first_request_that_was_not_the_first_fails(gates):
    point = _point(axis="start", value=0, edge_cached=0, requires={"request_index": [0, 0]}, premise={})
    point["served"]["edge"]["request_index"] = 3
    judgement = gates.sweep_premise(_record(point))
    assert judgement.outcome == "fail" and "request_index 3, its construction requires 0" in judgement.message


def test_a_batch_not_scheduled_together_is_vacuous(gates):
    point = _point(axis="batch", value=7, edge_cached=0, premise={"co_scheduled": 8})
    point["served"]["edge"]["co_scheduled"] = 5
    judgement = gates.sweep_premise(_record(point))
    assert judgement.outcome == "recorded" and "co_scheduled 5, the point needs at least 8" in judgement.message


def test_a_point_without_counters_has_nothing_to_prove(gates):
    point = _point()
    del point["served"]
    assert gates.sweep_premise(_record(point)).outcome == "pass"


def _runtime_steps(steps):
    return SimpleNamespace(_steps=steps)


@pytest.mark.parametrize(("steps", "prompt", "cached", "forced", "expected"), [
    ([{"0-a": 123}, {"0-a": 1}], 123, 0, 0, {"schedule": [123], "prefill_steps": 1, "decoded": 0, "co_scheduled": 1}),
    ([{"0-a": 32}, {"0-a": 32}, {"0-a": 1}, {"0-a": 1}], 65, 0, 0,
     {"schedule": [32, 32, 1], "prefill_steps": 3, "decoded": 0, "co_scheduled": 1}),
    ([{"0-a": 1}, {"0-a": 1}], 65, 64, 0, {"schedule": [1], "prefill_steps": 1, "decoded": 0, "co_scheduled": 1}),
    ([{"0-a": 95}, {"0-a": 1}, {"0-a": 1}], 95, 0, 1,
     {"schedule": [95, 1], "prefill_steps": 1, "decoded": 1, "co_scheduled": 1}),
    ([{"1-b": 40, "0-a": 123, "2-c": 90}, {"0-a": 1, "1-b": 1, "2-c": 1}], 123, 0, 0,
     {"schedule": [123], "prefill_steps": 1, "decoded": 0, "co_scheduled": 3}),
], ids=["one-step", "three-chunks", "a-hit", "one-decoded", "a-batch-of-three"])
def test_the_counters_read_the_schedulers_own_plan(steps, prompt, cached, forced, expected):
    out = SimpleNamespace(request_id="0", num_cached_tokens=cached)
    counted = vllm_sweep._counted(_runtime_steps(steps), out, prompt, forced)
    assert {key: counted[key] for key in expected} == expected
    assert counted["cached_tokens"] == cached and counted["request_index"] == 0


def test_a_batch_is_drawn_from_the_other_rows_by_the_seed(tmp_path):
    bank = tmp_path / "bank.jsonl"
    bank.write_text("".join(json.dumps({"id": f"r{i}", "tokens": [i, i + 1], "roles": [0, 0]}) + "\n"
                            for i in range(6)))
    settings = {"bank": bank, "seed": 0}
    first, position = vllm_sweep._others(settings, [0, 1], 3)
    assert (first, position) == vllm_sweep._others(settings, [0, 1], 3), "not deterministic"
    assert len(first) == 3 and "r0" not in [row for row, _ in first] and 0 <= position <= 3
    more, _ = vllm_sweep._others(settings, [0, 1], 7)  # five other rows: they repeat
    assert len(more) == 7 and {row for row, _ in more} == {f"r{i}" for i in range(1, 6)}
    assert vllm_sweep._others(settings | {"seed": 1}, [0, 1], 3) != (first, position)


@pytest.mark.parametrize(("body", "says"), [
    ("sweep: {batch_sizes: [1, 64]}", "sweep.batch_sizes[1]: "),
    ("sweep: {batch_sizes: [0]}", "sweep.batch_sizes[0]: "),
])
def test_a_batch_beyond_the_engines_limit_is_one_line_before_any_model_work(tmp_path, repo, body, says):
    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {repo / 'contracts' / 'cpu-tiny-vllm.yaml'}\nname: t\n{body}\n")
    with pytest.raises(ConfigError) as caught:
        load_contract(path)
    assert says in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_an_empty_batch_axis_is_refused_when_the_backend_loads(tmp_path, repo):
    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {repo / 'contracts' / 'cpu-tiny-vllm.yaml'}\nname: t\nsweep: {{batch_sizes: []}}\n")
    with pytest.raises(ConfigError, match=r"sweep\.batch_sizes: the batch axis needs at least one"):
        vllm_sweep.check(load_contract(path))
