"""replaytests.contract: loading the YAML reproducibility contract (SPEC §9); every error one line."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from replaytests.contract import load_contract
from replaytests.errors import ConfigError
from replaytests.protocol import Caps


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
# The committed contracts


def test_cpu_tiny_contract_loads(repo):
    c = load_contract(repo / "contracts" / "cpu-tiny.yaml")
    got = {
        "name": c.name, "device": c.device, "cpu_threads": c.cpu_threads, "attention": c.attention,
        "physical_batch": c.physical_batch, "caps": c.caps, "precisions": sorted(c.precisions),
        "bf16 dtype": c.precisions["bf16"].dtype, "fp32 dtype": c.precisions["fp32"].dtype,
        "fp32 matmul precision": c.precisions["fp32"].float32_matmul_precision,
        "allowed": c.suffix_divergence_allowed, "delimiters": c.delimiters, "banned": c.banned_tokens,
    }
    expected = {
        "name": "cpu-tiny", "device": "cpu", "cpu_threads": 1, "attention": "sdpa", "physical_batch": 2,
        "caps": Caps(branch=32, merge=24, answer=8), "precisions": ["bf16", "fp32"],
        "bf16 dtype": "bfloat16", "fp32 dtype": "float32", "fp32 matmul precision": "highest",
        "allowed": {"bf16": True, "fp32": False}, "delimiters": {}, "banned": (),
    }
    wrong = {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    assert not wrong, f"cpu-tiny contract fields (got, expected): {wrong}"
    assert re.fullmatch(r"[0-9a-f]{64}", c.digest), f"contract digest {c.digest!r} is not a sha256"


def test_paper_contract_loads(repo):
    path = repo / "contracts" / "paper-b200.yaml"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    c = load_contract(path)
    got = (c.name, c.device, c.caps, c.physical_batch, c.suffix_divergence_allowed,
           c.precisions["bf16"].tf32_matmul, c.precisions["bf16"].cudnn_tf32,
           c.precisions["fp32"].tf32_matmul, c.precisions["fp32"].cudnn_tf32,
           c.precisions["fp32"].float32_matmul_precision)
    expected = ("paper-b200", "cuda", Caps(768, 512, 64), 2, {"bf16": True, "fp32": False},
                False, True, False, False, "highest")
    assert got == expected, f"paper-b200 contract (SPEC §9): got {got}, expected {expected}"


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
    pytest.param(drop("precisions"), r": missing required field 'precisions'$", id="precisions"),
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
    pytest.param(put(0, "caps", "branch"), r": caps\.branch: expected a positive integer, got 0$", id="caps.branch=0"),
    pytest.param(put(-1, "caps", "branch"), r": caps\.branch: expected a positive integer, got -1$",
                 id="caps.branch=-1"),
    pytest.param(put(0, "caps", "merge"), r": caps\.merge: expected a positive integer, got 0$", id="caps.merge=0"),
    pytest.param(put(-1, "caps", "answer"), r": caps\.answer: expected a positive integer, got -1$",
                 id="caps.answer=-1"),
    pytest.param(put(0, "environment", "cpu_threads"),
                 r": environment\.cpu_threads: expected a positive integer, got 0$", id="cpu_threads=0"),
    pytest.param(put(-2, "decoding", "physical_batch"),
                 r": decoding\.physical_batch: expected a positive integer, got -2$", id="physical_batch=-2"),
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
                 r": precisions\.fp32\.dtype: expected bfloat16 or float32, got 'float64'$", id="dtype-float64"),
    pytest.param(put(True, "precisions", "bf16", "tf32"),
                 r": precisions\.bf16: unknown field 'tf32'; expected one of \[", id="unknown-flag"),
    pytest.param(put({"<|bogus|>": "x"}, "delimiters"),
                 r"contract\.yaml: delimiters: unknown delimiter '<\|bogus\|>'; expected one of ",
                 id="unknown-delimiter"),
]


@pytest.mark.parametrize("name", [pytest.param("fp16", id="fp16"), pytest.param("bfloat16", id="dtype-as-name"),
                                  pytest.param("FP32", id="upper-case")])
def test_unknown_precision_name(tmp_path, tiny_yaml, name):
    data = copy.deepcopy(tiny_yaml)
    data["precisions"][name] = {"dtype": "float32"}
    one_line_error(write(tmp_path, data),
                   rf": precisions: unknown precision '{name}'; expected one of bf16, fp32$")


def test_unreadable_contract_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    one_line_error(path, r"nope\.yaml: cannot read contract: No such file or directory$")


def test_unreadable_contract_is_a_directory(tmp_path):
    path = tmp_path / "dir.yaml"
    path.mkdir()
    one_line_error(path, r"dir\.yaml: cannot read contract: Is a directory$")


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
