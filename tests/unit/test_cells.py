"""Numeric cells (inputs/cells.py): declared by the contract, selected by --precision, refused in one
line where the backend cannot run them, and run in the format they name (quantized K/V caches carry
their stored state through copies and transplants; quantized weights are checked at load)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import forkserver
import pytest
import torch
import yaml

from replaytests.engine import backend
from replaytests.engine.hf import weights
from replaytests.engine.hf.runtime import Runtime
from replaytests.engine.vllm import runtime as vllm_runtime
from replaytests.engine.vllm.runtime import Runtime as VllmRuntime
from replaytests.errors import ConfigError
from replaytests.inputs import cells
from replaytests.inputs.contract import load_contract

HQQ4 = {"format": "quantized", "library": "hqq", "bits": 4, "group_size": 64, "residual_length": 8}


def _contract(tmp_path, repo, **extra):
    data = {"extends": str(repo / "contracts" / "cpu-tiny.yaml"), "name": "cells-test", **extra}
    path = tmp_path / "contract.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cells_contract(repo):
    return load_contract(repo / "contracts" / "cpu-tiny-cells.yaml")


@pytest.mark.parametrize(("spec", "selected"), [
    pytest.param("both", ("bf16", "fp32"), id="both"),
    pytest.param("all", ("bf16", "fp32", "fp16", "kv-hqq4", "w-int8"), id="all"),
    pytest.param("kv-hqq4,bf16", ("bf16", "kv-hqq4"), id="list-in-contract-order"),
    pytest.param("fp16", ("fp16",), id="one"),
])
def test_precision_selects_cells(cells_contract, spec, selected):
    assert cells.select(spec, cells_contract.cells) == selected, f"--precision {spec}"


@pytest.mark.parametrize(("spec", "message"), [
    pytest.param("fp8", r"^--precision 'fp8': cell 'fp8' not declared by .*\(its cells: bf16, fp32, fp16, kv-hqq4, "
                        r"w-int8\)$", id="unknown"),
    pytest.param("bf16,bf16", r"^--precision 'bf16,bf16': a cell named twice$", id="twice"),
    pytest.param("bf16,", r"^--precision: expected a cell name", id="empty-item"),
])
def test_a_bad_precision_is_one_line(cells_contract, spec, message):
    with pytest.raises(ConfigError, match=message):
        cells.select(spec, cells_contract.cells)


@pytest.mark.parametrize(("extra", "message"), [
    pytest.param({"cells": {"kv": {"dtype": "bfloat16", "kv_cache": {**HQQ4, "bits": 5}}}},
                 r": cells\.kv\.kv_cache\.bits: expected one of 1, 2, 3, 4, 8 \(hqq offers these\), got 5$", id="bits"),
    pytest.param({"cells": {"kv": {"dtype": "bfloat16", "kv_cache": {**HQQ4, "group_size": 48}}}},
                 r": cells\.kv\.kv_cache\.group_size: expected one of 32, 64, 128", id="group-size"),
    pytest.param({"cells": {"kv": {"dtype": "bfloat16", "kv_cache": {**HQQ4, "library": "kivi"}}}},
                 r": cells\.kv\.kv_cache\.library: expected one of hqq, quanto, got 'kivi'$", id="library"),
    pytest.param({"cells": {"kv": {"dtype": "bfloat16", "kv_cache": {**HQQ4, "residual_length": None}}}},
                 r": cells\.kv\.kv_cache\.residual_length: expected the count", id="residual"),
    pytest.param({"cells": {"kv": {"dtype": "bfloat16", "kv_cache": {"format": "native", "bits": 4}}}},
                 r": cells\.kv\.kv_cache\.bits: expected null for a native K/V cache", id="bits-on-native"),
    pytest.param({"cells": {"w": {"dtype": "bfloat16", "weights": {"format": "int4", "library": "torchao"}}}},
                 r": cells\.w\.weights\.group_size: expected one of 32, 64, 128, 256 for int4", id="int4-group"),
    pytest.param({"cells": {"all": {"dtype": "float16"}}}, r": cells: cell name 'all' is reserved", id="reserved"),
    pytest.param({"cells": {"FP16": {"dtype": "float16"}}}, r": cells: cell name 'FP16': expected lower-case",
                 id="upper-case"),
    pytest.param({"cells": {"bf16": {"dtype": "bfloat16"}}}, r": cells\.bf16: declared under precisions too",
                 id="twice"),
    pytest.param({"cell_pairs": [["fp8", "bf16"]]}, r": cell_pairs\[0\]: unknown cell 'fp8'", id="pair-unknown"),
    pytest.param({"cell_pairs": [["bf16", "bf16"]]}, r": cell_pairs\[0\]: expected two different cell names",
                 id="pair-same"),
    pytest.param({"gates": {"crossing": {"suffix_divergence_allowed": {"kv-int4": True}}}},
                 r": gates\.crossing\.suffix_divergence_allowed: unknown cell 'kv-int4'", id="gate-unknown"),
])
def test_a_bad_cell_is_one_line_naming_contract_cell_and_field(tmp_path, repo, extra, message):
    path = _contract(tmp_path, repo, **extra)
    with pytest.raises(ConfigError, match=message) as caught:
        load_contract(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value), str(caught.value)


@pytest.fixture
def fp8_contract(tmp_path, repo):
    return load_contract(_contract(tmp_path, repo, cells={"kv-fp8": {"dtype": "bfloat16",
                                                                     "kv_cache": {"format": "fp8_e4m3"}}}))


def test_fp8_cache_on_the_hf_backend_is_refused_before_model_work(fp8_contract):
    with pytest.raises(ConfigError, match=r"contract\.yaml: cells\.kv-fp8\.kv_cache\.format: fp8_e4m3 is a K/V cache "
                                          r"format of vLLM; backend hf runs native, quantized$"):
        backend.check_cell(Runtime, fp8_contract, "kv-fp8")


@pytest.mark.parametrize(("kernels", "refused"), [("AVX512", False), ("AMX", False), ("below AVX512", True)])
def test_vllm_runs_its_fp8_cache_only_with_avx512_or_amx_kernels(fp8_contract, monkeypatch, kernels, refused):
    monkeypatch.setattr(vllm_runtime, "cpu_kernels", lambda: kernels)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if not refused:
        assert backend.check_cell(VllmRuntime, fp8_contract, "kv-fp8") is None, f"vLLM refused fp8 at {kernels}"
        return
    with pytest.raises(ConfigError, match=r"cells\.kv-fp8\.kv_cache\.format: vLLM's CPU attention runs an "
                                          r"fp8_e4m3 K/V cache only with AVX-512 or AMX kernels, and its kernels here "
                                          r"are below"):
        backend.check_cell(VllmRuntime, fp8_contract, "kv-fp8")


def test_vllm_refuses_a_library_quantized_cache(cells_contract):
    with pytest.raises(ConfigError, match=r"cells\.kv-hqq4\.kv_cache\.format: quantized is a K/V cache format of "
                                          r"Hugging Face transformers; backend vllm runs native, fp8, fp8_e4m3, "
                                          r"fp8_e5m2$"):
        backend.check_cell(VllmRuntime, cells_contract, "kv-hqq4")


def test_a_missing_library_is_a_skip_reason_never_a_native_run(cells_contract, monkeypatch):
    monkeypatch.setattr(weights, "problem", lambda: "torchao is not installed here (pip install 'replaytests[cells]')")
    reason = backend.check_cell(Runtime, cells_contract, "w-int8")
    assert reason and "cells.w-int8.weights.library: torchao is not installed here" in reason, reason
    assert "never run with native weights" in reason, reason


def test_a_cell_digest_changes_with_its_definition_not_its_name(cells_contract):
    cell = cells_contract.cells["kv-hqq4"]
    assert dataclasses.replace(cell, name="other").digest() == cell.digest(), "the name is not the definition"
    other = dataclasses.replace(cell, kv_cache=dataclasses.replace(cell.kv_cache, residual_length=16))
    assert other.digest() != cell.digest(), "a residual length changed and the digest did not"
    assert cell.digest({"hqq": "0.2.8"}) != cell.digest({"hqq": "0.2.9"}), "a library version is part of it"


# ---- the formats, run on the tiny model ----

@pytest.fixture(scope="module", params=["hqq", "quanto"])
def kv_runtime(request, repo, tmp_path_factory):
    """A 4-bit quantized K/V cache through each library (quanto, not in the `cells` extra: it compiles a C++
    extension on first use, skipped where it is not installed)."""
    if request.param == "quanto":
        pytest.importorskip("optimum.quanto", reason="optimum-quanto is not installed here (pip install "
                                                     "optimum-quanto==0.2.7)")
    cell = {"dtype": "bfloat16", "kv_cache": {**HQQ4, "library": request.param}}
    contract = load_contract(_contract(tmp_path_factory.mktemp("kv"), repo, cells={"kv": cell}))
    return Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", contract, "kv")


def test_a_quantized_cache_is_compared_on_what_attention_reads_and_what_is_stored(kv_runtime, shortest_z):
    incremental = kv_runtime.build("incremental", shortest_z)
    prefill = kv_runtime.build("prefill", shortest_z)
    assert incremental.stored() and prefill.stored(), "a quantized boundary exposes no stored codes and scales"
    read = incremental.layers[0][0]
    assert read.shape[-2] == len(shortest_z), f"layer 0 K reads {read.shape[-2]} positions of {len(shortest_z)}"
    assert incremental.stored_digest() != prefill.stored_digest(), (
        "incremental (decoded tokens kept unquantized) and prefill (all quantized at once) store the same state")


def test_a_quantized_transplant_moves_the_whole_stored_state(kv_runtime, shortest_z):
    incremental = kv_runtime.build("incremental", shortest_z)
    prefill = kv_runtime.build("prefill", shortest_z)
    moved = kv_runtime.transplant(prefill, incremental)
    assert len(moved.stored()) == len(incremental.stored()), "the recipient's stored state has another shape"
    for index, (got, want) in enumerate(zip(moved.stored(), incremental.stored(), strict=True)):
        assert got.dtype == want.dtype and torch.equal(got, want), f"stored tensor {index} is not the donor's"
    assert moved.storages().isdisjoint(incremental.storages()), "the transplanted state shares storage with its donor"
    assert kv_runtime.suffix(moved).tokens == kv_runtime.suffix(incremental).tokens, (
        "the recipient of the whole quantized state did not follow its donor")


def test_int8_weights_are_quantized_at_load(cells_contract, repo):
    runtime = Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", cells_contract, "w-int8")
    from torchao.utils import TorchAOBaseTensor

    linear = {name: m for name, m in runtime.model.named_modules() if isinstance(m, torch.nn.Linear)}
    native = [name for name, m in linear.items() if not isinstance(m.weight, TorchAOBaseTensor)]
    tied = runtime.model.get_input_embeddings().weight
    assert all(linear[name].weight is tied for name in native), f"native linear weights besides the tied head: {native}"
    assert len(native) < len(linear), "no linear weight was quantized"


@pytest.mark.e2e
def test_a_run_over_five_cells_reports_compares_and_tracks_every_cell(repo, tmp_path):
    """--precision all on the cells contract: every record names its cell and its digest, the report's
    tables and reductions cover every cell, compare and history read it."""
    out = tmp_path / "reports"
    proc = forkserver.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
                           "replaytests.conformance", "--contract", str(repo / "contracts" / "cpu-tiny-cells.yaml"),
                           "--precision", "all", "--rows", "0:1", "--report-dir", str(out), "-q", "-m", "not causal",
                           "-k", "not conversation and not sweep"], cwd=repo, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run = json.loads((out / "latest" / "run.json").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (out / "latest" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]
    declared = {cell["name"]: cell for cell in run["cells"]}
    assert {r["precision"] for r in records} == set(declared), f"cells run: {sorted({r['precision'] for r in records})}"
    rolled = {(r["family"], r["precision"]) for r in records if r["family"].startswith("rollout")}
    assert rolled == {(f, cell) for f in ("rollout", "rollout_sampled") for cell in declared}, sorted(rolled)
    wrong = [(r["family"], r["row"], r["precision"]) for r in records
             if r["cell_digest"] != declared[r["precision"]]["digest"]]
    assert not wrong, f"records whose cell digest is not their cell's: {wrong}"
    libraries = declared["w-int8"]["libraries"]
    assert libraries["torchao"] and '"Int8WeightOnlyConfig"' in libraries["torchao.config"], libraries
    assert declared["kv-hqq4"]["libraries"]["hqq"], declared["kv-hqq4"]
    report = (out / "latest" / "report.md").read_text(encoding="utf-8")
    for header in ("kv-hqq4 → bf16 (paired rows)", "w-int8 → bf16 (paired rows)", "fp16 → fp32 (paired rows)"):
        assert header in report, f"report.md lacks the reduction column {header!r}"
    page = (out / "latest" / "report.html").read_text(encoding="utf-8")
    built = json.loads((out / "latest" / "report.json").read_text(encoding="utf-8"))
    for cell in declared:
        assert f"<th>{cell}</th>" in page, f"report.html has no column for cell {cell}"
        split = built["families"]["crossing"]["precisions"][cell]["pairs"]["incremental~prefill"]["suffix_divergence"]
        assert (cell in built["flips"].get("crossing", {})) == (split["k"] > 0), (
            f"the flips table and the crossing disagree on whether cell {cell} diverged ({split['k']} rows)")
    compare = subprocess.run([sys.executable, "-m", "replaytests.cli", "compare", str(out / "latest"),
                              str(out / "latest"), "--contract", str(repo / "contracts" / "cpu-tiny-cells.yaml")],
                             capture_output=True, text=True, timeout=300)  # without it, its cells' gates are unknown
    for cell in declared:
        assert re.search(rf"^crossing +{re.escape(cell)} ", compare.stdout, re.MULTILINE), (
            f"compare names no crossing row of cell {cell}:\n{compare.stdout[:2000]}")
    history = tmp_path / "history.jsonl"
    subprocess.run([sys.executable, "-m", "replaytests.cli", "history", "append", str(out / "latest"), "--into",
                    str(history)], check=True, capture_output=True, timeout=300)
    shown = subprocess.run([sys.executable, "-m", "replaytests.cli", "history", "show", str(history)],
                           capture_output=True, text=True, timeout=300).stdout
    for cell in ("fp16", "kv-hqq4", "w-int8"):
        assert cell in shown, f"history show names no {cell} column:\n{shown[:2000]}"


def test_int4_weights_run_on_this_cpu_in_groups(tmp_path, repo, shortest_z):
    """torchao's int4 weight-only path that has a CPU kernel (IntxWeightOnlyConfig, groups of 32): every
    untied linear weight holds int4 values, and the crossing's constructions run on it."""
    contract = load_contract(_contract(tmp_path, repo, cells={"w-int4": {"dtype": "bfloat16", "weights": {
        "format": "int4", "library": "torchao", "group_size": 32}}}))
    runtime = Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", contract, "w-int4")
    tied = runtime.model.get_input_embeddings().weight
    quantized = [m.weight for m in runtime.model.modules() if isinstance(m, torch.nn.Linear) and m.weight is not tied]
    assert quantized and all(w.target_dtype == torch.int4 for w in quantized), "a linear weight is not int4"
    assert all(int(w.qdata.min()) >= -8 and int(w.qdata.max()) <= 7 for w in quantized), "values outside int4"
    assert runtime.suffix(runtime.build("prefill", shortest_z)).tokens, "no suffix decoded on int4 weights"


