"""replaytests.engine.environment and runtime's numeric flags: capture, drift against the contract, the CUDA
skip reason, flags read back, and `replaytests env`."""

from __future__ import annotations

import dataclasses
import platform
import re
from types import SimpleNamespace

import pytest
import torch

from replaytests.cli import main
from replaytests.engine import numerics
from replaytests.engine.backend import resolve
from replaytests.engine.environment import Drift, _cudnn_version, capture, capture_run, describe, drift, needs_cuda
from replaytests.errors import ConfigError
from replaytests.inputs.cells import Cell
from replaytests.inputs.contract import load_contract
from replaytests.inputs.integrity import Integrity

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks behaviour on a machine without CUDA")


@pytest.fixture
def torch_flags_restored():
    saved = numerics.read_numeric_flags()
    yield
    numerics.write_numeric_flags(saved)


@pytest.fixture(scope="module")
def paper(repo):
    return load_contract(repo / "contracts" / "paper-b200.yaml")


def pinning_only(contract, sections: dict):
    """The contract with nothing pinned but `sections` (drift reads only `settings`)."""
    empty = {key: {} for key in ("software", "hardware", "environment", "precisions")}
    return dataclasses.replace(contract, settings=contract.settings | empty | sections)


# ---------------------------------------------------------------------------------------------
# Drift


@pytest.mark.parametrize(("item", "line"), [
    pytest.param(Drift("software.torch", "2.10.0+cu128", "2.13.0+cpu"),
                 "software.torch: contract 2.10.0+cu128, actual 2.13.0+cpu", id="version"),
    pytest.param(Drift("hardware.gpu_name", "NVIDIA B200", None),
                 "hardware.gpu_name: contract NVIDIA B200, actual null", id="missing-gpu"),
    pytest.param(Drift("precisions.bf16.cudnn_tf32", True, False),
                 "precisions.bf16.cudnn_tf32: contract true, actual false", id="flag"),
    pytest.param(Drift("hardware.gpus", 1, 0), "hardware.gpus: contract 1, actual 0", id="count"),
])
def test_drift_is_one_line(item, line):
    assert str(item) == line, f"str(Drift): {item!s}, expected {line}"


ENV = {
    "software": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None},
    "hardware": {"device_kind": "cpu", "gpus": 0, "driver": None},
    "environment": {"device": "cpu", "cpu_threads": 1},
    "precisions": {"bf16": {"tf32_matmul": False, "cudnn_tf32": False}},
}


@pytest.mark.parametrize(("sections", "expected"), [
    pytest.param({}, [], id="nothing-pinned-differs"),
    pytest.param({"software": {"python": None, "torch": "2.10.0+cu128", "cuda": "12.8"}},
                 ["software.torch: contract 2.10.0+cu128, actual 2.13.0+cpu",
                  "software.cuda: contract 12.8, actual null"],
                 id="versions-in-schema-order"),
    pytest.param({"software": {"transformers": "5.3.0"}}, [], id="field-not-captured"),
    pytest.param({"hardware": {"device_kind": None, "gpus": None}}, [], id="unpinned-not-compared"),
    pytest.param({"precisions": {"bf16": {"dtype": "bfloat16", "cudnn_tf32": True}}},
                 ["precisions.bf16.cudnn_tf32: contract true, actual false"], id="flag-read-back"),
    pytest.param({"precisions": {"fp32": {"cudnn_tf32": False}}}, [], id="precision-not-captured"),
    pytest.param({"environment": {"device": "cpu", "cpu_threads": 4}},
                 ["environment.cpu_threads: contract 4, actual 1"], id="threads"),
])
def test_drift_compares_only_what_the_contract_names(tiny_contract, sections, expected):
    contract = pinning_only(tiny_contract, sections)
    got = [str(d) for d in drift(contract, ENV)]
    assert got == expected, f"drift lines: {got}, expected {expected}"


