"""A Hugging Face checkpoint made into a GGUF by llama.cpp's own converter and quantizer
(`replaytests models gguf NAME --type TYPE`, engine/llamacpp/conversion.py), on the embedded tiny model.

Runs where llama-cpp-python is installed with its converter (`bash tools/install-llamacpp.sh`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("REPLAYTESTS_REQUIRE_LLAMACPP") != "1":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (bash tools/install-llamacpp.sh)")

import torch
from safetensors.torch import load_file

from replaytests.engine.llamacpp import conversion
from replaytests.engine.llamacpp.context import Model, version
from replaytests.engine.llamacpp.hf_to_gguf import splits_as_gpt2
from replaytests.errors import ConfigError
from replaytests.files import sha256_file
from replaytests.inputs.bank import model_digest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "models" / "tiny-qwen2"
DIGEST = model_digest(TINY)["sha256"]


def convert(kind: str, cache: Path) -> Path:
    return conversion.to_gguf(TINY, DIGEST, kind, "tiny-qwen2", cache)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory) -> Path:
    return convert("bf16", tmp_path_factory.mktemp("gguf"))


def test_a_conversion_is_the_same_bytes_each_time_and_made_once(bf16, tmp_path):
    """The committed baselines name a converted GGUF by its sha256: a second conversion elsewhere gives
    the same bytes, and a second call on the same cache finds the file instead of writing it again."""
    again = convert("bf16", tmp_path)
    assert sha256_file(again) == sha256_file(bf16), "two conversions of one checkpoint differ"
    written = again.stat().st_mtime_ns
    assert convert("bf16", tmp_path) == again and again.stat().st_mtime_ns == written, "converted twice"
    record = json.loads(again.with_name(again.name + ".json").read_text())
    assert record["sha256"] == sha256_file(again) and record["source_model_sha256"] == DIGEST, record


def test_the_stored_width_keeps_every_weight_bit_for_bit(bf16):
    """bf16 as stored: the GGUF's embedding and every layer's V projection are the checkpoint's bits."""
    sys.path.insert(0, str(Path(sys.prefix) / conversion.CONVERTER / "gguf-py"))
    try:
        from gguf import GGUFReader
    finally:
        sys.path.pop(0)
    tensors = {t.name: t for t in GGUFReader(bf16).tensors}
    weights = load_file(TINY / "model.safetensors")
    pairs = {"token_embd.weight": "model.embed_tokens.weight",
             **{f"blk.{i}.attn_v.weight": f"model.layers.{i}.self_attn.v_proj.weight" for i in range(4)}}
    for gguf_name, hf_name in pairs.items():
        theirs = weights[hf_name].view(torch.int16).numpy().tobytes()
        assert tensors[gguf_name].data.tobytes() == theirs, f"{gguf_name} differs from {hf_name}"


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_quantized_gguf_is_in_the_format_it_names(kind, bf16):
    """llama.cpp itself reads the file type of what its quantizer wrote."""
    path = convert(kind, bf16.parent)
    model = Model(path, vocab_only=True)
    try:
        assert model.weights() == kind.upper(), (path, model.weights())
    finally:
        model.close()
    assert path.stat().st_size < bf16.stat().st_size * (0.6 if kind == "q8_0" else 0.4), "not quantized"


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


@pytest.mark.parametrize(("normalizer", "pre", "gpt2"), [
    (None, BYTE_LEVEL, True),
    (None, {**BYTE_LEVEL, "add_prefix_space": True}, False),
    (None, {**BYTE_LEVEL, "use_regex": False}, False),
    ({"type": "NFC"}, BYTE_LEVEL, False),
    (None, {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}, False),
], ids=["gpt2", "prefix-space", "no-regex", "normalized", "digits-first"])
def test_only_gpt2s_own_split_is_written_as_gpt2(normalizer, pre, gpt2, tmp_path):
    """The converter's table names a tokenizer it knows; one it does not know is called GPT-2's only where
    it splits exactly as GPT-2 does."""
    (tmp_path / "tokenizer.json").write_text(json.dumps({"normalizer": normalizer, "pre_tokenizer": pre}))
    assert splits_as_gpt2(tmp_path) is gpt2
    assert splits_as_gpt2(TINY), "the tiny model's tokenizer is GPT-2's byte-level split"


