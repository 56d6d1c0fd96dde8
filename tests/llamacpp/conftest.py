"""The embedded tiny model on llama.cpp, for the test modules that run it (test_rollout.py, test_conversation.py):
converted to GGUF once per session, loaded once per module at fp32, with its causal bank. A module defining
fixtures of the same names (test_llamacpp_backend.py: SmolLM2's shipped GGUF) uses its own."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "models" / "tiny-qwen2"
CONTRACT = REPO / "contracts" / "cpu-tiny-llamacpp.yaml"
BANK = REPO / "fixtures" / "banks" / "tiny-causal.jsonl"


@pytest.fixture(scope="session")
def gguf(tmp_path_factory) -> Path:
    from replaytests.engine.llamacpp import conversion
    from replaytests.inputs.bank import model_digest

    return conversion.to_gguf(TINY, model_digest(TINY)["sha256"], "bf16", "tiny-qwen2", tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def contract():
    from replaytests.inputs.contract import load_contract

    return load_contract(CONTRACT)


@pytest.fixture(scope="module")
def runtime(gguf, contract):
    from replaytests.engine.llamacpp.runtime import Runtime

    return Runtime.load(gguf, contract, "fp32")


@pytest.fixture(scope="module")
def rows(runtime, contract):
    from replaytests.inputs.bank import read_bank

    return read_bank(BANK, runtime.grammar, 8192, contract.caps.suffix_room())