def test_cpu_tiny_has_no_drift_here(tiny_contract, torch_flags_restored, forced_cpu_isa):
    """No drift on the machine the suite runs on, but a CPU level forced from the environment."""
    assert drift(tiny_contract, capture(tiny_contract)) == forced_cpu_isa, "cpu-tiny drifts on this machine"


@NO_CUDA
@pytest.mark.parametrize(("field", "contract_value", "actual"), [
    pytest.param("software.torch", "2.10.0+cu128", torch.__version__, id="torch"),
    pytest.param("software.python", "3.12.13", platform.python_version(), id="python"),
    pytest.param("software.cuda", "12.8", None, id="cuda"),
    pytest.param("hardware.gpu_name", "NVIDIA B200", None, id="gpu-name"),
    pytest.param("hardware.gpus", 1, 0, id="gpus"),
])
def test_paper_contract_drifts_on_a_cpu_machine(paper, torch_flags_restored, field, contract_value, actual):
    found = {d.field: d for d in drift(paper, capture(paper))}
    assert field in found, f"no drift reported for {field}; drift: {[str(d) for d in found.values()]}"
    assert (found[field].contract, found[field].actual) == (contract_value, actual), f"drift {found[field]}"


# ---------------------------------------------------------------------------------------------
# Capture


@pytest.mark.parametrize(("path", "expected"), [
    pytest.param(("software", "python"), platform.python_version(), id="python"),
    pytest.param(("software", "torch"), torch.__version__, id="torch"),
    pytest.param(("software", "cuda"), torch.version.cuda, id="cuda"),
    pytest.param(("environment", "device"), "cpu", id="device"),
    pytest.param(("environment", "cpu_threads"), 1, id="threads-as-applied"),
    pytest.param(("precisions", "bf16", "cudnn_tf32"), True, id="bf16-cudnn-tf32"),
    pytest.param(("precisions", "fp32", "cudnn_tf32"), False, id="fp32-cudnn-tf32"),
    pytest.param(("precisions", "fp32", "float32_matmul_precision"), "highest", id="fp32-matmul-precision"),
])
def test_capture_records(tiny_contract, torch_flags_restored, path, expected):
    value = capture(tiny_contract)
    for key in path:
        value = value[key]
    assert value == expected, f"captured {'.'.join(path)}: {value!r}, expected {expected!r}"


def test_capture_restores_torch_settings(tiny_contract, torch_flags_restored):
    before = numerics.read_numeric_flags()
    capture(tiny_contract)
    assert numerics.read_numeric_flags() == before, "capture left torch's numeric settings changed"


def test_capture_reads_back_a_pinned_sdpa_backend(tiny_contract, torch_flags_restored):
    flags = dataclasses.replace(tiny_contract.cells["fp32"], sdpa_backend="math")
    contract = dataclasses.replace(tiny_contract, cells={"fp32": flags})
    got = capture(contract)["precisions"]["fp32"]["sdpa_backend"]
    assert got == "math", f"read-back SDPA backends with math pinned: {got!r}"


def test_capture_records_the_model_attention_and_the_inputs(tiny_contract, torch_flags_restored, forced_cpu_isa):
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    manifest = {"rows": 48, "prefix_len": {"min": 123, "max": 374}}
    integrity = Integrity(manifest, ["bank: accepted"], {"bank": "b" * 64, "model": "m" * 64, "tokenizer": "t" * 64,
                                                         "delimiter_ids": [1, 2]})
    env = capture(tiny_contract, "cpu", attention=model.config._attn_implementation, integrity=integrity)
    got = (env["environment"]["attention"], env["bank"], env["inputs"])
    expected = ("eager", manifest, {"bank_sha256": "b" * 64, "model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64,
                                    "delimiter_ids": [1, 2], "overridden": ["bank: accepted"]})
    assert got == expected, f"captured (attention, bank, inputs): {got}, expected {expected}"
    expected = ["environment.attention: contract sdpa, actual eager", *map(str, forced_cpu_isa)]
    assert sorted(map(str, drift(tiny_contract, env))) == sorted(expected), (
        "the attention implementation the model runs is not compared with the contract's")


