"""The edge sweep's premise gate on hand-built records (gates.sweep_premise): at every point, each arm's engine
counters against what the construction it names implies; tests/llamacpp/test_sweep.py runs it on llama.cpp."""

from __future__ import annotations

import pytest
from test_report import comparison, record

from replaytests.families.registry import FAMILIES
from replaytests.inputs.contract import load_contract
from replaytests.outputs.records import Record

SWEEP = FAMILIES["sweep"]
CHUNK = 32


def exactly(**counts: int) -> dict[str, list[int]]:
    """As engine/llamacpp/sweep.exactly writes a construction's counts: each one the premise's bounds, exactly."""
    return {name: [count, count] for name, count in counts.items()}


def _served(value: int, edge_steps: int | None = None, hit_evaluated: int = 1) -> dict:
    """A point's counters as llama.cpp's sweep records them: one call for the reference, a call per chunk for the
    edge (`edge_steps` what the engine counted, else what the chunk implies)."""
    implied = -(-value // CHUNK)
    return {"reference": {"prefill_steps": 1, "evaluated": value, "cached_tokens": 0,
                          "premise": exactly(prefill_steps=1, evaluated=value, cached_tokens=0)},
            "edge": {"prefill_steps": implied if edge_steps is None else edge_steps, "evaluated": value,
                     "cached_tokens": 0,
                     "premise": exactly(prefill_steps=implied, evaluated=value, cached_tokens=0)},
            "edge_replica": {"prefill_steps": 1, "evaluated": hit_evaluated, "cached_tokens": value - hit_evaluated,
                             "premise": exactly(prefill_steps=1, evaluated=1, cached_tokens=value - 1)}}


def _record(points: list[tuple[int, dict | None]]) -> Record:
    comparisons = {f"{a}~{b}": comparison() for a, b in SWEEP.pairs}
    fields = record("sweep", "tiny-001", "fp32", comparisons)
    sweep = [{"axis": "position", "value": value, "edge": f"runtime.llamacpp.chunk {CHUNK} x1", "tokens": value,
              "arms": fields["arms"], "comparisons": comparisons, **({"served": served} if served else {})}
             for value, served in points]
    return Record.of(fields | {"sweep": sweep})


@pytest.fixture(scope="module")
def gates(repo):
    return load_contract(repo / "contracts" / "cpu-tiny-llamacpp.yaml").gates


@pytest.mark.parametrize(("points", "outcome", "says"), [
    pytest.param([(31, _served(31)), (33, _served(33)), (65, _served(65))], "pass", "", id="as-implied"),
    pytest.param([(31, None), (65, None)], "pass", "", id="no-counters"),
    pytest.param([(31, _served(31)), (65, _served(65, edge_steps=1))], "recorded",
                 "at position 65 (runtime.llamacpp.chunk 32 x1): edge counted prefill_steps 1, the point needs 3",
                 id="one-call-past-the-chunk"),
    pytest.param([(65, _served(65, edge_steps=65))], "recorded", "edge counted prefill_steps 65, the point needs 3",
                 id="per-token"),
    pytest.param([(65, _served(65, hit_evaluated=65))], "recorded",
                 "edge_replica counted evaluated 65, the point needs 1; at position 65 (runtime.llamacpp.chunk 32 x1): "
                 "edge_replica counted cached_tokens 0, the point needs 64", id="hit-read-nothing"),
    pytest.param([], "fail", "no sweep point", id="no-point"),
])
def test_an_arm_counts_only_where_the_engine_counted_its_construction(gates, points, outcome, says):
    judgement = gates.sweep_premise(_record(points))
    assert judgement.outcome == outcome, judgement
    assert says in judgement.message, judgement.message
