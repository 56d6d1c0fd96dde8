"""The serving family's judging and the vLLM backend's refusals, without vLLM: a prefix hit is evidence
only where the engine's counter shows it reused a live-decoded block, a chunked prefill only where the
scheduler split it, and a fresh prefill must read nothing from the cache (tests/vllm/ runs the engine)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
import torch
from test_report import comparison, record

from replaytests.engine.vllm import runtime as vllm_runtime
from replaytests.engine.vllm.runtime import INSTALL, Runtime, _prefill_steps, cpu_kernels, gemm_of
from replaytests.errors import ConfigError
from replaytests.families.registry import FAMILIES
from replaytests.families.serving import prefix_hit
from replaytests.inputs.contract import load_contract
from replaytests.outputs.records import Record

SERVING = FAMILIES["serving"]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _record(hit_cached=96, prompt_block=64, chunked_steps=4, fresh_cached=0, row="tiny-001") -> Record:
    served = dict.fromkeys(SERVING.arms)
    for arm in SERVING.arms:
        served[arm] = {"cached_tokens": fresh_cached, "prompt_block_tokens": prompt_block, "prefill_steps": 1,
                       "steps_digest": "d"}
    served["live"]["cached_tokens"] = 0
    served["prefix_hit"]["cached_tokens"] = hit_cached
    served["chunked"]["prefill_steps"] = chunked_steps
    fields = record("serving", row, "bf16", {f"{a}~{b}": comparison() for a, b in SERVING.pairs})
    for arm, values in served.items():
        fields["arms"][arm]["served"] = values
    return Record.of(fields | {"prefix_hit": prefix_hit(served["prefix_hit"])})


@pytest.fixture(scope="module")
def gates(repo):
    return load_contract(repo / "contracts" / "cpu-tiny-vllm.yaml").gates


@pytest.mark.parametrize(("served_record", "pair", "outcome", "says"), [
    pytest.param(_record(), "live~prefix_hit", "pass", "", id="hit-covers-a-decoded-block"),
    pytest.param(_record(hit_cached=64), "live~prefix_hit", "recorded", "vacuous prefix hit",
                 id="hit-prompt-blocks-only"),
    pytest.param(_record(hit_cached=0, prompt_block=0), "live~prefix_hit", "recorded", "reused 0 tokens",
                 id="no-hit"),
    pytest.param(_record(chunked_steps=1), "prefill~chunked", "recorded", "vacuous chunked prefill",
                 id="prefill-in-one-step"),
    pytest.param(_record(chunked_steps=None), "prefill~chunked", "recorded", "unobserved", id="steps-unobserved"),
    pytest.param(_record(), "prefill~chunked", "pass", "", id="chunked-in-four-steps"),
    pytest.param(_record(fresh_cached=32), "prefill~batched", "fail", "read tokens from it", id="stale-cache"),
    pytest.param(_record(fresh_cached=32), "live~prefill", "fail", "'prefill': 32", id="stale-fresh-prefill"),
])
def test_a_serving_pair_counts_only_where_its_premise_held(gates, served_record, pair, outcome, says):
    judgement = gates.served(served_record, pair)
    assert judgement.outcome == outcome, f"{pair}: {judgement}"
    assert says in judgement.message, judgement.message


def test_a_hit_is_vacuous_exactly_up_to_the_prompt_blocks_full_blocks():
    """`covers_decode` as the family records it: one token past the prompt block's full blocks counts."""
    assert prefix_hit({"cached_tokens": 65, "prompt_block_tokens": 64})["covers_decode"]
    assert not prefix_hit({"cached_tokens": 64, "prompt_block_tokens": 64})["covers_decode"]


@pytest.mark.parametrize(("steps", "uncached", "expected"), [
    ([123, 1, 1], 123, 1), ([32, 32, 32, 27, 1, 1], 123, 4), ([1, 1], 0, 0), ([], 10, None)],
    ids=["one-step", "four-chunks", "all-cached", "unobserved"])
def test_prefill_steps_count_the_steps_that_computed_the_prompt(steps, uncached, expected):
    assert _prefill_steps(steps, uncached) == expected


