"""The runtime seam (engine.backend): backends declare capabilities, families declare requirements, and
a family a backend cannot serve is skipped with the capability it lacks. A second backend
(tests/unit/backends/logprobs_only.py: top-k logprobs, no K/V; registered by its entry point) runs the crossing
through the plugin."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest

from replaytests.backends import REGISTRY
from replaytests.engine.backend import CAPABILITIES, SERVING, Backend, missing, resolve
from replaytests.errors import ConfigError
from replaytests.families.registry import FAMILIES
from replaytests.inputs.options import DEFAULT_CONTRACT

BACKENDS = Path(__file__).parent / "backends"
TOY = "logprobs-only"  # registered by the entry point beside its module (tests/unit/backends)
NEW_FAMILY_DIR = Path(__file__).parent / "families"
NEW_FAMILY = "prefill_twice"  # registered by the entry point beside its module (tests/unit/families)


@pytest.mark.parametrize("family", list(FAMILIES), ids=str)
def test_every_family_requires_known_capabilities_and_reads_known_families(family):
    spec = FAMILIES[family]
    assert set(spec.requires) <= set(CAPABILITIES), f"{family} requires unknown capabilities"
    assert set(spec.reads) <= set(FAMILIES) - {family}, f"{family} reads unknown families {spec.reads}"


def test_the_hugging_face_backend_has_every_capability_but_a_serving_engines_and_the_protocol(bf16_runtime):
    cls = resolve("hf")
    assert cls.capabilities == frozenset(CAPABILITIES) - SERVING, sorted(CAPABILITIES.keys() - cls.capabilities)
    assert isinstance(bf16_runtime, Backend), "Runtime does not satisfy engine.backend.Backend"
    assert list(REGISTRY) == ["hf", "vllm", "llamacpp"]


def test_the_vllm_backend_resolves_without_vllm_and_declares_a_serving_engine():
    """Its class, and so its capabilities, load where vllm is not installed (the plugin reads them first)."""
    cls = resolve("vllm")
    assert cls.capabilities >= SERVING and not cls.capabilities & {"kv_tensors", "role_visibility"}, cls.capabilities
    assert missing(resolve("hf").capabilities, FAMILIES["serving"].requires, "hf") is not None


def test_the_llamacpp_backend_resolves_without_llama_cpp_and_declares_k_v_without_a_physical_batch():
    cls = resolve("llamacpp")
    assert {"kv_tensors", "state_copy", "prefix_cache", "chunked_prefill", "rollout_logprobs"} <= cls.capabilities, (
        cls.capabilities)
    assert not cls.capabilities & {"role_visibility", "physical_batch", "batch_size"}, cls.capabilities


def test_without_a_llamacpp_build_the_backend_names_the_install_script(repo, tmp_path, monkeypatch):
    from replaytests.engine.llamacpp.runtime import Runtime
    from replaytests.inputs.contract import load_contract

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # an import that fails, as where it was never built
    with pytest.raises(ConfigError, match=r"cannot import llama_cpp .*; build it with bash tools/install-llamacpp.sh"):
        Runtime.inspect(model, load_contract(repo / "contracts" / "cpu-smollm2-llamacpp.yaml"), "--model")


def test_missing_names_each_capability_and_what_it_gives():
    reason = missing(frozenset({"kv_tensors"}), ("kv_tensors", "state_copy"), "toy")
    assert reason == f"backend toy lacks state_copy ({CAPABILITIES['state_copy']})", reason
    assert missing(frozenset(CAPABILITIES), tuple(CAPABILITIES), "hf") is None


@pytest.mark.parametrize(("spec", "message"), [
    pytest.param("sglang", r"expected one of hf, vllm, llamacpp \(or module:Class\)", id="unknown-name"),
    pytest.param("no_such_module:X", "cannot import no_such_module:X", id="no-module"),
    pytest.param("replaytests.engine.backend:Nothing", "cannot import", id="no-attribute"),
    pytest.param("replaytests.engine.backend:Unsupported", "is not a subclass of replaytests.backends.Declaration",
                 id="not-a-backend"),
])
def test_a_bad_backend_is_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as caught:
        resolve(spec)
    assert "\n" not in str(caught.value) and spec in str(caught.value)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """Two FP32 rows of every family on the logprobs-only backend, in a child process that also sees the new
    family's entry point (tests/unit/families)."""
    root = tmp_path_factory.mktemp("toy")
    path = (str(BACKENDS), str(NEW_FAMILY_DIR), os.environ.get("PYTHONPATH"))
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, path))}
    proc = forkserver.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", "--backend", TOY, "--rows", "2", "--precision", "fp32", "--report-dir", str(root),
         "--run-name", "toy"], cwd=root, env=env)
    return proc, root / "toy"


