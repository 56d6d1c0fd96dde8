"""Atomic writes: a reader sees the old file or the new one, never a half-written one. Bounded reads: every
reader takes a regular file only."""

import json
import os
import re
import stat
from pathlib import Path

import pytest

from conftest import within
from replaytests.engine.llamacpp import conversion
from replaytests.engine.llamacpp.hf_to_gguf import splits_as_gpt2
from replaytests.engine.llamacpp.runtime import check_gguf
from replaytests.errors import ConfigError, LedgerError
from replaytests.files import (
    NotStrictJSON,
    jsonl_objects,
    read_json,
    read_text,
    sha256_file,
    write_atomic,
    write_json_atomic,
    write_jsonl_atomic,
    write_set,
)
from replaytests.inputs import bank
from replaytests.outputs import history, ledger


def test_written_file_has_the_mode_open_would_give(tmp_path):
    path = tmp_path / "out.json"
    write_atomic(path, "{}\n")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, oct(path.stat().st_mode)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "ledger.jsonl"
    write_atomic(path, "old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "new \ud800\n")  # a lone surrogate cannot be encoded as UTF-8
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl"]


def test_a_set_is_written_whole_or_not_at_all(tmp_path):
    # report --force, a bank and its manifest: one file that cannot be written leaves every file as it was.
    old = {tmp_path / "report.json": "old json", tmp_path / "report.md": "old md"}
    for path, text in old.items():
        path.write_text(text)
    (tmp_path / "report.html").mkdir()
    with pytest.raises(IsADirectoryError):
        write_set({path: "new" for path in (*old, tmp_path / "report.html")})
    now = {path: path.read_text() for path in old}
    assert now == old, f"a set that failed changed files: {now}"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert not left, f"temporary files left behind: {left}"


def test_a_link_is_never_written_through(tmp_path):
    """report --force over a planted `report.md -> ~/.bashrc`: refused, the target and the link untouched, and
    no file of the set written (a link in the folders on the way, like reports/latest, is fine)."""
    target = tmp_path / "bashrc"
    target.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").symlink_to(target)
    (tmp_path / "latest").symlink_to(run)
    with pytest.raises(OSError, match=r"a symbolic link .*never written through"):
        write_set({tmp_path / "latest" / "report.json": "{}", tmp_path / "latest" / "report.md": "# x\n"})
    assert target.read_text() == "mine\n" and (run / "report.md").is_symlink(), "the link was followed or replaced"
    assert not (run / "report.json").exists(), "a file of the refused set was written"
    write_set({tmp_path / "latest" / "summary.md": "ok\n"})
    assert (run / "summary.md").read_text() == "ok\n", "a folder that is a link was not written through"


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _zero_link(tmp_path):
    path = tmp_path / "zero"
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize(("make", "kind"), [
    pytest.param(_fifo, "a FIFO", id="fifo"),            # would block the read for ever
    pytest.param(_zero_link, "a device", id="dev-zero"),  # would never end
    pytest.param(lambda tmp_path: tmp_path, "a directory", id="directory"),
])
@pytest.mark.parametrize("read", [
    pytest.param(lambda path: read_text(path, "x", ConfigError), id="read_text"),
    pytest.param(lambda path: sha256_file(path, "x"), id="sha256_file"),
])
def test_every_reader_refuses_what_is_not_a_regular_file(tmp_path, make, kind, read):
    path = make(tmp_path)
    outcome = within(10, lambda: read(path))
    assert isinstance(outcome, ConfigError), f"{kind}: {outcome!r}"
    assert re.fullmatch(rf"{re.escape(str(path))}: cannot read x: {kind}, not a regular file", str(outcome)), outcome



def test_read_text_reads_line_ends_as_text_mode_does(tmp_path):
    path = tmp_path / "crlf.yaml"
    path.write_bytes(b"a: 1\r\nb: 2\rc: 3\n")
    assert read_text(path, "x", ConfigError) == "a: 1\nb: 2\nc: 3\n"


def _fifo_named(tmp_path, name: str):
    os.mkfifo(tmp_path / name)
    return tmp_path


@pytest.mark.parametrize(("read", "expected"), [
    pytest.param(lambda d: check_gguf(_fifo_named(d, "m.gguf") / "m.gguf", "--model"),
                 "m.gguf: cannot read the model (--model): a FIFO, not a regular file", id="llamacpp-model"),
    pytest.param(lambda d: conversion._stored_width(_fifo_named(d, "config.json")),
                 "config.json: cannot read model config: a FIFO, not a regular file; a Hugging Face model directory "
                 "is expected", id="conversion-config"),
    pytest.param(lambda d: conversion._check_source(_fifo_named(d, "tokenizer.json")),
                 "tokenizer.json: cannot read a model file: a FIFO, not a regular file", id="conversion-source"),
    pytest.param(lambda d: conversion._matches(_fifo_named(d, "m.gguf.json") / "m.gguf.json", {}, d / "m.gguf"),
                 False, id="cached-conversion-record"),  # no match: the GGUF is made again, the record replaced
    pytest.param(lambda d: splits_as_gpt2(_fifo_named(d, "tokenizer.json")), False, id="converter-tokenizer"),
])
def test_every_reader_of_a_users_file_is_bounded(tmp_path, read, expected):
    """Readers outside files.py go through its bounded readers: a FIFO is one line (or no match), never a hang."""
    outcome = within(10, lambda: read(tmp_path))
    if isinstance(expected, bool):
        assert outcome is expected, f"{outcome!r}, expected {expected}"
    else:
        assert isinstance(outcome, ConfigError) and str(outcome).endswith(expected), f"{outcome!r}, expected {expected}"


def test_a_checkpoint_whose_weights_are_pickle_is_not_converted_to_gguf(tmp_path):
    """llama.cpp's converter falls back to torch.load of pytorch_model.bin where it finds no safetensors: refused
    before it runs, as the Hugging Face backend refuses to load one."""
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ConfigError, match=r": no \*\.safetensors weights \(only safetensors are converted, never "):
        conversion._check_source(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # the converter reads these, never the .bin beside them
    conversion._check_source(tmp_path)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("write", [write_json_atomic, lambda path, v: write_jsonl_atomic(path, [v])],
                         ids=["json", "jsonl"])
def test_a_writer_refuses_what_strict_json_cannot_hold(tmp_path, write, value):
    """json.dumps writes NaN and Infinity by default; no strict JSON parser reads them back."""
    path = tmp_path / "out.json"
    with pytest.raises(NotStrictJSON, match=rf"^field 'runs\[1\]\.drift' is {value}; strict JSON has no NaN"):
        write(path, {"runs": [{"drift": 0.5}, {"drift": value}]})
    assert not path.exists(), "a refused value was written"


SEPARATORS = {"LS": "\u2028", "PS": "\u2029", "NEL": "\u0085"}


@pytest.mark.parametrize("separator", SEPARATORS.values(), ids=SEPARATORS.keys())
@pytest.mark.parametrize("ending", ["\n", "\r\n"], ids=["LF", "CRLF"])
def test_a_jsonl_line_ends_at_a_newline_only(separator, ending):
    """str.splitlines also splits at U+2028, U+2029 and NEL, which JSON strings may hold raw."""
    text = ending.join(json.dumps({"id": f"r{i}", "answer": f"a{separator}b"}, ensure_ascii=False)
                       for i in range(3)) + ending
    objects = jsonl_objects(Path("x.jsonl"), text, LedgerError)
    assert [(n, o["answer"]) for n, o in objects] == [(n, f"a{separator}b") for n in (1, 2, 3)], objects


@pytest.mark.parametrize(("text", "field"), [
    ('{"a": NaN}', "field 'a' is NaN"),
    ('{"a": {"b": [0, Infinity]}}', r"field 'a\.b\[1\]' is Infinity"),
    ('{"a": "NaN", "b": -Infinity}', "field 'b' is -Infinity"),
    ('{"a": 1e999}', "field 'a' is 1e999"),
    ('{"a": -1234567e400}', "field 'a' is -1234567e400"),
])
def test_a_reader_refuses_what_strict_json_has_not(tmp_path, text, field):
    """Python's json reads NaN, Infinity and floats past the range (as infinities); strict JSON has none."""
    with pytest.raises(LedgerError, match=rf"^x\.jsonl:2: {field}; expected a finite number \(strict JSON"):
        jsonl_objects(Path("x.jsonl"), '{"ok": 1.5}\n' + text + "\n", LedgerError)
    path = tmp_path / "run.json"
    path.write_text('{\n  "ok": 1.5,\n  "bad": ' + text + "\n}\n")
    with pytest.raises(LedgerError, match=rf"run\.json:3: cannot read run: field 'bad\.{field[7:]}"):
        read_json(path, "run", LedgerError)


LEDGER = Path(__file__).resolve().parents[2] / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl"


def _ledger_lines(separator: str) -> list[str]:
    with LEDGER.open(encoding="utf-8") as lines:  # its first two lines, not its 14 MB
        first, second = (json.loads(next(lines)) for _ in range(2))
    arm = next(iter(first["arms"]))
    first["arms"][arm]["answer"] += separator
    return [json.dumps(first, ensure_ascii=False), json.dumps(second)]


def _history_lines(separator: str) -> list[str]:
    return [json.dumps({"schema": "replaytests.history/1", "date": f"2026-12-0{i}T00:00:00", "label": None,
                        "ledger": f"night{separator}{i}", "ledger_sha256": str(i) * 64, "families": {}},
                       ensure_ascii=False) for i in (1, 2)]


def _problem_lines(separator: str) -> list[str]:
    return [json.dumps({"id": f"p{i}", "prompt": f"2 + {i}{separator}?", "expected_answer": None},
                       ensure_ascii=False) for i in (1, 2)]


READERS = {  # each JSONL reader: the lines it reads (one with `separator` in a string), and the reader
    "ledger": (_ledger_lines, lambda path: ledger.read_ledger(path)),
    "records": (_ledger_lines, lambda path: ledger.read_appended(path)[0]),
    "history": (_history_lines, lambda path: history.read_history(path)),
    "problems": (_problem_lines, lambda path: bank.read_problems(path)),
}


@pytest.mark.parametrize("separator", SEPARATORS.values(), ids=SEPARATORS.keys())
@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_every_jsonl_reader_keeps_a_line_whole(tmp_path, reader, separator):
    make, read = reader
    path = tmp_path / "file.jsonl"
    path.write_text("\r\n".join(make(separator)) + "\r\n", encoding="utf-8")
    assert len(read(path)) == 2, "a line was split or lost"