def _contract(tmp_path, repo, body: str):
    path = tmp_path / "c.yaml"
    path.write_text(f"extends: {repo / 'contracts' / 'cpu-tiny-vllm.yaml'}\nname: c\n{body}")
    return load_contract(path)


@pytest.mark.parametrize(("body", "says"), [
    pytest.param("protocol: {visibility: roles}\n", "vLLM attends causally", id="roles-visibility"),
    pytest.param("runtime: {vllm: {block_size: 48}}\n", "runtime.vllm.block_size: expected a multiple of 32",
                 id="block-size"),
])
def test_the_vllm_backend_refuses_what_it_cannot_run_in_one_line(tmp_path, repo, body, says):
    contract = _contract(tmp_path, repo, body)
    with pytest.raises(ConfigError, match=re.escape(says)) as caught:
        Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", contract, "fp32", "cpu")
    assert "\n" not in str(caught.value)


def test_a_chunk_budget_below_the_sequences_is_refused(tmp_path, repo):
    with pytest.raises(ConfigError, match=r"runtime\.vllm\.chunk_budget: expected at least max_num_seqs"):
        _contract(tmp_path, repo, "runtime: {vllm: {chunk_budget: 2, max_num_seqs: 4}}\n")


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here")
def test_without_vllm_the_backend_names_the_install_command(repo, monkeypatch):
    contract = load_contract(repo / "contracts" / "cpu-tiny-vllm.yaml")
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the backend sets vLLM's variables before the import
    with pytest.raises(ConfigError, match="cannot import vllm") as caught:
        Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", contract, "fp32", "cpu")
    assert INSTALL in str(caught.value) and "\n" not in str(caught.value)


AMX_CPU = {"avx2", "fma", "avx512f", "amx_tile"}


@pytest.mark.parametrize(("flags", "aten", "onednn", "expected"), [
    pytest.param(AMX_CPU, None, None, "AMX", id="amx-unpinned"),
    pytest.param(AMX_CPU, "avx2", "AVX2", "below AVX512", id="amx-pinned-avx2"),
    pytest.param(AMX_CPU, "avx512", "AVX512_CORE", "AVX512", id="amx-pinned-avx512"),
    pytest.param(AMX_CPU, None, "AVX512_CORE_AMX", "AMX", id="amx-onednn-amx"),
    pytest.param({"avx2", "fma", "avx512f"}, None, None, "AVX512", id="avx512-unpinned"),
    pytest.param({"avx2", "fma"}, None, None, "below AVX512", id="avx2-unpinned"),
])
def test_vllm_kernels_follow_the_pin_not_the_hardware(monkeypatch, flags, aten, onednn, expected):
    """vLLM asks torch what the CPU has; under a pin below AMX its AMX GEMMs abort in torch's capped
    oneDNN, so the backend answers for the pinned level (runtime.cpu_kernels, recorded in the platform)."""
    for name, value in (("ATEN_CPU_CAPABILITY", aten), ("ONEDNN_MAX_CPU_ISA", onednn)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert cpu_kernels(flags) == expected, f"flags {sorted(flags)}, ATEN {aten}, oneDNN {onednn}"


class _Ops:  # the names vLLM's dispatch calls in each layer's cpu_linear
    onednn_mm = weight_packed_linear_cpu = staticmethod(lambda *a: None)


@pytest.mark.parametrize(("cpu_linear", "expected"), [
    pytest.param(lambda x, weight, bias: _Ops.onednn_mm(None, x, bias), "oneDNN", id="onednn"),
    pytest.param(lambda x, weight, bias: _Ops.weight_packed_linear_cpu(x, weight, 8, bias), "sgl-kernel", id="sgl"),
    pytest.param(lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias), "torch", id="fallback"),
    pytest.param(torch.nn.functional.linear, "torch", id="meta-layer"),
    pytest.param(lambda x, weight, bias: x, "unknown", id="unknown"),
])
def test_gemm_of_reads_the_dispatched_function(cpu_linear, expected):
    assert gemm_of(cpu_linear) == expected