@pytest.mark.e2e  # spawns a whole run
def test_a_backend_without_kv_runs_the_crossing(toy_run):
    proc, run = toy_run
    assert proc.returncode == 0, f"the logprobs-only run failed:\n{proc.stdout[-3000:]}"
    records = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    crossing = [r for r in records if r["family"] == "crossing"]
    assert [(r["row"], r["status"]) for r in crossing] == [("tiny-000", "ok"), ("tiny-001", "ok")], crossing
    for record in crossing:
        cross = record["comparisons"]["incremental~prefill"]
        assert cross["cache_exact"] is None and cross["k_rel_l2"] is None, f"{record['row']}: a cache was measured"
        assert all(arm["cache_digest"] is None for arm in record["arms"].values()), record["row"]
        assert isinstance(cross["logits_exact"], bool) and isinstance(cross["suffix_equal"], bool), cross


@pytest.mark.e2e
def test_a_backend_without_kv_gets_the_hugging_face_suffixes(toy_run, two_row_run):
    """The seam changes what is seen at the boundary, not the trajectory: the toy decodes through the
    Hugging Face model, so its suffixes are the Hugging Face run's, arm by arm."""
    _, toy = toy_run
    _, hf = two_row_run

    def suffixes(run: Path) -> dict:
        lines = (run / "ledger.jsonl").read_text().splitlines()
        return {(r["row"], arm): a["suffix"] for r in map(json.loads, lines) if r["family"] == "crossing"
                for arm, a in r["arms"].items()}

    assert suffixes(toy) == suffixes(hf) and suffixes(toy), "the logprobs-only suffixes differ from Hugging Face's"


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["transplant", "replication", "bridge", "batch"])
def test_a_backend_without_kv_skips_what_needs_it_with_the_reason(toy_run, family):
    proc, run = toy_run
    records = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["family"] == family], f"{family} records from a backend without K/V"
    reason = missing(frozenset({"role_visibility", "structural_mask", "physical_batch"}), FAMILIES[family].requires,
                     "logprobs-only")
    assert reason and reason in proc.stdout, f"no skip naming {reason!r}:\n{proc.stdout[-3000:]}"


# ---- a new family: its module and its entry point, nothing else (tests/unit/families/prefill_twice.py)


def _records(run: Path, family: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "ledger.jsonl").read_text().splitlines()) if r["family"] == family]


@pytest.mark.e2e
def test_a_new_family_runs_from_its_module_and_entry_point_and_its_replicas_are_judged(toy_run):
    """The replica layer's one test judges its pairs from the registry alone; its records reach the ledger and the
    report's headline table, where it has no headline pair to count."""
    proc, run = toy_run
    records = _records(run, NEW_FAMILY)
    assert [(r["row"], r["status"], r["precision"]) for r in records] == [("tiny-000", "ok", "fp32"),
                                                                          ("tiny-001", "ok", "fp32")], records
    judged = sorted(line.split("::")[-1] for line in proc.stdout.splitlines()
                    if line.startswith("PASSED") and f"-{NEW_FAMILY}-" in line)
    assert judged == [f"test_replica_exact[fp32-{NEW_FAMILY}-tiny-00{n}-prefill]" for n in (0, 1)], (
        proc.stdout[-3000:])
    rows = json.loads((run / "report.json").read_text())["headline"]["rows"]
    assert [NEW_FAMILY, "fp32", "2", "0", "2/2", "-", "-", "-", "-"] in rows, rows


# A contract extending the embedded default that relaxes the new family's own gate (its registry record's section).
RELAXED = "extends: {default}\nname: relaxed\ngates:\n  prefill_twice:\n    replicas_exact: false\n"
CHILD = ("import sys\nfrom replaytests.errors import ConfigError\nfrom replaytests.families.registry import FAMILIES\n"
         "from replaytests.inputs.contract import load_contract\nprint(' '.join(FAMILIES))\n"
         "try:\n    print(load_contract(sys.argv[1]).gates.replicas_exact)\n"
         "except ConfigError as exc:\n    print(exc)\n")


@pytest.mark.e2e  # child processes
@pytest.mark.parametrize("seen", [True, False], ids=["entry-point-seen", "not-seen"])
def test_the_new_family_and_its_contract_section_are_registered_by_its_entry_point_alone(seen, tmp_path):
    """The control: the same registry where its entry point is not seen has no such family, and a contract naming its
    gate section is refused there in one line."""
    contract = tmp_path / "relaxed.yaml"
    contract.write_text(RELAXED.format(default=DEFAULT_CONTRACT.resolve()))
    path = (str(NEW_FAMILY_DIR) if seen else None, os.environ.get("PYTHONPATH"))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(contract)], capture_output=True, text=True, check=False,
                          timeout=300, env=os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, path))})
    assert proc.returncode == 0, proc.stderr[-2000:]
    families, gates = proc.stdout.splitlines()
    assert "crossing" in families.split() and (NEW_FAMILY in families.split()) == seen, families
    if seen:
        replicas_exact = ast.literal_eval(gates)
        assert replicas_exact[NEW_FAMILY] is False and replicas_exact["crossing"] is True, replicas_exact
    else:
        assert f"{contract}: gates: unknown field 'prefill_twice'" in gates, gates
