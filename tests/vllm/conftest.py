"""tests/vllm's shared runs: child conformance runs that the test modules judge (each takes minutes).

The long ones the selected tests need start side by side at the first test that needs one (`long_runs`): each
takes about one core (the contracts' cpu_threads: 1), so on the 2-core CI machine their minutes overlap instead of
adding up; each fixture waits for its own. A run no selected test needs is not started.
"""

from __future__ import annotations

import pytest


def _tiny(root_of):
    """The first three rows of the tiny causal bank, both precisions, every family the backend serves."""
    from vllm_runs import _start

    # the edge sweep runs in runs of its own (test_vllm_sweep.py): on three rows at both cells it takes minutes
    return _start(root_of("vllm"), "tiny", "--rows", "3", "-k", "not sweep")


def _smollm2(root_of, model):
    """The first row of SmolLM2-135M's causal bank, both precisions, every family the backend serves but the
    conversation family (its other rows: the committed baseline, docs/vllm.md)."""
    from vllm_runs import REPO, _start

    # the conversation family runs in a run of its own, at one precision (below): its incremental construction
    # forces every history token one decode step each, minutes on SmolLM2 at both
    return _start(root_of("smollm2"), "smollm2", "--rows", "1", "--model", str(model), "-k",
                  "not conversation and not sweep", bank=REPO / "fixtures" / "banks" / "smollm2-causal.jsonl",
                  contract=REPO / "contracts" / "cpu-smollm2-vllm.yaml")


def _smollm2_conversations(root_of, model):
    """SmolLM2's first conversation under its own ChatML template, at BF16 (the bank's precision)."""
    from vllm_runs import REPO, _start

    from replaytests.inputs.conversations import path_for

    bank = REPO / "fixtures" / "banks" / "smollm2-causal.jsonl"
    assert path_for(bank).is_file(), f"{path_for(bank)} is missing (fixtures/causal_conversations.py smollm2 makes it)"
    return _start(root_of("smollm2-conversations"), "smollm2", "--rows", "1", "--precision", "bf16", "-k",
                  "conversation", "--model", str(model), bank=bank,
                  contract=REPO / "contracts" / "cpu-smollm2-vllm.yaml")


# fixture -> how its run starts, and whether it runs SmolLM2 (prepared by the suite's venv: `replaytests models
# prepare smollm2` needs the smollm2 extra's transformers)
RUNS = {"vllm_run": (_tiny, False), "smollm2_run": (_smollm2, True),
        "smollm2_conversations": (_smollm2_conversations, True)}


class LongRuns:
    """The runs of RUNS that the session's selected tests need, started together; each waited for once."""

    def __init__(self, started: dict):
        self.started, self.finished = started, {}

    def wait(self, name: str):
        """(the process, with its output as `stdout`, its run directory)."""
        from vllm_runs import _finish

        if name not in self.started:
            pytest.skip("SmolLM2 is not prepared here: run `replaytests models prepare smollm2` in the suite's venv")
        if name not in self.finished:
            self.finished[name] = _finish(self.started[name])
        return self.finished[name]


@pytest.fixture(scope="session")
def long_runs(request, tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")
    from replaytests.inputs import models

    needed = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    model = models.prepared("smollm2")
    runs = LongRuns({name: start(tmp_path_factory.mktemp, *((model,) if smollm2 else ()))
                     for name, (start, smollm2) in RUNS.items()
                     if name in needed and (model is not None or not smollm2)})
    yield runs
    for name, (proc, _, out) in runs.started.items():  # a run no test waited for (the session stopped early)
        if name not in runs.finished:
            proc.kill()
            proc.wait()
            out.close()


@pytest.fixture(scope="session")
def vllm_run(long_runs):
    return long_runs.wait("vllm_run")


@pytest.fixture(scope="session")
def smollm2_run(long_runs):
    return long_runs.wait("smollm2_run")


@pytest.fixture(scope="session")
def smollm2_conversations(long_runs):
    return long_runs.wait("smollm2_conversations")


@pytest.fixture(scope="session")
def runtime():
    """The tiny model at FP32 on vLLM in this process, and one bank row's z: one engine for every module that asks
    (an engine collected tears down the process's distributed state, and the others stop working)."""
    from vllm_runs import CONTRACT, REPO

    from replaytests.engine.vllm.runtime import Runtime
    from replaytests.inputs.bank import read_prefixes
    from replaytests.inputs.contract import load_contract

    z, _ = next(iter(read_prefixes(REPO / "fixtures" / "banks" / "tiny-causal.jsonl").values()))
    return Runtime.load(REPO / "fixtures" / "models" / "tiny-qwen2", load_contract(CONTRACT), "fp32"), z