@pytest.mark.parametrize(("number", "version"), [
    pytest.param(91002, "9.10.2", id="cudnn-9"),
    pytest.param(90100, "9.1.0", id="cudnn-9.1"),
    pytest.param(8902, "8.9.2", id="cudnn-8"),
    pytest.param(None, None, id="no-cudnn"),
])
def test_cudnn_version(number, version):
    # Encodings from cudnn_version.h: 9.x MAJOR*10000 + MINOR*100 + PATCH, 8.x MAJOR*1000 + MINOR*100 + PATCH.
    assert _cudnn_version(number) == version, f"cuDNN {number}: {_cudnn_version(number)!r}, expected {version!r}"


# ---------------------------------------------------------------------------------------------
# needs_cuda: a skip reason, not a crash


@NO_CUDA
@pytest.mark.parametrize(("contract_file", "device"), [
    pytest.param("paper-b200.yaml", None, id="cuda-contract"),
    pytest.param("h200.yaml", None, id="h200-contract"),
    pytest.param("cpu-tiny.yaml", "cuda:0", id="cuda-device-option"),
])
def test_needs_cuda_gives_the_skip_reason(repo, contract_file, device):
    contract = load_contract(repo / "contracts" / contract_file)
    expected = (f"contract {contract.name} ({contract.path}) runs on '{device or contract.device}' "
                f"but CUDA is not available here (torch {torch.__version__})")
    assert needs_cuda(contract, device) == expected, f"skip reason {needs_cuda(contract, device)!r}"


@pytest.mark.parametrize(("contract_file", "device"), [
    pytest.param("paper-b200.yaml", "cpu", id="cpu-device-option"),
    pytest.param("cpu-tiny.yaml", None, id="cpu-contract"),
])
def test_needs_cuda_not_for_a_cpu_run(repo, contract_file, device):
    reason = needs_cuda(load_contract(repo / "contracts" / contract_file), device)
    assert reason is None, f"{contract_file} on {device}: unexpected skip reason {reason!r}"


# ---------------------------------------------------------------------------------------------
# Applying the flags: each is read back, and one that does not take is an error naming it


@pytest.mark.parametrize(("flag", "flags", "stuck"), [
    pytest.param("cpu_threads", {}, 3, id="cpu_threads"),
    pytest.param("tf32_matmul", {"tf32_matmul": True, "float32_matmul_precision": "high"}, False, id="tf32_matmul"),
    pytest.param("cudnn_tf32", {"cudnn_tf32": True}, False, id="cudnn_tf32"),
    pytest.param("float32_matmul_precision", {}, "medium", id="float32_matmul_precision"),
    pytest.param("bf16_reduced_precision_reduction", {"bf16_reduced_precision_reduction": False}, True,
                 id="bf16_reduced_precision_reduction"),
    pytest.param("sdpa_backend", {"sdpa_backend": "math"}, "math+flash", id="sdpa_backend"),
])
def test_a_flag_that_does_not_take_is_a_config_error(torch_flags_restored, monkeypatch, flag, flags, stuck):
    # The flag's setter is ignored and its reader reports `stuck`, as on a build that cannot honour it.
    monkeypatch.setitem(numerics._NUMERIC, flag, (lambda: stuck, lambda value: None))
    wanted = numerics.numeric_settings(Cell("float32", **flags), 1)[flag]
    with pytest.raises(ConfigError, match=rf"^numeric flag {flag}: set {re.escape(repr(wanted))} but it reads back "
                                          rf"{re.escape(repr(stuck))}$"):
        numerics.apply_numeric_flags(Cell("float32", **flags), 1)