def test_the_converted_tiny_model_runs_the_suite(bf16, tmp_path):
    """The conversion's GGUF is a model the llama.cpp backend runs: two rows of the tiny causal bank pass once
    its changed digests are accepted by name (its record is quoted, never taken as evidence: docs/llamacpp.md),
    and the run names the converted file's sha256 as its model."""
    command = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-q", "-p", "no:cacheprovider",
               "--backend", "llamacpp", "--model", str(bf16), "--bank", str(REPO / "fixtures/banks/tiny-causal.jsonl"),
               "--contract", str(REPO / "contracts/cpu-tiny-llamacpp.yaml"), "--precision", "fp32", "--rows", "2",
               "--report-dir", str(tmp_path)]
    refused = subprocess.run([*command, "--run-name", "refused"], capture_output=True, text=True, cwd=tmp_path,
                             timeout=600)
    assert refused.returncode == 4 and "a record beside a file is not evidence" in refused.stderr, (
        refused.stdout[-2000:] + refused.stderr[-2000:])
    done = subprocess.run([*command, "--run-name", "tiny", "--accept-changed", "model", "--accept-changed",
                           "tokenizer"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "verdict: PASS" in done.stdout
    inputs = json.loads((tmp_path / "tiny" / "run.json").read_text())["environment"]["inputs"]
    recorded, digest = inputs["model_sha256"], model_digest(bf16)
    assert any(line.endswith(f"accepted with --accept-changed=model (its record {bf16.name}.json claims the bank's "
                             "model converted to bf16 by llama.cpp's converter, llama-cpp-python "
                             f"{version()})") for line in inputs["overridden"]), inputs
    assert recorded == digest["sha256"] and sha256_file(bf16) in digest["files"].values(), recorded


@pytest.mark.parametrize(("args", "message"), [
    (["fixtures/models/tiny-qwen2", "--type", "q9"], "--type q9: expected one of"),
    (["fixtures/models", "--type", "q8_0"], "a Hugging Face model directory is expected"),
    (["no-such-model", "--type", "q8_0"], "neither a model name"),
], ids=["unknown-type", "not-a-model-directory", "no-such-model"])
def test_bad_conversion_input_is_one_line(args, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "replaytests.cli", "models", "gguf", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "REPLAYTESTS_CACHE": str(tmp_path)})
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_venv_without_the_converter_is_told_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(conversion, "CONVERTER", "no-converter-here")
    with pytest.raises(ConfigError, match=r"install-llamacpp\.sh"):
        convert("q8_0", tmp_path)


def test_check_model_runs_on_a_gguf(bf16):
    """`check-model --backend llamacpp`: the replay properties on a GGUF through the seam alone; bf16 is a
    cell llama.cpp does not run and there is no physical batch, each said, not faked."""
    done = subprocess.run([sys.executable, "-m", "replaytests.cli", "check-model", "--backend", "llamacpp",
                           "--model", str(bf16), "--contract", str(REPO / "contracts/cpu-tiny-llamacpp.yaml")],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "verdict: PASS (every judged property holds)" in lines, lines
    for prop in ("mask", "bridge", "suffix", "self_transplant", "storage"):
        assert any(line.split()[:3] == ["fp32", prop, "ok"] for line in lines), (prop, lines)
    assert any(line.split()[:3] == ["fp32", "batch", "not"] for line in lines), lines
    assert any(line.split()[:3] == ["bf16", "not", "run:"] and "llama.cpp's CPU backend" in line for line in lines), \
        lines  # the cell column is as wide as the contract's longest cell name (check-model runs every cell)


def test_a_bank_frozen_on_llamacpp_is_the_same_bytes_twice_and_names_its_gguf(bf16, tmp_path):
    """`freeze --backend llamacpp`: the boundaries generated live by llama.cpp, through the seam; the
    manifest names the GGUF and the llama.cpp build it was frozen on."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join((REPO / "fixtures/problems/tiny.jsonl").read_text().splitlines(True)[:3]))
    made = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.jsonl"
        done = subprocess.run([sys.executable, "-m", "replaytests.cli", "freeze", "--backend", "llamacpp",
                               "--precision", "fp32", "--model", str(bf16), "--problems", str(problems),
                               "--contract", str(REPO / "contracts/cpu-tiny-llamacpp.yaml"), "--out", str(out)],
                              capture_output=True, text=True, cwd=REPO, timeout=600)
        assert done.returncode == 0 and "froze 3 rows" in done.stdout, done.stdout + done.stderr[-2000:]
        made.append(out.read_bytes())
    assert made[0] == made[1], "two freezes on llama.cpp gave different banks"
    manifest = json.loads((tmp_path / "a.manifest.json").read_text())
    assert manifest["model"]["files"] == {bf16.name: sha256_file(bf16)}, manifest["model"]
    assert manifest["platform"]["runtime.llamacpp"]["build_isa"], manifest["platform"]
    assert manifest["precision"] == "fp32"
