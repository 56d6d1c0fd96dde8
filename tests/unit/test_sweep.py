"""The edge sweep's points and its gates, on the ledger format alone (no model)."""

from __future__ import annotations

import dataclasses

import pytest

from replaytests.engine.backend import Axis
from replaytests.families.sweep import points, positions
from replaytests.inputs.contract import default_gates

SETTINGS = {"multiples": 2, "stride": 64, "continuation": 8}


@pytest.mark.parametrize(("edges", "length", "expected"), [
    pytest.param((("f", 64),), 300, [63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300], id="stride-64"),
    pytest.param((("f", 8),), 130, [7, 8, 9, 15, 16, 17, 119, 120, 121, 127, 128, 129, 130], id="residual-8"),
    pytest.param((("f", 64),), 64, [63, 64], id="prefix-on-the-edge"),
    pytest.param((("f", 64),), 65, [63, 64, 65], id="prefix-one-past"),
    pytest.param((("f", 64),), 40, [40], id="prefix-shorter-than-the-edge"),
    pytest.param((("a", 4), ("b", 6)), 13, [3, 4, 5, 6, 7, 8, 9, 11, 12, 13], id="two-edges"),
])
def test_position_points_sit_around_the_first_and_last_multiples(edges, length, expected):
    found = positions(edges, length, 2)
    assert [value for value, _ in found] == expected, f"points {found}"
    assert found[-1][0] == length, "the whole prefix is always a point"


def test_a_point_names_the_edge_it_sits_beside():
    found = dict(positions((("runtime.vllm.block_size", 32),), 100, 1))
    assert found[31] == "runtime.vllm.block_size 32 x1 - 1"
    assert found[96] == "runtime.vllm.block_size 32 x3"
    assert found[97] == "runtime.vllm.block_size 32 x3 + 1"
    assert found[100] is None, "the whole prefix, beside no edge"


def test_a_count_axis_takes_its_points_from_the_contract_on_the_whole_prefix():
    axis = Axis("batch", "alone", "beside others", values=(1, 17), field="sweep.batch_sizes")
    assert points(axis, 200, SETTINGS) == [(1, "sweep.batch_sizes 1", 200), (17, "sweep.batch_sizes 17", 200)]


class _Metrics:
    """The fields of a comparison the gates read."""

    def __init__(self, exact: bool) -> None:
        self.cache_exact = self.logits_exact = self.suffix_equal = exact
        self.steps_exact = self.logprobs_exact = None
        self.k_rel_l2 = self.k_max_abs = self.v_rel_l2 = self.v_max_abs = self.logits_max_abs = 0.5
        self.first_divergence, self.margins_at_divergence, self.answer_equal = 3, (0.1, None), False


@dataclasses.dataclass(frozen=True)
class _Point:
    axis: str
    value: int
    edge: str | None
    comparisons: dict
    served: dict | None = None


@dataclasses.dataclass(frozen=True)
class _Record:
    family: str
    precision: str
    sweep: tuple
    comparisons: dict = dataclasses.field(default_factory=dict)
    title: str = "sweep row tiny-000 (bf16)"


def _record(precision: str, *exact: bool) -> _Record:
    pairs = ("reference~reference_replica", "reference~edge")
    return _Record("sweep", precision, tuple(_Point("position", 63 + n, f"sweep.stride 64 x1 + {n}" if n else None,
                                                   dict.fromkeys(pairs, _Metrics(e))) for n, e in enumerate(exact)))


def test_the_gates_judge_every_point_and_name_the_points_that_fail():
    gates = default_gates()
    assert gates.sweep_replicas(_record("bf16", True, True), "reference~reference_replica").outcome == "pass"
    judged = gates.sweep_replicas(_record("bf16", True, False), "reference~reference_replica")
    assert judged.outcome == "fail" and "1 of 2 points" in judged.message and "position 64" in judged.message, judged
    assert "position 63" not in judged.message, judged


@pytest.mark.parametrize(("precision", "outcome"), [("fp32", "fail"), ("bf16", "recorded")])
def test_a_divergent_continuation_is_judged_by_the_cells_gate(precision, outcome, regated):
    gates = regated(default_gates(), "sweep", suffix_divergence_allowed={"bf16": True, "fp32": False})
    judged = gates.sweep_divergence(_record(precision, False), "reference~edge")
    assert judged.outcome == outcome, judged
    assert "forced" in judged.message, "a forced step's margin (None) is named, not formatted as a number"


def test_a_record_without_points_is_no_pass():
    judged = default_gates().sweep_replicas(_record("bf16"), "reference~reference_replica")
    assert judged.outcome == "fail" and "no sweep point" in judged.message, judged


@dataclasses.dataclass(frozen=True)
class _Served:
    axis: str
    value: int
    edge: str | None
    served: dict | None


@pytest.mark.parametrize(("served", "outcome", "says"), [
    pytest.param(None, "pass", "", id="no-counters"),
    pytest.param({"edge": {"cached_tokens": 96, "premise": {"cached_tokens": [65, None]}}}, "pass", "", id="hit"),
    pytest.param({"edge": {"cached_tokens": 32, "premise": {"cached_tokens": [65, None]}}}, "recorded",
                 "edge counted cached_tokens 32, the point needs at least 65", id="vacuous-hit"),
    pytest.param({"edge": {"calls": 1, "premise": {"calls": [3, 3]}}}, "recorded",
                 "edge counted calls 1, the point needs 3", id="one-call-past-the-chunk"),
    pytest.param({"reference": {"cached_tokens": 8, "requires": {"cached_tokens": [0, 0]}},
                  "edge": {"calls": 1, "premise": {"calls": [3, 3]}}}, "fail",
                 "reference counted cached_tokens 8, its construction requires 0", id="stale-read-fails-first"),
])
def test_the_premise_gate_reads_the_engines_counters_at_every_point(served, outcome, says):
    record = _Record("sweep", "bf16", (_Served("block_position", 97, "runtime.vllm.block_size 32 x3 + 1", served),))
    judged = default_gates().sweep_premise(record)
    assert judged.outcome == outcome and says in judged.message, judged
    if says:
        assert "at block_position 97 (runtime.vllm.block_size 32 x3 + 1)" in judged.message, judged
    assert default_gates().sweep_premise(_record("bf16")).outcome == "fail", "a record without points is no pass"


def test_a_vacuous_point_is_not_judged_for_divergence(regated):
    gates = regated(default_gates(), "sweep", suffix_divergence_allowed={"fp32": False})
    vacuous = {"edge": {"calls": 1, "premise": {"calls": [3, 3]}}}
    record = _record("fp32", False)
    only_vacuous = dataclasses.replace(record, sweep=(dataclasses.replace(record.sweep[0], served=vacuous),))
    judged = gates.sweep_divergence(only_vacuous, "reference~edge")
    assert judged.outcome == "recorded" and "no point's premise held" in judged.message, judged
    assert gates.sweep_divergence(record, "reference~edge").outcome == "fail", "the same point with its premise held"
