"""replaytests.inputs.contract: loading the YAML reproducibility contract (protocol.md §9); every error one line."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from replaytests.engine.protocol import Caps
from replaytests.errors import ConfigError
from replaytests.inputs.contract import BOUNDARY_CHECKS, SCHEMA, load_contract
from replaytests.inputs.schema import KeyedBy, Named, Section

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = REPO / "contracts"


@pytest.fixture(scope="module")
def tiny_yaml(repo) -> dict:
    return yaml.safe_load((repo / "contracts" / "cpu-tiny.yaml").read_text(encoding="utf-8"))


def write(tmp_path, data: dict | None = None, text: str | None = None, raw: bytes | None = None):
    path = tmp_path / "contract.yaml"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def one_line_error(path, pattern: str) -> ConfigError:
    with pytest.raises(ConfigError, match=pattern) as info:
        load_contract(path)
    assert "\n" not in str(info.value), f"ConfigError spans lines: {info.value!s}"
    assert str(path) in str(info.value), f"ConfigError does not name the file {path}: {info.value!s}"
    return info.value


# ---------------------------------------------------------------------------------------------
# The shipped contracts


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted(CONTRACTS.glob("*.yaml"))])
def test_every_shipped_contract_loads(path):
    contract = load_contract(path)
    assert contract.name == path.stem, f"{path.name}: name {contract.name!r} differs from the file name"


def test_cpu_tiny_contract_loads(repo):
    c = load_contract(repo / "contracts" / "cpu-tiny.yaml")
    got = {
        "name": c.name, "device": c.device, "cpu_threads": c.cpu_threads, "attention": c.attention,
        "physical_batch": c.physical_batch, "caps": c.caps, "precisions": sorted(c.cells),
        "bf16 dtype": c.cells["bf16"].dtype, "fp32 dtype": c.cells["fp32"].dtype,
        "fp32 matmul precision": c.cells["fp32"].float32_matmul_precision,
        "allowed": c.suffix_divergence_allowed, "delimiters": c.delimiters, "banned": c.banned_tokens,
        "bank": c.bank, "inference_mode": c.inference_mode, "compile": c.compile, "cpu_isa": c.cpu_isa,
    }
    expected = {
        "name": "cpu-tiny", "device": "cpu", "cpu_threads": 1, "attention": "sdpa", "physical_batch": 2,
        "caps": Caps(branch=32, merge=24, answer=8), "precisions": ["bf16", "fp16", "fp32", "kv-hqq4"],
        "bf16 dtype": "bfloat16", "fp32 dtype": "float32", "fp32 matmul precision": "highest",
        "allowed": {"bf16": True, "fp32": False, "fp16": True, "kv-hqq4": True}, "delimiters": {}, "banned": (),
        "bank": {"rows": 48, "prefix_len": {"min": 123, "max": 374}}, "inference_mode": "eager", "compile": False,
        "cpu_isa": "AVX2",
    }
    wrong = {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    assert not wrong, f"cpu-tiny contract fields (got, expected): {wrong}"
    assert re.fullmatch(r"[0-9a-f]{64}", c.digest), f"contract digest {c.digest!r} is not a sha256"


def test_paper_contract_loads(repo):
    c = load_contract(repo / "contracts" / "paper-b200.yaml")
    got = (c.name, c.device, c.caps, c.physical_batch, c.suffix_divergence_allowed,
           c.cells["bf16"].tf32_matmul, c.cells["bf16"].cudnn_tf32,
           c.cells["fp32"].tf32_matmul, c.cells["fp32"].cudnn_tf32,
           c.cells["fp32"].float32_matmul_precision, c.software["torch"], c.hardware["compute_capability"],
           c.bank, c.panels["transplant"]["divergent"], c.panels["replication"]["min_exact_controls"],
           tuple(c.settings["boundary_checks"]), c.gates.settings["transplant"]["donor_recovery"])
    expected = ("paper-b200", "cuda", Caps(768, 512, 64), 2, {"bf16": True, "fp32": False},
                False, True, False, False, "highest", "2.10.0+cu128", "10.0",
                {"rows": 200, "prefix_len": {"min": 1025, "max": 5080}}, 24, 6, BOUNDARY_CHECKS, 1.0)
    assert got == expected, f"paper-b200 contract (docs/protocol.md §9): got {got}, expected {expected}"


def test_h200_contract_extends_the_paper(repo):
    c = load_contract(repo / "contracts" / "h200.yaml")
    paper = load_contract(repo / "contracts" / "paper-b200.yaml")
    got = (c.name, c.device, c.hardware["gpu_name"], c.hardware["compute_capability"], c.hardware["gpus"],
           c.attention, c.caps, c.bank["prefix_len"], c.software["torch"], c.cells, c.gates)
    # BF16 attention pinned to SDPA's math kernel (the others desynced a physical batch on the H200)
    cells_ = paper.cells | {"bf16": dataclasses.replace(paper.cells["bf16"], sdpa_backend="math")}
    expected = ("h200", "cuda", "NVIDIA H200", "9.0", 1, "sdpa", Caps(32, 24, 8), {"min": 123, "max": 374},
                None, cells_, paper.gates)
    assert got == expected, f"h200 contract: got {got}, expected {expected}"
    assert "extends" not in c.raw, "the merged contract still holds its 'extends' key"


def test_h200_caps_fit_the_committed_bank(repo):
    # The committed bank's manifest records the caps it was frozen with; h200 runs that bank.
    manifest = json.loads((repo / "fixtures" / "banks" / "tiny.manifest.json").read_text(encoding="utf-8"))
    caps = vars(load_contract(repo / "contracts" / "h200.yaml").caps)
    assert caps == manifest["contract"]["caps"], f"h200 caps {caps}, bank frozen with {manifest['contract']['caps']}"


def test_digest_is_independent_of_key_order(tmp_path, tiny_yaml):
    a = load_contract(write(tmp_path, tiny_yaml))
    reordered = dict(reversed(list(tiny_yaml.items())))
    (tmp_path / "b").mkdir()
    b = load_contract(write(tmp_path / "b", reordered))
    assert a.digest == b.digest, f"digest depends on key order: {a.digest} vs {b.digest}"


# ---------------------------------------------------------------------------------------------
# Bad input: each a one-line ConfigError naming the file and the field


@pytest.mark.parametrize(("text", "line"), [
    pytest.param("name: a\n  b: [1, 2\nc: d\n", 2, id="bad-indent"),
    pytest.param("name: x\ncaps:\n\tbranch: 1\n", 3, id="tab"),
    pytest.param("name: x\ncaps: {branch: 1\n", 3, id="unclosed-flow-mapping"),
    pytest.param("a: b\n- c\n", 2, id="sequence-after-mapping"),
])
def test_malformed_yaml_names_the_line(tmp_path, text, line):
    one_line_error(write(tmp_path, text=text), rf": malformed YAML at line {line}: ")


@pytest.mark.parametrize("text", [pytest.param("", id="empty"), pytest.param("- 1\n- 2\n", id="list"),
                                  pytest.param("just a string\n", id="scalar")])
def test_top_level_must_be_a_mapping(tmp_path, text):
    one_line_error(write(tmp_path, text=text), r": expected a YAML mapping at the top level$")


def drop(*keys):
    def apply(d):
        target = d
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return apply


def put(value, *keys):
    def apply(d):
        target = d
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return apply


MISSING = [
    pytest.param(drop("name"), r": missing required field 'name'$", id="name"),
    pytest.param(drop("environment"), r": missing required field 'environment'$", id="environment"),
    pytest.param(drop("decoding"), r": missing required field 'decoding'$", id="decoding"),
    pytest.param(drop("caps"), r": missing required field 'caps'$", id="caps"),
    pytest.param(lambda d: [d.pop(key) for key in ("precisions", "cells", "cell_pairs")],
                 r": cells: expected at least one cell \(or precisions: bf16, fp32\)$", id="precisions"),
    pytest.param(drop("gates"), r": missing required field 'gates'$", id="gates"),
    pytest.param(drop("environment", "device"), r": environment: missing required field 'device'$",
                 id="environment.device"),
    pytest.param(drop("environment", "cpu_threads"), r": environment: missing required field 'cpu_threads'$",
                 id="environment.cpu_threads"),
    pytest.param(drop("decoding", "physical_batch"), r": decoding: missing required field 'physical_batch'$",
                 id="decoding.physical_batch"),
    pytest.param(drop("caps", "merge"), r": caps: missing required field 'merge'$", id="caps.merge"),
]


NOT_POSITIVE = [
    pytest.param(put(0, "caps", "branch"), r": caps\.branch: expected an integer from 1 to 1000000, got 0$",
                 id="caps.branch=0"),
    pytest.param(put(-1, "caps", "branch"), r": caps\.branch: expected an integer from 1 to 1000000, got -1$",
                 id="caps.branch=-1"),
    pytest.param(put(0, "caps", "merge"), r": caps\.merge: expected an integer from 1 to 1000000, got 0$",
                 id="caps.merge=0"),
    pytest.param(put(-1, "caps", "answer"), r": caps\.answer: expected an integer from 1 to 1000000, got -1$",
                 id="caps.answer=-1"),
    pytest.param(put(0, "environment", "cpu_threads"),
                 r": environment\.cpu_threads: expected an integer from 1 to 1024, got 0$", id="cpu_threads=0"),
    pytest.param(put(-2, "decoding", "physical_batch"),
                 r": decoding\.physical_batch: expected an integer from 2 to 64 \(.*\), got -2$",
                 id="physical_batch=-2"),
    pytest.param(put(1, "decoding", "physical_batch"),
                 r": decoding\.physical_batch: expected an integer from 2 to 64 \(the identical copies compared in "
                 r"every forward call; 1 would compare nothing\), got 1$", id="physical_batch=1-compares-nothing"),
]


WRONG_TYPE = [
    pytest.param(put("32", "caps", "branch"), r": caps\.branch: expected int, got str '32'$", id="caps.branch-str"),
    pytest.param(put(1.5, "caps", "answer"), r": caps\.answer: expected int, got float 1\.5$", id="caps.answer-float"),
    pytest.param(put(True, "caps", "merge"), r": caps\.merge: expected int, got bool True$", id="caps.merge-bool"),
    pytest.param(put("1", "environment", "cpu_threads"), r": environment\.cpu_threads: expected int, got str '1'$",
                 id="cpu_threads-str"),
    pytest.param(put(5, "name"), r"contract\.yaml: name: expected str, got int 5$",
                 id="name-int"),
    pytest.param(put([1, 2], "caps"), r"contract\.yaml: caps: expected dict, got list \[1, 2\]$",
                 id="caps-list"),
    pytest.param(put("cpu", "environment"), r"contract\.yaml: environment: expected dict, got str 'cpu'$",
                 id="environment-str"),
    pytest.param(put(["bf16"], "precisions"), r"contract\.yaml: precisions: expected dict, got list \['bf16'\]$",
                 id="precisions-list"),
    pytest.param(put("fast", "precisions", "bf16"), r": precisions\.bf16: expected dict, got str 'fast'$",
                 id="precision-not-a-mapping"),
    pytest.param(put(7, "environment", "device"), r"environment\.device: expected str, got int 7$",
                 id="device-int"),
    pytest.param(put("float64", "precisions", "fp32", "dtype"),
                 r": precisions\.fp32\.dtype: expected bfloat16, float16 or float32, got 'float64'$",
                 id="dtype-float64"),
    pytest.param(put(True, "precisions", "bf16", "tf32"),
                 r": precisions\.bf16: unknown field 'tf32'; did you mean 'tf32_matmul'\?$", id="unknown-flag"),
    pytest.param(put({"<|bogus|>": "x"}, "delimiters"),
                 r"contract\.yaml: delimiters: unknown delimiter '<\|bogus\|>'; expected one of ",
                 id="unknown-delimiter"),
]


@pytest.mark.parametrize(("name", "hint"), [
    pytest.param("fp16", "did you mean 'bf16'\\?", id="fp16"),
    pytest.param("bfloat16", "did you mean 'bf16'\\?", id="dtype-as-name"),
    pytest.param("FP32", "did you mean 'fp32'\\?", id="upper-case"),
    pytest.param("fp8", "expected one of bf16, fp32", id="nothing-close"),
])
def test_unknown_precision_name(tmp_path, tiny_yaml, name, hint):
    data = copy.deepcopy(tiny_yaml)
    data["precisions"][name] = {"dtype": "float32"}
    one_line_error(write(tmp_path, data), rf": precisions: unknown precision '{name}'; {hint}$")


def test_unreadable_contract_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    one_line_error(path, r"nope\.yaml: cannot read contract: No such file or directory$")


def test_unreadable_contract_is_a_directory(tmp_path):
    path = tmp_path / "dir.yaml"
    path.mkdir()
    one_line_error(path, r"dir\.yaml: cannot read contract: a directory, not a regular file$")


# ---------------------------------------------------------------------------------------------
# Invalid values of the right shape: each a one-line ConfigError naming the field


INVALID_VALUES = [
    pytest.param(drop("precisions", "bf16", "dtype"), r"precisions\.bf16.*'dtype'", id="precision-without-dtype"),
    pytest.param(put([1], "gates", "crossing"), r"gates.*crossing", id="gates.crossing-list"),
    pytest.param(put(["bf16"], "gates", "crossing", "suffix_divergence_allowed"), r"suffix_divergence_allowed",
                 id="suffix_divergence_allowed-list"),
    pytest.param(put("no", "gates", "crossing", "suffix_divergence_allowed", "fp32"),
                 r"suffix_divergence_allowed\.fp32", id="gate-flag-string-no"),
    pytest.param(put(5, "banned_tokens"), r"banned_tokens", id="banned_tokens-int"),
    pytest.param(put(["abc"], "banned_tokens"), r"banned_tokens", id="banned_tokens-strings"),
    pytest.param(put(["<|prompt|>"], "delimiters"), r"delimiters", id="delimiters-list"),
    pytest.param(put("yes", "precisions", "bf16", "tf32_matmul"), r"precisions\.bf16\.tf32_matmul",
                 id="flag-string-yes"),
]


@pytest.mark.parametrize(("mutate", "pattern"), MISSING + NOT_POSITIVE + WRONG_TYPE + INVALID_VALUES)
def test_bad_field_is_a_one_line_config_error(tmp_path, tiny_yaml, mutate, pattern):
    data = copy.deepcopy(tiny_yaml)
    mutate(data)
    one_line_error(write(tmp_path, data), pattern)


def test_non_utf8_contract_is_a_config_error(tmp_path):
    one_line_error(write(tmp_path, raw=b"name: caf\xe9\n"), r"contract\.yaml: ")


# ---------------------------------------------------------------------------------------------
# Unknown keys anywhere: one line with the closest known name


UNKNOWN_KEYS = [
    pytest.param(put("x", "nmae"), r"contract\.yaml: unknown field 'nmae'; did you mean 'name'\?$", id="top-level"),
    pytest.param(put("base.yaml", "extend"), r"contract\.yaml: unknown field 'extend'; did you mean 'extends'\?$",
                 id="extends-misspelt"),
    pytest.param(put("sdpa", "environment", "atention"),
                 r": environment: unknown field 'atention'; did you mean 'attention'\?$", id="environment"),
    pytest.param(put(1, "decoding", "topp"), r": decoding: unknown field 'topp'; did you mean 'top_p'\?$",
                 id="decoding"),
    pytest.param(put({}, "gates", "crosing"), r": gates: unknown field 'crosing'; did you mean 'crossing'\?$",
                 id="gates-family"),
    pytest.param(put({"transplant": {"divergant": 3}}, "panels"),
                 r": panels\.transplant: unknown field 'divergant'; did you mean 'divergent'\?$", id="nested-panel"),
    pytest.param(put({"pyton": "3.12"}, "software"), r": software: unknown field 'pyton'; did you mean 'python'\?$",
                 id="software"),
    pytest.param(put(True, "Caps"), r"contract\.yaml: unknown field 'Caps'; did you mean 'caps'\?$",
                 id="wrong-case"),
    pytest.param(put(1, "caps", "zzz"), r": caps: unknown field 'zzz'; expected one of branch, merge, answer$",
                 id="nothing-close"),
    pytest.param(put(True, "gates", "crossing", "suffix_divergence_allowed", "fp64"),
                 r": gates\.crossing\.suffix_divergence_allowed: unknown cell 'fp64'; did you mean 'fp16'\?$",
                 id="gate-precision"),
]


# ---------------------------------------------------------------------------------------------
# Values the engine cannot honour, and fields that must agree with each other


UNSUPPORTED = [
    pytest.param(put(False, "decoding", "greedy"),
                 r": decoding\.greedy: expected true \(the engine decodes greedily only\), got False$", id="sampling"),
    pytest.param(put(0.7, "decoding", "temperature"),
                 r": decoding\.temperature: expected 0 \(the engine decodes greedily only\), got 0\.7$",
                 id="temperature"),
    pytest.param(put(0.9, "decoding", "top_p"), r": decoding\.top_p: expected 1 \(the engine decodes", id="top_p"),
    pytest.param(put(50, "decoding", "top_k"), r": decoding\.top_k: expected 0 \(the engine decodes", id="top_k"),
    pytest.param(put(True, "environment", "compile"),
                 r": environment\.compile: expected false \(the engine never uses torch\.compile\), got True$",
                 id="compile"),
    pytest.param(put("cuda-graphs", "environment", "inference_mode"), r": environment\.inference_mode: expected eager",
                 id="inference_mode"),
    pytest.param(put({"tensor_parallel": 2}, "hardware"),
                 r": hardware\.tensor_parallel: expected 1 \(the engine runs the model on one device\), got 2$",
                 id="tensor_parallel"),
    pytest.param(put("flash_attention_2", "environment", "attention"),
                 r": environment\.attention: expected sdpa or eager, got 'flash_attention_2'$", id="attention"),
    pytest.param(put("gpu", "environment", "device"), r": environment\.device: expected cpu, cuda, cuda:N or mps, "
                 r"got 'gpu'$", id="device-name"),
    pytest.param(put("flash2", "precisions", "bf16", "sdpa_backend"),
                 r": precisions\.bf16\.sdpa_backend: expected math, flash, efficient or cudnn, got 'flash2'$",
                 id="sdpa_backend"),
    pytest.param(put("fp32", "precisions", "fp32", "float32_matmul_precision"),
                 r": precisions\.fp32\.float32_matmul_precision: expected highest, high or medium, got 'fp32'$",
                 id="matmul-precision-name"),
    pytest.param(put(["token_ids", "roles"], "boundary_checks"),
                 r": boundary_checks\[1\]: expected token_ids, role_ids, .* or tensor_metadata, got 'roles'$",
                 id="boundary-check-name"),
    pytest.param(put("nope", "schema"), r": schema: expected replaytests\.contract/1, got 'nope'$", id="schema-id"),
    pytest.param(put("AVX-512", "environment", "cpu_isa"),
                 r": environment\.cpu_isa: expected DEFAULT, AVX2 or AVX512, got 'AVX-512'$", id="cpu-isa-name"),
]


TOGETHER = [
    pytest.param(put(["token_ids", "role_ids"], "boundary_checks"),
                 r": boundary_checks: expected each of token_ids, role_ids, .* once \(the engine always runs every "
                 r"boundary check\), got \['token_ids', 'role_ids'\]$", id="boundary-checks-subset"),
    pytest.param(put("float32", "precisions", "bf16", "dtype"),
                 r": precisions\.bf16\.dtype: expected bfloat16 for precision bf16, got 'float32'$",
                 id="dtype-of-other-precision"),
    pytest.param(put(True, "precisions", "fp32", "tf32_matmul"),
                 r": precisions\.fp32\.float32_matmul_precision: expected high or medium with tf32_matmul true "
                 r"\(torch enables TF32 matmul exactly when this is not 'highest'\), got 'highest'$",
                 id="tf32-with-highest"),
    pytest.param(put("high", "precisions", "fp32", "float32_matmul_precision"),
                 r": precisions\.fp32\.float32_matmul_precision: expected highest with tf32_matmul false",
                 id="high-without-tf32"),
    pytest.param(put({"device_kind": "cuda"}, "hardware"),
                 r": hardware\.device_kind: expected cpu to match environment\.device 'cpu', got 'cuda'$",
                 id="device-kind-vs-device"),
    pytest.param(put({"prefix_len": {"min": 400, "max": 100}}, "bank"),
                 r": bank\.prefix_len: expected min <= max, got min 400 and max 100$", id="prefix-range-reversed"),
    pytest.param(lambda d: d.update(precisions={}, cells={}, cell_pairs=[]),
                 r": cells: expected at least one cell \(or precisions: bf16, fp32\)$", id="no-precisions"),
    pytest.param(put({"compute_capability": 9.0}, "hardware"),
                 r": hardware\.compute_capability: expected str or null, got float 9\.0 \(write it in quotes\)$",
                 id="unquoted-capability"),
    pytest.param(put({"compute_capability": "sm90"}, "hardware"),
                 r": hardware\.compute_capability: expected MAJOR\.MINOR in quotes, e\.g\. \"9\.0\", got 'sm90'$",
                 id="capability-format"),
    pytest.param(put({"torch": 2.1}, "software"), r": software\.torch: expected str or null, got float 2\.1 "
                 r"\(write it in quotes\)$", id="unquoted-version"),
    pytest.param(put({"transplant": {"donor_recovery": 1.5}}, "gates"),
                 r": gates\.transplant\.donor_recovery: expected a number from 0 to 1, got 1\.5$",
                 id="recovery-above-1"),
    pytest.param(put({"bridge": 0}, "panels"), r": panels\.bridge: expected an integer from 1 to 1000000, got 0$",
                 id="empty-bridge-panel"),
    pytest.param(put({"rows": -1}, "bank"), r": bank\.rows: expected an integer from 1 to 1000000, got -1$",
                 id="bank-rows"),
    pytest.param(put(100000, "environment", "cpu_threads"),
                 r": environment\.cpu_threads: expected an integer from 1 to 1024, got 100000$",
                 id="cpu_threads-bound"),
    pytest.param(put(None, "environment"), r"contract\.yaml: environment: expected dict, got null$",
                 id="empty-section"),
    pytest.param(put({"llamacpp": {"n_ctx": 512, "chunk": 1024}}, "runtime"),
                 r": runtime\.llamacpp\.chunk: expected at most n_ctx \(512\): llama\.cpp clamps a context's n_batch "
                 r"to its n_ctx, so calls of the chunk would be calls of n_ctx, got 1024$",
                 id="llamacpp-chunk-above-n_ctx"),
]


@pytest.mark.parametrize(("mutate", "pattern"), UNKNOWN_KEYS + UNSUPPORTED + TOGETHER)
def test_bad_contract_is_a_one_line_config_error(tmp_path, tiny_yaml, mutate, pattern):
    data = copy.deepcopy(tiny_yaml)
    mutate(data)
    one_line_error(write(tmp_path, data), pattern)


# ---------------------------------------------------------------------------------------------
# Defaults: what a contract leaves out


@pytest.fixture(scope="module")
def minimal(tmp_path_factory):
    """Only the required fields."""
    data = {"name": "minimal", "environment": {"device": "cpu", "cpu_threads": 1}, "decoding": {"physical_batch": 2},
            "caps": {"branch": 4, "merge": 3, "answer": 2}, "precisions": {"fp32": {"dtype": "float32"}},
            "gates": {"crossing": {"suffix_divergence_allowed": {"bf16": True}}}}
    return load_contract(write(tmp_path_factory.mktemp("minimal"), data))


@pytest.mark.parametrize(("path", "expected"), [
    pytest.param("panels.bridge", 12, id="bridge-panel"),
    pytest.param("panels.transplant", {"divergent": 24, "exact_controls": 8, "layers": "all", "directions": "both"},
                 id="transplant-panel"),
    pytest.param("panels.replication", {"rows": 48, "min_exact_controls": 6}, id="replication-panel"),
    pytest.param("gates.bridge.exact", True, id="bridge-exact"),
    pytest.param("gates.transplant", {"donor_recovery": 1.0, "controls_third_trajectory": 0}, id="transplant-gate"),
    pytest.param("gates.audit.reproduce", True, id="audit-reproduces"),
    pytest.param("gates.crossing.suffix_divergence_allowed", {"bf16": True, "fp32": False}, id="unnamed-is-exact"),
    pytest.param("gates.live.suffix_divergence_allowed", {"bf16": True, "fp32": False}, id="live-follows-crossing"),
    pytest.param("precisions.fp32.float32_matmul_precision", "highest", id="matmul-precision-from-tf32"),
    pytest.param("precisions.fp32.sdpa_backend", None, id="sdpa-unpinned"),
    pytest.param("environment.attention", "sdpa", id="attention"),
    pytest.param("decoding", {"greedy": True, "temperature": 0, "top_p": 1, "top_k": 0, "physical_batch": 2},
                 id="greedy"),
    pytest.param("boundary_checks", list(BOUNDARY_CHECKS), id="every-boundary-check"),
    pytest.param("software.torch", None, id="software-unpinned"),
    pytest.param("hardware.tensor_parallel", 1, id="tensor-parallel"),
])
def test_defaults(minimal, path, expected):
    value = minimal.settings
    for key in path.split("."):
        value = value[key]
    assert value == expected, f"default of {path}: {value!r}, expected {expected!r}"


def test_tf32_matmul_implies_high_matmul_precision(tmp_path, tiny_yaml):
    data = copy.deepcopy(tiny_yaml)
    data["precisions"]["bf16"] = {"dtype": "bfloat16", "tf32_matmul": True}
    flags = load_contract(write(tmp_path, data)).cells["bf16"]
    assert flags.float32_matmul_precision == "high", f"float32_matmul_precision {flags.float32_matmul_precision!r}"


# ---------------------------------------------------------------------------------------------
# extends: the child states only what differs


BASE = {"name": "base", "environment": {"device": "cpu", "cpu_threads": 2, "attention": "eager"},
        "decoding": {"physical_batch": 2}, "caps": {"branch": 4, "merge": 3, "answer": 2},
        "precisions": {"bf16": {"dtype": "bfloat16", "cudnn_tf32": True}, "fp32": {"dtype": "float32"}},
        "banned_tokens": [1, 2], "gates": {"crossing": {"suffix_divergence_allowed": {"bf16": True}}}}
CHILD = {"extends": "../base/base.yaml", "name": "child", "caps": {"branch": 9}, "banned_tokens": [7],
         "precisions": {"fp32": {"sdpa_backend": "math"}}, "bank": {"rows": 5}}


def write_yaml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    root = tmp_path_factory.mktemp("extends")
    write_yaml(root / "base" / "base.yaml", BASE)
    return load_contract(write_yaml(root / "site" / "child.yaml", CHILD))


@pytest.mark.parametrize(("get", "expected"), [
    pytest.param(lambda c: c.name, "child", id="scalar-overridden"),
    pytest.param(lambda c: c.caps, Caps(9, 3, 2), id="mapping-merged-key-by-key"),
    pytest.param(lambda c: c.banned_tokens, (7,), id="list-replaced"),
    pytest.param(lambda c: (c.attention, c.cpu_threads), ("eager", 2), id="untouched-section-inherited"),
    pytest.param(lambda c: c.cells["bf16"].cudnn_tf32, True, id="sibling-precision-inherited"),
    pytest.param(lambda c: (c.cells["fp32"].dtype, c.cells["fp32"].sdpa_backend), ("float32", "math"),
                 id="nested-key-added"),
    pytest.param(lambda c: c.bank["rows"], 5, id="new-section"),
    pytest.param(lambda c: "extends" in c.raw, False, id="raw-without-extends"),
])
def test_extends_merges(child, get, expected):
    assert get(child) == expected, f"merged contract: got {get(child)!r}, expected {expected!r}"


def test_extends_digest_is_that_of_the_merged_contract(child, tmp_path):
    flat = copy.deepcopy(BASE) | {"name": "child", "banned_tokens": [7], "bank": {"rows": 5}}
    flat["caps"]["branch"] = 9
    flat["precisions"]["fp32"]["sdpa_backend"] = "math"
    assert load_contract(write_yaml(tmp_path / "flat.yaml", flat)).digest == child.digest, (
        "a contract that extends another differs in digest from the same contract written out flat"
    )


def test_extends_chains_through_three_files(tmp_path):
    write_yaml(tmp_path / "base.yaml", BASE)
    write_yaml(tmp_path / "middle.yaml", {"extends": "base.yaml", "caps": {"merge": 8}})
    leaf = load_contract(write_yaml(tmp_path / "leaf.yaml", {"extends": "middle.yaml", "name": "leaf"}))
    assert (leaf.name, leaf.caps) == ("leaf", Caps(4, 8, 2)), f"three-file chain: {leaf.name}, {leaf.caps}"


@pytest.mark.parametrize(("files", "chain"), [
    pytest.param({"a.yaml": "a.yaml"}, "a.yaml -> a.yaml", id="self"),
    pytest.param({"a.yaml": "b.yaml", "b.yaml": "a.yaml"}, "a.yaml -> b.yaml -> a.yaml", id="two-files"),
    pytest.param({"a.yaml": "b.yaml", "b.yaml": "c.yaml", "c.yaml": "b.yaml"}, "a.yaml -> b.yaml -> c.yaml -> b.yaml",
                 id="loop-below-the-start"),
])
def test_extends_cycle_names_the_chain(tmp_path, files, chain):
    for name, base in files.items():
        write_yaml(tmp_path / name, {"extends": base, "name": name})
    one_line_error(tmp_path / "a.yaml", rf"a\.yaml: extends cycle: {re.escape(chain)}$")


@pytest.mark.parametrize(("extends", "pattern"), [
    pytest.param("missing.yaml", r"child\.yaml: extends: no contract file .*missing\.yaml$", id="missing-base"),
    pytest.param(["base.yaml"], r"child\.yaml: extends: expected str \(a contract path relative to this file\), "
                 r"got list \['base\.yaml'\]$", id="not-a-string"),
])
def test_bad_extends(tmp_path, extends, pattern):
    one_line_error(write_yaml(tmp_path / "child.yaml", {"extends": extends, "name": "child"}), pattern)


def test_malformed_base_names_the_base_file(tmp_path):
    (tmp_path / "base.yaml").write_text("name: [1\n", encoding="utf-8")
    child = write_yaml(tmp_path / "child.yaml", {"extends": "base.yaml"})
    with pytest.raises(ConfigError, match=r"base\.yaml: malformed YAML at line 2: "):
        load_contract(child)


def test_an_error_in_the_merged_contract_names_the_extending_file(tmp_path):
    write_yaml(tmp_path / "base.yaml", BASE)
    child = write_yaml(tmp_path / "child.yaml", {"extends": "base.yaml", "caps": {"answer": 0}})
    one_line_error(child, r"child\.yaml: caps\.answer: expected an integer from 1 to 1000000, got 0$")


# ---------------------------------------------------------------------------------------------
# docs/contract.md documents every key of the schema


def schema_paths(node, path: str = ""):
    """Every leaf and keyed mapping of the schema, as docs/contract.md spells it (precisions.<precision>.dtype)."""
    if isinstance(node, Section):
        for key, child in node.keys.items():
            yield from schema_paths(child, f"{path}.{key}" if path else key)
        return
    yield path
    if isinstance(node, KeyedBy | Named) and isinstance(node.value, Section):
        yield from schema_paths(node.value, f"{path}.<{node.noun}>")


@pytest.mark.parametrize("path", [pytest.param(p, id=p) for p in schema_paths(SCHEMA)])
def test_docs_name_every_key(path):
    docs = (REPO / "docs" / "contract.md").read_text(encoding="utf-8")
    assert f"`{path}`" in docs, f"docs/contract.md does not document `{path}`"


def test_a_yaml_merge_key_is_plain_yaml_not_a_duplicate(tmp_path, repo):
    """`<<: *anchor` merges a mapping and lets keys after it override it; only a key written twice by hand is
    refused."""
    text = (f"extends: {repo / 'contracts' / 'cpu-tiny.yaml'}\nname: merge\n"
            "cells:\n  f16: &half {dtype: float16}\n  f16b: {<<: *half, sdpa_backend: math}\n")
    path = tmp_path / "merge.yaml"
    path.write_text(text, encoding="utf-8")
    cells_ = load_contract(path).cells
    assert (cells_["f16b"].dtype, cells_["f16b"].sdpa_backend) == ("float16", "math"), cells_["f16b"]
    path.write_text(text + "  f16b: {dtype: float32}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"duplicate key 'f16b'"):
        load_contract(path)