class _Engine:
    def __init__(self, gemms):
        self.gemms = gemms

    def apply_model(self, func):
        layers = [torch.nn.Module() for _ in self.gemms]
        for layer, gemm in zip(layers, self.gemms, strict=True):
            layer.cpu_linear = {"oneDNN": lambda x, weight, bias: _Ops.onednn_mm(None, x, bias),
                                "sgl-kernel": lambda x, weight, bias: _Ops.weight_packed_linear_cpu(x, weight, 8, bias),
                                "torch": torch.nn.functional.linear}[gemm]
        return [func(torch.nn.Sequential(*layers))]


@pytest.mark.parametrize(("recorded", "engine", "refused"), [
    pytest.param("torch", ["torch", "torch"], False, id="as-recorded"),
    pytest.param("oneDNN", ["oneDNN", "sgl-kernel"], False, id="small-weights-aside"),
    pytest.param("torch", ["oneDNN"], True, id="other-gemm"),
    pytest.param("oneDNN", ["oneDNN", "torch"], True, id="mixed"),
    pytest.param("oneDNN", [], True, id="no-linear-layer"),
])
def test_the_engine_runs_the_gemm_the_platform_records(monkeypatch, recorded, engine, refused):
    """runtime.vllm.linear is predicted in the process that writes run.json; each engine is checked against
    it, so a platform never names a GEMM its records did not run on."""
    monkeypatch.setattr(vllm_runtime, "dense_gemm", lambda dtype: recorded)
    runtime = Runtime.__new__(Runtime)
    runtime.engine, runtime.dtype, runtime.cell = _Engine(engine), "bfloat16", "bf16"
    runtime.contract = load_contract(Path(__file__).parents[2] / "contracts" / "cpu-tiny-vllm.yaml")
    if refused:
        with pytest.raises(ConfigError, match=r"runtime\.vllm\.linear"):
            runtime._check_gemms()
    else:
        runtime._check_gemms()


INF = float("-inf")
STEPS = (((7, 2.0), (3, 1.5)), ((4, 1.0), (9, INF)), ((5, 3.0), (6, 0.0)))


@pytest.mark.parametrize(("b", "divergence", "expected"), [
    pytest.param(STEPS, None, {"steps_first_difference": None, "steps_max_abs": 0.0}, id="bitwise-equal"),
    pytest.param((STEPS[0], ((4, 1.25), (9, INF)), STEPS[2]), None,
                 {"steps_first_difference": 1, "steps_max_abs": 0.25}, id="one-logit-moved"),
    pytest.param((STEPS[0], ((9, 1.0), (4, 0.5)), ((1, 99.0), (2, -99.0))), 1,
                 {"steps_first_difference": 1, "steps_max_abs": 0.5}, id="only-up-to-the-split"),
    pytest.param((((3, 1.5), (7, 2.0)), *STEPS[1:]), None,
                 {"steps_first_difference": 0, "steps_max_abs": 0.0}, id="same-values-other-order"),
    pytest.param(STEPS[:2], 2, {"steps_first_difference": None, "steps_max_abs": 0.0}, id="one-stopped-first"),
])
def test_suffix_steps_are_compared_up_to_where_the_tokens_split(b, divergence, expected):
    from replaytests.families.serving import compare_steps

    assert compare_steps(STEPS, b, divergence) == expected, f"steps {STEPS} vs {b}, divergence {divergence}"



def test_the_premise_counts_what_the_engine_counted():
    """outputs.serving.premise over hand-built records: a vacuous hit, a chunked prefill in one step and a
    fresh request that read the cache are each counted where they happened, not averaged away."""
    from replaytests.outputs.serving import premise

    records = [_record(row="r0"), _record(hit_cached=64, row="r1"), _record(chunked_steps=1, row="r2"),
               _record(fresh_cached=32, row="r3")]
    found = premise(records)["bf16"]
    assert (found["hit_covers_decode"].k, found["hit_covers_decode"].n) == (3, 4), found
    assert found["hit_cached_tokens"] == {"n": 4, "median": 96, "min": 64, "max": 96}, found
    assert found["hit_past_prompt_block"]["min"] == 0 and found["hit_past_prompt_block"]["max"] == 32, found
    assert (found["chunked_split"].k, found["chunked_split"].n) == (3, 4), found
    assert found["fresh_read_cache"] == ["r3"], found
