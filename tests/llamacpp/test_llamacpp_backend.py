"""The llama.cpp backend on the GGUF SmolLM2 ships as (Q4_1), on the causal SmolLM2 bank
(contracts/cpu-smollm2-llamacpp.yaml; docs/llamacpp.md).

Runs where llama-cpp-python is installed (`bash tools/install-llamacpp.sh`, then that venv's pytest:
`.ci/run` does so, with REPLAYTESTS_REQUIRE_LLAMACPP=1 so that a missing build fails instead of skipping).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

if os.environ.get("REPLAYTESTS_REQUIRE_LLAMACPP") != "1":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (bash tools/install-llamacpp.sh)")

from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.engine.llamacpp.state import StateCache, StateLayout
from replaytests.engine.protocol import prompt_of
from replaytests.errors import ConfigError, TransplantRefused
from replaytests.inputs.bank import read_bank
from replaytests.inputs.contract import load_contract
from replaytests.inputs.models import shipped_gguf

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "contracts" / "cpu-smollm2-llamacpp.yaml"
# The committed baseline of each build tools/install-llamacpp.sh makes (docs/llamacpp.md "Two builds"): a run is
# audited against its own build's, never another build's passed off as the drift of another CPU.
BASELINES = {"avx2": REPO / "fixtures" / "ledgers" / "llamacpp-smollm2",
             "user": REPO / "fixtures" / "ledgers" / "llamacpp-smollm2-user"}
BANK = REPO / "fixtures" / "banks" / "smollm2-causal.jsonl"
# The bank was frozen by the transformers backend on this GGUF dequantized (models prepare smollm2): the
# same token bank, another model file, so a llama.cpp run accepts the model and tokenizer digests it records.
ACCEPT = ("--accept-changed", "model", "--accept-changed", "tokenizer")


@pytest.fixture(scope="module")
def gguf() -> Path:
    return shipped_gguf("smollm2")


@pytest.fixture(scope="module")
def contract():
    return load_contract(CONTRACT)


@pytest.fixture(scope="module")
def runtime(gguf, contract) -> Runtime:
    return Runtime.load(gguf, contract, "fp32")


@pytest.fixture(scope="module")
def rows(runtime, contract):
    return read_bank(BANK, runtime.grammar, 8192, contract.caps.suffix_room())


@pytest.fixture(scope="module")
def z(rows) -> list[int]:
    return rows[0].tokens


def test_one_token_per_call_and_one_call_reach_the_boundary_the_run_records(runtime, z):
    """The crossing's premise on llama.cpp: both constructions evaluated every token of z (llama.cpp's own
    count), and what they reached is compared bit for bit: logits and the serialized K/V state."""
    incremental, prefill = runtime.build("incremental", z), runtime.build("prefill", z)
    assert incremental.state.evaluated == prefill.state.evaluated == len(z), \
        (incremental.state.evaluated, prefill.state.evaluated, len(z))
    assert incremental.tokens == prefill.tokens == z
    same_logits = bool((incremental.logits == prefill.logits).all())
    same_state = incremental.state.digest == prefill.state.digest
    # what llama.cpp does here is data: printed, and the state agrees with the logits it led to
    print(f"incremental vs prefill: logits equal {same_logits}, K/V state equal {same_state}")
    assert same_state <= same_logits, "equal K/V states gave different boundary logits"


def test_a_prompt_cache_hit_is_proven_by_llamacpps_count(runtime, z, contract):
    """A hit after the live request re-evaluates one token of the whole prefix: llama.cpp counted it."""
    live = runtime.live(prompt_of(z, runtime.grammar.delims))
    hit = runtime.build("prefix_hit", live.tokens)
    assert hit.state.evaluated == 1, f"the hit evaluated {hit.state.evaluated} of {len(live.tokens)} tokens"
    assert live.state.evaluated == len(live.tokens), (live.state.evaluated, len(live.tokens))
    print(f"hit vs live: logits equal {bool((hit.logits == live.logits).all())}, "
          f"K/V state equal {hit.state.digest == live.state.digest}")


def test_a_chunked_prefill_runs_in_chunks(runtime, z, contract):
    chunk = contract.runtime("llamacpp")["chunk"]
    assert len(z) > chunk, f"row of {len(z)} tokens: no chunking at {chunk}"
    chunked = runtime.build("chunked", z)
    assert chunked.state.evaluated == len(z)
    assert chunked.tokens == z


def test_a_saved_state_continues_as_it_was(runtime, z, rows):
    """The suffix decoder loads a boundary's saved state: decoding the same boundary twice (the second
    time after the context ran something else) gives the same suffix bit for bit."""
    boundary = runtime.build("prefill", z)
    first = runtime._decode_suffix(boundary)
    runtime.build("incremental", rows[1].tokens)
    again = runtime._decode_suffix(boundary)
    assert first == again, "the same saved state continued differently"


@pytest.mark.parametrize(("content", "message"), [
    pytest.param(b"", "not a GGUF file", id="empty"),
    pytest.param(b"PK\x03\x04 not a model", "not a GGUF file", id="zip"),
    pytest.param(None, "could not load this GGUF", id="truncated"),
])
def test_a_bad_gguf_is_one_line_before_any_test(content, message, gguf, contract, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(gguf.read_bytes()[: 1 << 20] if content is None else content)
    with pytest.raises(ConfigError, match=message) as caught:
        Runtime.inspect(bad, contract, "--model")
    assert str(bad) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("cell", "field"), [
    pytest.param("bf16", "dtype", id="bf16"),
])
def test_a_cell_llamacpp_would_not_run_in_its_format_is_refused(cell, field, gguf, contract):
    with pytest.raises(ConfigError, match=rf"cells\.{cell}\.{field}: llama.cpp's CPU backend computes"):
        Runtime.load(gguf, contract, cell)


def test_roles_visibility_is_refused(gguf):
    roles = load_contract(REPO / "contracts" / "cpu-smollm2.yaml")
    with pytest.raises(ConfigError, match="attends causally and takes no role masks"):
        Runtime.load(gguf, roles, "fp32")


@pytest.fixture(scope="module")
def conformance_run(gguf, tmp_path_factory):
    """One row at fp32, every family the backend serves but those run on their own: the conversations (their
    incremental construction costs minutes here: test_conversation.py), the rollouts (test_rollout.py) and the edge
    sweep (test_sweep.py), as a user runs it. The row is smollm2-036: the shortest prefix (173 tokens) of the live
    and bridge panels both builds' committed baselines drew, so every record of the run is audited, and one where
    the user build fails each check its baseline fails (the bridge, and the suffixes of one call against live and
    against one token per call). -vv: the summary's lines carry their whole message, as on CI (else pytest trims
    them to the terminal's width), for the audit's outcomes read below."""
    root = tmp_path_factory.mktemp("llamacpp")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", "-vv", "--backend", "llamacpp", "--model", str(gguf), "--bank", str(BANK), "--contract",
         str(CONTRACT), "--precision", "fp32", "--rows", "36:37", *ACCEPT, "--report-dir", str(root), "--run-name",
         "smollm2", "-k", "not conversation and not sweep and not rollout"],
        cwd=root, capture_output=True, text=True, check=False)
    return proc, root / "smollm2"


class BuildBaseline(NamedTuple):
    """This venv's build (its record's isa) and the committed baseline of that ISA's build (None where none is);
    `own`: that baseline was made by this very build. A native build (the user build, -march=native) is code for
    the CPU that built it, so the user baseline is this build's only on that CPU (its run.json's build_cpu); on
    another CPU the run is audited against it as the baseline of another build, and the CPU is part of what it
    names (docs/llamacpp.md "Two builds")."""

    isa: str | None
    baseline: Path | None
    own: bool


@pytest.fixture(scope="module")
def build_baseline() -> BuildBaseline:
    from replaytests.engine.llamacpp import build

    isa, _ = here = build.here()
    baseline = BASELINES.get(isa)
    made = build.of_platform(json.loads((baseline / "run.json").read_text())["platform"]) if baseline else None
    return BuildBaseline(isa, baseline, made == here)


def _failures(run_dir: Path) -> dict[str, str]:
    """The checks a run failed (its run.json's verdict), each with its message."""
    verdict = json.loads((run_dir / "run.json").read_text())["verdict"]
    return {failure["check"]: failure["message"] for failure in verdict.get("failures", [])}


def _another_build(baseline: BuildBaseline, failure: str) -> bool:
    """A record's audit that failed against the baseline of another build (the user build's, made on another CPU)
    and names it: a trajectory that changed there is that build's difference (the audit's rule: only bits may
    differ across platforms), recorded by the audit as a failure that says so. `failure`: its check and message (a
    verdict's failure, or a summary line)."""
    return not baseline.own and "record_reproduces" in failure and "runtime.llamacpp.build_cpu" in failure


def test_the_conformance_run_passes_and_names_what_it_lacks(conformance_run, build_baseline):
    """It passes, or fails only the checks the committed baseline of its build failed (the user build fails the
    bridge's bit-exact gate where its baseline does: the finding, reproduced), and where that baseline was made by
    a native build on another CPU, audits naming that CPU; a check that fails here and passed there is a failure."""
    proc, run = conformance_run
    isa, baseline, _ = build_baseline
    failures = _failures(run)
    # what that baseline's run failed, but never an audit (its own audit ran against another ledger, or none)
    known = {check: message for check, message in (_failures(baseline) if baseline is not None else {}).items()
             if "baseline" not in check}
    new = {check: message for check, message in failures.items()
           if check not in known and not _another_build(build_baseline, f"{check} {message}")}
    assert not new, f"the llama.cpp run ({isa} build) failed where {baseline or 'no committed baseline'} did not: {new}"
    assert proc.returncode == (1 if failures else 0), f"the llama.cpp run failed:\n{proc.stdout[-4000:]}"
    assert "backend llamacpp lacks batch_size" in proc.stdout, "no skip names the missing capability"
    records = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert {r["family"] for r in records} == {"live", "crossing", "bridge", "serving"}, {r["family"] for r in records}
    assert all(r["status"] == "ok" and r["precision"] == "fp32" for r in records), records


def test_every_prompt_cache_hit_in_the_run_is_proven_by_llamacpps_count(conformance_run):
    """The serving family on llama.cpp: each hit reused every token of the prefix but the last (llama.cpp
    evaluated one), past the prompt block live computed in one call; every other arm read nothing cached."""
    _, run = conformance_run
    records = [r for r in map(json.loads, (run / "ledger.jsonl").read_text().splitlines()) if r["family"] == "serving"]
    assert len(records) == 1, len(records)
    for record in records:
        hit = record["prefix_hit"]
        assert hit["covers_decode"] and hit["cached_tokens"] > hit["prompt_block_tokens"], (record["row"], hit)
        cached = {arm: values["served"]["cached_tokens"] for arm, values in record["arms"].items()}
        assert all(n == 0 for arm, n in cached.items() if arm != "prefix_hit"), (record["row"], cached)
        assert record["arms"]["chunked"]["served"]["prefill_steps"] > 1, record["arms"]["chunked"]["served"]


def test_the_run_records_the_build_it_ran_on(conformance_run):
    """The platform names the build (its ISA, and for a native build the CPU it was built for) and what llama.cpp
    says it runs with: llamafile's sgemm exactly where the build record says it was built in."""
    from replaytests.engine.llamacpp.context import build_record

    _, run = conformance_run
    meta = json.loads((run / "run.json").read_text())
    settings, build = meta["platform"]["runtime.llamacpp"], meta["environment"]["llamacpp_build"]
    assert build == build_record(), (build, build_record())
    assert settings["build_isa"] == build["isa"] and "AVX2 = 1" in settings["system_info"], settings
    assert ("LLAMAFILE = 1" in settings["system_info"]) == bool(build.get("llamafile")), (settings, build)
    assert ("build_cpu" in settings) == bool(build.get("native")), (settings, build)
    assert build["cmake_args"] or build["isa"] == "user", build  # the user build passes none: the package's defaults


def test_k_and_v_are_read_from_llamacpps_state(runtime, z):
    boundary = runtime.build("prefill", z)
    layers = boundary.layers
    assert len(layers) == 30, len(layers)
    for k, v in layers:
        assert k.shape == v.shape == (1, 1, len(z), 192) and k.dtype == torch.float32, (k.shape, v.shape, k.dtype)
    assert any(bool(k.abs().sum()) for k, _ in layers), "every K is zero: not the cache's bytes"


def test_a_transplanted_state_is_what_llamacpp_loads(runtime, z):
    """The validity control of the transplant on llama.cpp: prefill's K/V spliced into its own replica
    continues as prefill does, and llama.cpp reads back exactly the spliced bytes."""
    prefill, replica = runtime.build("prefill", z), runtime.build("prefill_replica", z)
    moved = runtime.transplant(replica, prefill, layers=[0, 29], parts=("v",))
    runtime.context.load(moved.state.state, moved.state.length)
    assert runtime.context.save() == moved.state.state, "llama.cpp did not load the spliced state as written"
    assert runtime.suffix(moved).tokens == runtime.suffix(prefill).tokens


def test_a_transplant_keeps_the_recipient_and_refuses_another_prefix(runtime, z, rows):
    """Between two constructions of one prefix (live, and the prefill of what live reached) a transplant
    keeps the recipient's tokens and boundary logits; from another row's state it is refused."""
    live = runtime.live(prompt_of(z, runtime.grammar.delims))
    prefill = runtime.build("prefill", live.tokens)
    moved = runtime.transplant(prefill, live)
    assert moved.tokens == prefill.tokens and bool((moved.logits == prefill.logits).all())
    with pytest.raises(TransplantRefused, match="differs"):
        runtime.transplant(runtime.build("incremental", rows[1].tokens), live)


def test_a_state_in_another_layout_is_refused():
    with pytest.raises(StateLayout, match=r"ends early|magic"):
        StateCache(b"\xd8\x3c\x14\xaf" + b"\0" * 3)


def test_a_q8_0_cache_is_read_as_attention_reads_it(gguf, z):
    """The kv-q8 cell (flash attention on): llama.cpp's q8_0 rows dequantized, block scale times int8."""
    contract = load_contract(REPO / "contracts" / "cpu-smollm2-llamacpp-fa.yaml")
    runtime = Runtime.load(gguf, contract, "kv-q8")
    boundary = runtime.build("prefill", z)
    part = boundary.cache.parts[0][0]  # layer 0 K
    assert part.ggml_type == 8 and part.size == len(z) * (192 // 32) * 34, part
    k = boundary.layers[0][0]
    assert k.shape == (1, 1, len(z), 192) and k.dtype == torch.float32
    raw = boundary.state.state[part.offset:part.offset + 34]  # the first block of the first cell
    scale = float(np.frombuffer(raw[:2], dtype=np.float16)[0])
    first = np.frombuffer(raw[2:], dtype=np.int8).astype(np.float32) * np.float32(scale)
    assert np.array_equal(k[0, 0, 0, :32].numpy(), first), "the dequantized block is not scale x int8"


def test_a_q8_0_cache_without_flash_attention_is_refused(gguf, tmp_path):
    contract = tmp_path / "c.yaml"
    contract.write_text(f"extends: {REPO / 'contracts' / 'cpu-smollm2-llamacpp-fa.yaml'}\nname: no-fa\n"
                        "runtime: {llamacpp: {flash_attention: false}}\n")
    with pytest.raises(ConfigError, match=r"runtime.llamacpp.flash_attention: expected true for the q8_0 K/V"):
        Runtime.load(gguf, load_contract(contract), "kv-q8")


def test_the_run_is_audited_against_the_committed_baseline_of_its_build(conformance_run, build_baseline):
    """The committed baseline of this venv's build (BASELINES: llamacpp-smollm2/ for the avx2 build,
    llamacpp-smollm2-user/ for pip's defaults) is this bank's, contract's and backend's: it holds every record of
    the run, and each reproduces it or differs only as the platform drift of another CPU, never of another ISA's
    build; a native build's baseline made on another CPU is another build's, and an audit that fails against it
    names that CPU (_another_build)."""
    isa, baseline, _ = build_baseline
    if baseline is None:
        pytest.skip(f"no committed llama.cpp baseline of the {isa!r} build (tools/install-llamacpp.sh; committed: "
                    f"{', '.join(BASELINES)})")
    proc, run = conformance_run
    assert f"{baseline.name}/ledger.jsonl" in proc.stdout, (baseline, proc.stdout[:3000])
    recorded = json.loads((baseline / "run.json").read_text())["platform"]["runtime.llamacpp"]["build_isa"]
    assert recorded == isa, f"{baseline}/run.json: platform runtime.llamacpp.build_isa {recorded!r}, this build {isa!r}"
    outcomes = [line for line in proc.stdout.splitlines() if "record_reproduces" in line
                and line.startswith(("PASSED", "XFAIL", "FAILED", "ERROR"))]
    keys = {(r["family"], r["row"], r["precision"]) for r in map(json.loads, (baseline / "ledger.jsonl").open())}
    audited = sum((r["family"], r["row"], r["precision"]) in keys
                  for r in map(json.loads, (run / "ledger.jsonl").open()))
    records = sum(1 for _ in (run / "ledger.jsonl").open())
    assert audited == records, f"{records - audited} of the run's {records} records are not in {baseline}"
    assert len(outcomes) == audited, (outcomes, audited)
    bad = [line for line in outcomes if not (line.startswith("PASSED") or "platform drift" in line
                                             or _another_build(build_baseline, line))]
    assert not bad, bad
    other_build = [line for line in outcomes if "build_isa" in line]
    assert not other_build, f"audited as another build's drift: {other_build}"


@pytest.mark.parametrize("fault", ["stale", "foreign"])
def test_a_prefix_hit_on_a_stale_or_foreign_block_is_found(runtime, rows, monkeypatch, fault):
    """Must-fail control of the serving family (issue 47): the hit reuses a cache that lost its last token (a
    stale block) or one another request left (a foreign block: llama.cpp counts a full hit all the same). On
    the clean hit the serving family's live~prefix_hit comparison is bit-exact (the committed baselines: 48/48
    rows); with the fault it must not be, or the row must fail closed."""
    from replaytests.engine.llamacpp.context import Context
    from replaytests.families import serving

    row, other = rows[0], max(rows[1:], key=lambda r: r.prefix_len)
    assert other.prefix_len >= row.prefix_len, "premise: no longer row to take a foreign block from"
    clean = serving.run(runtime, row)
    before = clean.comparisons["live~prefix_hit"]
    assert clean.ok and before.logits_exact and before.cache_exact, \
        f"premise: the clean hit is not bit-exact to the live request here ({before}): the control proves nothing"
    truncate, foreign = Context.truncate, runtime.build("prefill", other.tokens).state

    def faulty(context, length):
        if fault == "foreign":
            context.load(foreign.state, foreign.length)
        truncate(context, length - (fault == "stale"))

    monkeypatch.setattr(Context, "truncate", faulty)
    hit = serving.run(runtime, row)
    shown = hit.comparisons.get("live~prefix_hit")
    print(f"{fault} block: " + (f"excluded: {hit.reason}" if not hit.ok else f"cache exact {shown.cache_exact}, "
                                 f"logits exact {shown.logits_exact}, suffix equal {shown.suffix_equal}"))
    if hit.ok:  # else it failed closed: found
        counted = clean.prefix_hit.cached_tokens - (fault == "stale")
        assert hit.prefix_hit.cached_tokens == counted, f"premise: llama.cpp counted {hit.prefix_hit}, not {counted}"
        after = hit.comparisons["live~prefix_hit"]
        assert not (after.logits_exact or after.cache_exact), \
            f"a hit on a {fault} block passed as the live state: {after}"