@pytest.mark.parametrize(("flags", "flag", "value"), [
    pytest.param({"sdpa_backend": "math"}, "sdpa_backend", "math", id="sdpa-pinned"),
    pytest.param({"bf16_reduced_precision_reduction": False}, "bf16_reduced_precision_reduction", False,
                 id="bf16-reduction-pinned"),
    pytest.param({"tf32_matmul": True, "float32_matmul_precision": "high"}, "tf32_matmul", True, id="tf32-on"),
])
def test_pinned_flags_take_and_read_back(torch_flags_restored, flags, flag, value):
    got = numerics.apply_numeric_flags(Cell("float32", **flags), 1)[flag]
    assert got == value, f"{flag} read back {got!r} after pinning {value!r}"


def test_an_unpinned_flag_goes_back_to_the_default(torch_flags_restored):
    default = numerics.read_numeric_flags()["sdpa_backend"]
    numerics.apply_numeric_flags(Cell("float32", sdpa_backend="math"), 1)
    got = numerics.apply_numeric_flags(Cell("float32"), 1)["sdpa_backend"]
    assert got == default, f"unpinned SDPA backends after a math-pinned precision: {got!r}, default {default!r}"


# ---------------------------------------------------------------------------------------------
# replaytests env


def run_env(capsys, *argv) -> tuple[int, list[str], str]:
    code = main(["env", *argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_env_without_drift(capsys, repo, torch_flags_restored, forced_cpu_isa):
    if forced_cpu_isa:
        pytest.skip(f"this process runs at a CPU level forced from the environment: {forced_cpu_isa[0]}")
    code, lines, err = run_env(capsys, "--contract", str(repo / "contracts" / "cpu-tiny.yaml"))
    assert (code, err) == (0, ""), f"exit {code}, stderr {err!r}"
    no_drift = "no drift: every field contract cpu-tiny names matches this environment"
    assert lines[-1] == no_drift, f"last line {lines[-1]!r}"
    assert any(re.fullmatch(rf"software\.torch +- +{re.escape(torch.__version__)}", line) for line in lines), (
        f"no 'software.torch' line beside the contract: {lines}"
    )


@NO_CUDA
def test_env_lists_each_drift(capsys, paper, torch_flags_restored):
    code, lines, _ = run_env(capsys, "--contract", str(paper.path))
    expected = [f"  {d}" for d in drift(paper, capture_run(paper, resolve("hf")))]
    header = f"drift: {len(expected)} field(s) differ from contract paper-b200:"
    assert code == 0, f"exit {code} with drift, expected 0"
    assert lines[-len(expected) - 1:] == [header, *expected], f"last lines {lines[-len(expected) - 1:]}"
    assert f"  software.torch: contract 2.10.0+cu128, actual {torch.__version__}" in lines, "no software.torch drift"
    assert f"note: {needs_cuda(paper)}" in lines, "no note that CUDA is not available"


def test_env_device_option(capsys, repo, torch_flags_restored):
    code, lines, _ = run_env(capsys, "--contract", str(repo / "contracts" / "cpu-tiny.yaml"), "--device", "mps")
    assert code == 0, f"exit {code}"
    assert "  environment.device: contract cpu, actual mps" in lines, f"no device drift in {lines[-4:]}"


def test_env_with_a_bad_contract_is_a_one_line_error(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n  caps: [1\n", encoding="utf-8")
    code, lines, err = run_env(capsys, "--contract", str(path))
    assert (code, lines) == (4, []), f"exit {code}, stdout {lines}"
    assert re.fullmatch(rf"replaytests: error: {re.escape(str(path))}: malformed YAML at line 2: .+\n", err), (
        f"stderr {err!r}"
    )


def test_describe_marks_unpinned_fields(tiny_contract, torch_flags_restored):
    lines = describe(tiny_contract, capture(tiny_contract))
    row = next(line for line in lines if line.startswith("precisions.bf16.cudnn_tf32 "))
    assert row.split() == ["precisions.bf16.cudnn_tf32", "true", "true"], f"row {row!r}"