def test_both_selects_the_paper_cells_a_contract_declares(cells_contract):
    only_bf16 = {name: cell for name, cell in cells_contract.cells.items() if name != "fp32"}
    assert cells.select("both", only_bf16) == ("bf16",), "both without fp32 declared"
    with pytest.raises(ConfigError, match=r"^--precision both: the contract declares neither of the paper's cells"):
        cells.select("both", {"fp16": cells_contract.cells["fp16"]})


def test_shards_collated_keep_their_cells_pairs(tmp_path):
    """Two shards of one run (other options, same cells) collate into a report that still compares the
    contract's cell pairs."""
    from replaytests.outputs.runs import report_meta

    cells_ = [{"name": "kv", "digest": "0" * 16}, {"name": "bf16", "digest": "1" * 16}]
    for name, rows in (("a", "0:24"), ("b", "24:48")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ledger.jsonl").write_text("")
        (tmp_path / name / "run.json").write_text(json.dumps({"options": {"rows": rows}, "cells": cells_,
                                                               "cell_pairs": [["kv", "bf16"]]}))
    meta = report_meta([tmp_path / "a", tmp_path / "b"])
    assert meta.get("cell_pairs") == [["kv", "bf16"]] and meta.get("cells") == cells_, meta


def test_a_cell_the_committed_baseline_lacks_is_run_without_an_audit():
    """`--precision fp16` on the embedded default: its committed baseline holds no fp16 record, so nothing is
    audited (the audit tests skip, saying so) rather than the run refused; an explicit --baseline that
    matches nothing is still refused (test_bad_input)."""
    from replaytests.inputs.options import Options
    from replaytests.suite.session import ReplaySession

    committed = Options().baseline_ledger
    session = ReplaySession.open(Options(precision="fp16", rows="0:2"))
    assert session.cells == ("fp16",) and session.options.baseline_ledger == committed, (
        f"the run is not audited against the committed baseline: {session.options.baseline_ledger}")
    assert not session.baseline, f"fp16 records read from the committed baseline: {session.baseline[:1]}"
    control = ReplaySession.open(Options(precision="bf16", rows="0:2"))
    assert control.baseline and {r.precision for r in control.baseline} == {"bf16"}, (
        "premise: the same rows at bf16 read no record of the committed baseline")


def test_a_declared_cell_whose_library_is_missing_does_not_stop_the_paper_cells(monkeypatch):
    """cpu-tiny declares kv-hqq4; where hqq is not installed (an environment with the project's base
    requirements only), `--precision both` still runs and writes run.json: only the cells run carry a digest,
    and nothing asks the missing library for its version."""
    import importlib.metadata

    from replaytests.engine.hf import adapter
    from replaytests.inputs.options import Options
    from replaytests.suite.artifacts import run_metadata
    from replaytests.suite.session import ReplaySession

    def missing(library):
        raise importlib.metadata.PackageNotFoundError(library)

    monkeypatch.setattr(adapter, "quantized_cache_problem", lambda library: f"{library} is not installed here")
    monkeypatch.setattr(adapter, "quantized_cache_version", missing)
    session = ReplaySession.open(Options(precision="both", rows="0:1"))
    assert "kv-hqq4" in session.contract.cells, "the embedded default's contract no longer declares kv-hqq4"
    meta = run_metadata(session)
    digests = {cell["name"]: cell.get("digest") for cell in meta["cells"]}
    assert digests["kv-hqq4"] is None and digests["bf16"] and digests["fp32"], digests


@pytest.fixture
def broken_hqq(monkeypatch, tmp_path):
    """hqq as an installed library whose import fails (a broken build, a missing native dependency)."""
    from replaytests.engine.hf import adapter

    (tmp_path / "broken_hqq_build.py").write_text("raise OSError('libhqq_aten.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(adapter._QUANTIZED_MODULES, "hqq", ("broken_hqq_build", "hqq"))


def test_a_cell_library_that_fails_to_import_is_one_skip_reason_and_named_in_the_verdict(broken_hqq):
    from replaytests.inputs.options import Options
    from replaytests.suite.artifacts import verdict_context
    from replaytests.suite.gathered import Gathered
    from replaytests.suite.session import ReplaySession

    session = ReplaySession.open(Options(precision="fp32,kv-hqq4", rows="0:1"))
    reason = session.skipped_cells.get("kv-hqq4", "")
    assert session.cells == ("fp32",) and "broken_hqq_build is installed but fails to import (OSError: " \
        "libhqq_aten.so: cannot open shared object file)" in reason, (session.cells, reason)
    context = verdict_context(session, Gathered())
    assert [c.split(" (")[0] for c in context["skipped_cells"]] == ["kv-hqq4"], context["skipped_cells"]


def test_a_run_whose_every_cell_would_be_skipped_is_refused(broken_hqq):
    from replaytests.errors import ConfigError
    from replaytests.inputs.options import Options
    from replaytests.suite.session import ReplaySession

    with pytest.raises(ConfigError, match=r"^--precision kv-hqq4: no selected cell can run here: .*cells\.kv-hqq4\."
                                          r"kv_cache\.library: broken_hqq_build is installed but fails to import"):
        ReplaySession.open(Options(precision="kv-hqq4", rows="0:1"))
