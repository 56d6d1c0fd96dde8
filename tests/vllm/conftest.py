"""tests/vllm's shared runs: child conformance runs that both test modules judge (each takes minutes)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_run(tmp_path_factory):
    """The first three rows of the tiny causal bank, both precisions, every family the backend serves."""
    pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")
    from vllm_runs import _run

    # the edge sweep runs in runs of its own (test_vllm_sweep.py): on three rows at both cells it takes minutes
    return _run(tmp_path_factory.mktemp("vllm"), "tiny", "--rows", "3", "-k", "not sweep")


@pytest.fixture(scope="session")
def smollm2_run(tmp_path_factory):
    """Two rows of SmolLM2-135M's causal bank, both precisions, every family the backend serves but the
    conversation family (the model
    prepared by the suite's own venv: `replaytests models prepare smollm2` needs the smollm2 extra's
    transformers)."""
    pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")
    from vllm_runs import REPO, _run

    from replaytests.inputs import models

    model = models.prepared("smollm2")
    if model is None:
        pytest.skip("SmolLM2 is not prepared here: run `replaytests models prepare smollm2` in the suite's venv")
    # the conversation family runs in a run of its own, at one precision (test_vllm_conversations.py): its
    # incremental construction forces every history token one decode step each, minutes on SmolLM2 at both
    return _run(tmp_path_factory.mktemp("smollm2"), "smollm2", "--rows", "2", "--model", str(model), "-k",
                "not conversation and not sweep", bank=REPO / "fixtures" / "banks" / "smollm2-causal.jsonl",
                contract=REPO / "contracts" / "cpu-smollm2-vllm.yaml")
