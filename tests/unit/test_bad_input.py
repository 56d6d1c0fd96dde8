"""Bad input, as a hostile user gives it, to the pytest plugin and to the `replaytests` command.

Every case must stop before any model work with a non-zero exit and one line that names the culprit
(file, field or option), print no traceback, and leave every file that existed before byte-identical:
the case's own workspace (a copy of the embedded model, bank and contract) and the repository's
fixtures and contracts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from replaytests.cli import main
from replaytests.inputs.bank import manifest_path
from replaytests.inputs.options import DEFAULT_BANK, DEFAULT_CONTRACT, DEFAULT_MODEL, REPO, Options
from replaytests.outputs.stats import wilson

USAGE = pytest.ExitCode.USAGE_ERROR


class Workspace(NamedTuple):
    """Copies of the embedded inputs a case may break, in a directory of its own."""

    root: Path
    model: Path
    bank: Path
    contract: Path

    def contract_with(self, text: str, name: str = "bad.yaml") -> Path:
        path = self.root / name
        path.write_text(f"extends: {DEFAULT_CONTRACT}\nname: bad\n{text}", encoding="utf-8")
        return path

    def model_with(self, name: str, edit: Callable[[Path], None]) -> Path:
        copy = self.root / name
        shutil.copytree(self.model, copy)
        edit(copy)
        return copy

    def write(self, name: str, text: str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path


@pytest.fixture
def ws(tmp_path) -> Workspace:
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, model)
    bank = tmp_path / "banks" / "tiny.jsonl"
    bank.parent.mkdir()
    shutil.copy(DEFAULT_BANK, bank)
    shutil.copy(manifest_path(DEFAULT_BANK), manifest_path(bank))
    return Workspace(tmp_path, model, bank, tmp_path / "contract.yaml")


def _config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def _truncate(path: Path) -> None:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _bank_row(ws: Workspace, edit: Callable[[dict], None]) -> Path:
    lines = ws.bank.read_text().splitlines()
    row = json.loads(lines[0])
    edit(row)
    path = ws.root / "edited" / "tiny.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    shutil.copy(manifest_path(ws.bank), manifest_path(path))
    return path


def _bank_text(ws: Workspace, edit: Callable[[str], str]) -> Path:
    """The bank with its first line's text edited (what json.dumps cannot write: a key twice)."""
    lines = ws.bank.read_text().splitlines()
    path = ws.write("edited/tiny.jsonl", "\n".join([edit(lines[0]), *lines[1:]]) + "\n")
    shutil.copy(manifest_path(ws.bank), manifest_path(path))
    return path


def _named(ws: Workspace, name: str) -> Path:
    """A contract named `name` (a YAML double-quoted string: escapes such as \\n and \\e apply)."""
    return ws.write("bad.yaml", f'extends: {DEFAULT_CONTRACT}\nname: "{name}"\n')


def _manifest_fifo(ws: Workspace) -> Path:
    bank = ws.write("b/x.jsonl", ws.bank.read_text())
    os.mkfifo(bank.parent / "x.manifest.json")
    return bank


def _huge_tokenizer(path: Path) -> None:
    with open(path / "tokenizer.json", "r+b") as handle:  # sparse: 300 MiB that take no disk
        handle.truncate(300 << 20)


def _manifest(ws: Workspace, edit: Callable[[dict], None]) -> Path:
    manifest = json.loads(manifest_path(ws.bank).read_text())
    edit(manifest)
    manifest_path(ws.bank).write_text(json.dumps(manifest))
    return ws.bank


def _bank_with_manifest(ws: Workspace, manifest: str) -> Path:
    ws.write("b/x.manifest.json", manifest)
    return ws.write("b/x.jsonl", ws.bank.read_text())


def _root_with_run(ws: Workspace, name: str) -> Path:
    ws.write(f"r/{name}/ledger.jsonl", "")
    return ws.write("r/.replaytests-root", "").parent


# 9 levels of 9 aliases: 9**9 strings if anything expanded it (the 72 MB error line).
ALIAS_BOMB = "description: [&a0 [x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)) + "]\n"


def contract(text: str) -> Callable[[Workspace], list[str]]:
    return lambda w: ["--contract", str(w.contract_with(text))]


class Case(NamedTuple):
    args: Callable[[Workspace], list[str]]  # options after the command
    line: str  # a regex the single error line must match
    command: str = "pytest"  # or a `replaytests` subcommand
    env: dict[str, str] | None = None  # environment variables the case sets


def _poison(value: float, name: str = "model.norm.weight") -> Callable[[Path], None]:
    """A model edit: one weight tensor's first values set to `value` (NaN, inf)."""
    def edit(path: Path) -> None:
        from safetensors.torch import load_file, save_file

        weights = load_file(path / "model.safetensors")
        weights[name].view(-1)[:3] = value
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return edit


def _weights_fifo(path: Path) -> None:
    """The weights a FIFO: every reader of it (a digest, the loader) would block for ever."""
    (path / "model.safetensors").unlink()
    os.mkfifo(path / "model.safetensors")


def _template_fifo(path: Path) -> None:
    """A chat template that is a FIFO: the tokenizer's loader would block on it for ever."""
    (path / "chat_template.jinja").unlink(missing_ok=True)
    os.mkfifo(path / "chat_template.jinja")


def _drop_tensor(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


def _interrupted(ws: Workspace, source: Path | None = None) -> Path:
    """A copy of a finished run (the committed tiny baseline) whose run.json says it was interrupted."""
    run = ws.root / "interrupted"
    run.mkdir(exist_ok=True)
    source = source or DEFAULT_BASELINE_DIR
    shutil.copy(source / "ledger.jsonl", run / "ledger.jsonl")
    meta = json.loads((source / "run.json").read_text())
    meta["run"] = (meta.get("run") or {}) | {"interrupted": True}
    (run / "run.json").write_text(json.dumps(meta))
    return run


def _fifo(ws: Workspace, name: str) -> Path:
    path = ws.root / name
    os.mkfifo(path)
    return path


def _sparse(ws: Workspace, name: str) -> Path:
    path = ws.root / name
    with path.open("wb") as handle:
        handle.truncate(2 << 30)  # 2 GiB of nothing, on no disk
    return path


def _extends_chain(ws: Workspace, length: int) -> Path:
    """contract 0 extends 1 extends ... extends the default contract: `length` links."""
    for n in range(length, -1, -1):
        parent = f"c{n + 1}.yaml" if n < length else str(DEFAULT_CONTRACT)
        ws.write(f"c{n}.yaml", f"extends: {parent}\n")
    return ws.root / "c0.yaml"


def _root_with(ws: Workspace, make: Callable[[Path], None]) -> Path:
    """A report root (marked) where `make` put something in the way."""
    root = ws.root / "root"
    root.mkdir()
    (root / ".replaytests-root").touch()
    make(root)
    return root


def _rows_only(ws: Workspace, name: str, row: str) -> Path:
    """A bare ledger (no run.json) holding the committed baseline's records of one row."""
    lines = [line for line in (DEFAULT_BASELINE_DIR / "ledger.jsonl").read_text().splitlines()
             if json.loads(line)["row"] == row]
    return ws.write(f"{name}/ledger.jsonl", "\n".join(lines) + "\n")


PYTEST = {
    # the families without the plugin that gives them their options and fixtures
    "plugin-disabled": Case(lambda w: ["-p", "no:replaytests"], r"the replaytests pytest plugin is disabled "
                            r"\(-p no:replaytests\)"),
    # row selections and shards
    "rows-zero": Case(lambda w: ["--rows", "0"], r"--rows 0: selects no row"),
    "rows-reversed": Case(lambda w: ["--rows", "5:2"], r"--rows 5:2: selects no row"),
    "rows-past-the-end": Case(lambda w: ["--rows", "100:110"], r"--rows 100:110: reaches past the bank's 48 rows"),
    "rows-count-past-the-end": Case(lambda w: ["--rows", "60"],
                                    r"--rows 60: reaches past the bank's 48 rows \(expected N <= 48"),
    "rows-slice-past-the-end": Case(lambda w: ["--rows", "40:60"], r"--rows 40:60: reaches past the bank's 48 rows"),
    "rows-start-past-the-end": Case(lambda w: ["--rows", "60:"], r"--rows 60:: selects no row of the bank's 48"),
    "precision-twice": Case(lambda w: ["--precision", "bf16", "--replay-precision=fp32"],
                            r"--replay-precision: given 2 times \(bf16, fp32\); give it once"),
    "contract-twice": Case(lambda w: ["--contract", str(DEFAULT_CONTRACT), "--contract", str(DEFAULT_CONTRACT)],
                           r"--replay-contract: given 2 times .*; give it once"),
    "rows-negative": Case(lambda w: ["--rows", "-1"], r"--rows: expected a count N or a slice A:B of non-negative"),
    "rows-words": Case(lambda w: ["--rows", "x:y"], r"--rows: expected a count N or a slice A:B"),
    "shard-zero": Case(lambda w: ["--shard", "0/2"], r"--shard: expected i/N with 1 <= i <= N"),
    "shard-past-count": Case(lambda w: ["--shard", "3/2"], r"--shard: expected i/N with 1 <= i <= N"),
    "shard-words": Case(lambda w: ["--shard", "a/b"], r"--shard: expected i/N"),
    "rows-superscript": Case(lambda w: ["--rows", "\u00b2"], r"--rows: expected a count N or a slice A:B"),
    "rows-arabic-indic": Case(lambda w: ["--rows", "\u0663:\u0665"], r"--rows: expected a count N or a slice"),
    "rows-huge": Case(lambda w: ["--rows", "9" * 40], r"--rows: expected a count N or a slice A:B"),
    "shard-superscript": Case(lambda w: ["--shard", "\u00b2/3"], r"--shard: expected i/N with 1 <= i <= N"),
    # devices
    "device-nonsense": Case(lambda w: ["--device", "nonsense"], r"--device 'nonsense': expected cpu, cuda, cuda:N"),
    "device-mps-absent": Case(lambda w: ["--device", "mps"], r"--device mps: this machine has no MPS device"),
    "device-cpu-index": Case(lambda w: ["--device", "cpu:3"], r"--device cpu:3: expected cpu, cuda, cuda:N or mps"),
    # contracts
    "contract-missing": Case(lambda w: ["--contract", str(w.root / "none.yaml")], r"none\.yaml: cannot read contract"),
    "contract-malformed": Case(lambda w: ["--contract", str(w.write("c.yaml", "name: [x\n"))],
                               r"c\.yaml: malformed YAML at line 2"),
    "contract-duplicate-key": Case(contract("caps: {branch: 4}\ncaps: {merge: 2}\n"),
                                   r"bad\.yaml: malformed YAML at line 4: duplicate key 'caps'"),
    "contract-list-key": Case(contract("caps: {[1]: 2}\n"),
                              r"bad\.yaml: malformed YAML at line 3: a key is a list, expected a name or a number"),
    "contract-physical-batch-one": Case(contract("decoding: {physical_batch: 1}\n"),
                                        r"bad\.yaml: decoding\.physical_batch: expected an integer from 2 to 64 "
                                        r"\(.*1 would compare nothing\), got 1"),
    "contract-alias-bomb": Case(contract(ALIAS_BOMB), r"bad\.yaml: description: expected str, got list \[\[.{0,120}$"),
    "contract-threads-bound": Case(contract("environment: {cpu_threads: 100000}\n"),
                                   r"bad\.yaml: environment\.cpu_threads: expected an integer from 1 to 1024"),
    "contract-fifo": Case(lambda w: ["--contract", str(_fifo(w, "c.yaml"))],
                          r"c\.yaml: cannot read contract: a FIFO, not a regular file"),
    "contract-device": Case(lambda w: ["--contract", "/dev/zero"], r"/dev/zero: cannot read contract: a device"),
    "contract-directory": Case(lambda w: ["--contract", str(w.root)], r"cannot read contract: a directory"),
    "contract-sparse-huge": Case(lambda w: ["--contract", str(_sparse(w, "big.yaml"))],
                                 r"big\.yaml: cannot read contract: \d+ bytes, more than the 256 MiB"),
    "contract-deep-yaml": Case(contract("description: " + "[" * 5000 + "]" * 5000 + "\n"),
                               r"bad\.yaml: malformed YAML: nested too deeply"),
    "contract-extends-chain": Case(lambda w: ["--contract", str(_extends_chain(w, 40))],
                                   r"c0\.yaml: extends chain longer than 32 contracts"),
    "contract-gate-nan": Case(contract("gates: {transplant: {donor_recovery: .nan}}\n"),
                              r"bad\.yaml: gates\.transplant\.donor_recovery: expected .*from 0 to 1, got nan"),
    "contract-gate-infinite": Case(contract("gates: {transplant: {donor_recovery: -.inf}}\n"),
                                   r"bad\.yaml: gates\.transplant\.donor_recovery: expected .*from 0 to 1, got -inf"),
    "contract-huge-integer": Case(contract("caps: {branch: " + "9" * 5001 + "}\n"),
                                  r"bad\.yaml: malformed YAML: Exceeds the limit \(4300 digits\)"),
    "contract-zero-controls": Case(contract("panels: {replication: {min_exact_controls: 0}}\n"),
                                   r"bad\.yaml: panels\.replication\.min_exact_controls: expected .*from 1 to"),
    "contract-empty-transplant-panel": Case(contract("panels: {transplant: {divergent: 0, exact_controls: 0}}\n"),
                                            r"bad\.yaml: panels\.transplant\.divergent: expected .*from 1 to"),
    "contract-unknown-key": Case(contract("cpas: {branch: 4}\n"), r"bad\.yaml: unknown field 'cpas'; did you mean"),
    "contract-cpu-isa": Case(contract("environment: {cpu_isa: AVX-512}\n"),
                             r"bad\.yaml: environment\.cpu_isa: expected DEFAULT, AVX2 or AVX512"),
    "contract-delimiter-tokens": Case(
        contract("delimiters: {'<|prompt|>': 'two words'}\n"),
        r"tiny-qwen2 \(--model\) with contract .*bad\.yaml: delimiter '<\|prompt\|>' \(as 'two words'\) is \d+ "
        r"tokens"),
    "contract-banned-outside": Case(contract("banned_tokens: [99999]\n"),
                                    r"bad\.yaml: banned_tokens: ids \[99999\] are outside the vocabulary"),
    "contract-boundary-checks": Case(contract("boundary_checks: [padding]\n"),
                                     r"bad\.yaml: boundary_checks: expected each of token_ids"),
    # banks and manifests
    "bank-missing": Case(lambda w: ["--bank", str(w.root / "none.jsonl")], r"none\.jsonl: cannot read bank: No such"),
    "bank-row-grammar": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r["tokens"].pop()))],
                             r"edited/tiny\.jsonl:1 \(row tiny-000\): field 'tokens' must end with the single "),
    "bank-row-id-empty": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(id="")))],
                              r"tiny\.jsonl:1: field 'id' is empty; expected a name of printable characters"),
    "bank-row-id-control": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(id="r\x1b[2Jx")))],
                                r"tiny\.jsonl:1: field 'id' holds a control character U\+001B at index 1"),
    "bank-row-id-newline": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(id="r0\nPASS")))],
                                r"field 'id' holds a control character U\+000A at index 2"),
    "bank-row-id-long": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(id="r" * 201)))],
                             r"field 'id' has 201 characters, more than 200"),
    "bank-duplicate-key": Case(lambda w: ["--bank", str(_bank_text(w, lambda line: '{"id": "dup", ' + line[1:]))],
                               r"tiny\.jsonl:1: field 'id' written twice in one object \(JSON would keep the last\)"),
    "bank-row-nan": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(prefix_len=float("nan"))))],
                         r"edited/tiny\.jsonl:1: field 'prefix_len' is NaN; expected a finite number \(strict JSON"),
    "contract-name-newline": Case(lambda w: ["--contract", str(_named(w, "bad\\nverdict: PASS (999 passed)"))],
                                  r"bad\.yaml: name: expected 1 to 200 characters, none a control character"),
    "contract-name-escape": Case(lambda w: ["--contract", str(_named(w, "bad\\e[31m"))],
                                 r"bad\.yaml: name: expected 1 to 200 characters, none a control character"),
    "manifest-fifo": Case(lambda w: ["--bank", str(_manifest_fifo(w))],
                          r"x\.manifest\.json: cannot read bank manifest: a FIFO, not a regular file"),
    "manifest-deep": Case(lambda w: ["--bank", str(_bank_with_manifest(w, "[" * 100000 + "]" * 100000))],
                          r"x\.manifest\.json: cannot read bank manifest: JSON nested too deeply"),
    "tokenizer-sparse-huge": Case(lambda w: ["--model", str(w.model_with("m", _huge_tokenizer)), "--accept-changed",
                                             "model"],
                                  r"tokenizer\.json: cannot read a tokenizer or config file: 314572800 bytes, more "
                                  r"than the 256 MiB"),
    "bank-fifo": Case(lambda w: ["--bank", str(_fifo(w, "b.jsonl"))], r"b\.jsonl: cannot read bank: a FIFO"),
    "bank-deep-json": Case(lambda w: ["--bank", str(w.write("deep/tiny.jsonl", "[" * 100000 + "]" * 100000 + "\n"))],
                           r"deep/tiny\.jsonl:1: JSON nested too deeply"),
    "bank-row-type": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(tokens="123")))],
                          r"edited/tiny\.jsonl:1 \(row tiny-000\): field 'tokens' has type str, expected list"),
    "bank-changed": Case(lambda w: ["--bank", str(_bank_row(w, lambda r: r.update(expected_answer="x")))],
                         r"edited/tiny\.jsonl: bank sha256 .* the bank changed since it was frozen; refused"),
    "manifest-old-schema": Case(lambda w: ["--bank", str(_manifest(w, lambda m: m.update(schema="x/1")))],
                                r"tiny\.manifest\.json: field 'schema' is 'x/1', expected 'replaytests\.bank-manifest"),
    "manifest-without-contract": Case(lambda w: ["--bank", str(_manifest(w, lambda m: m.pop("contract")))],
                                      r"tiny\.manifest\.json: manifest has no field 'contract\.caps' \(freeze the "
                                      r"bank again\)"),
    "manifest-sha-a-number": Case(lambda w: ["--bank", str(_manifest(w, lambda m: m["model"].update(sha256=7)))],
                                  r"tiny\.manifest\.json: field 'model\.sha256' must be a string, got 7"),
    "manifest-files-a-list": Case(lambda w: ["--bank", str(_manifest(w, lambda m: m["model"].update(
        files=["config.json"], sha256="0" * 64)))], r"tiny\.manifest\.json: field 'model\.files' must be an object, "
                                                     r"got \['config\.json'\]"),
    "manifest-not-json": Case(lambda w: ["--bank", str(_bank_with_manifest(w, "{"))],
                              r"x\.manifest\.json: cannot read bank manifest: not valid JSON"),
    # models
    "model-missing": Case(lambda w: ["--model", str(w.root / "none")], r"none: model directory not found"),
    # a path is quoted with its control characters escaped: no fake line, no escape code reaches the terminal
    "model-path-controls": Case(lambda w: ["--model", str(w.root / "a\x1b[31m\nverdict: PASS")],
                                r"a\\x1b\[31m\\nverdict: PASS: model directory not found"),
    "model-no-config": Case(lambda w: ["--model", str(w.model_with("m", lambda p: (p / "config.json").unlink()))],
                            r"/m: no config\.json"),
    "model-pickle-only": Case(lambda w: ["--model", str(w.model_with("m", lambda p: (p / "model.safetensors").rename(
                              p / "pytorch_model.bin")))], r"/m: no \*\.safetensors weights \(only safetensors"),
    "model-truncated": Case(lambda w: ["--model", str(w.model_with("m", _truncate)), "--accept-changed", "model"],
                            r"m/model\.safetensors: not a readable safetensors file"),
    "model-no-tokenizer": Case(lambda w: ["--model", str(w.model_with("m", lambda p: (p / "tokenizer.json").unlink()))],
                               r"/m: no tokenizer \(tokenizer\.json"),
    "model-small-vocab": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(p, vocab_size=100))),
                                         "--accept-changed", "model"],
                              r"m/config\.json: vocab_size 100 does not hold the delimiter ids \[257"),
    "model-config-a-list": Case(lambda w: ["--model", str(w.model_with("m", lambda p: (p / "config.json").write_text(
        "[" + (p / "config.json").read_text() + "]")))], r"m/config\.json: cannot load config: "),
    "model-vocab-words": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(p, vocab_size="big")))],
                              r"m/config\.json: cannot load config: .*vocab_size"),
    "model-hidden-indivisible": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(
        p, hidden_size=250, head_dim=None)))], r"m/config\.json: hidden_size 250 is not a multiple of num_attention"),
    "model-no-layers": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(
        p, num_hidden_layers=0, layer_types=[])))], r"m/config\.json: num_hidden_layers is 0; expected a positive"),
    "model-negative-hidden": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(p, hidden_size=-64)))],
                                  r"m/config\.json: hidden_size is -64; expected a positive integer"),
    "model-heads-indivisible": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(
        p, num_attention_heads=3)))], r"m/config\.json: num_attention_heads 3 is not a multiple of num_key_value"),
    "model-config-changed": Case(lambda w: ["--model", str(w.model_with("m", lambda p: _config(p, rope_theta=5.0)))],
                                 r"/m: model sha256 .* the model changed since the bank was frozen \(config\.json "
                                 r"changed\); refused \(pass --accept-changed=model"),
    "model-tokenizer-changed": Case(
        lambda w: ["--model", str(w.model_with("m", lambda p: (p / "tokenizer_config.json").write_text("{}")))],
        r"/m: tokenizer sha256 .* \(tokenizer_config\.json changed\); refused \(pass --accept-changed=tokenizer"),
    "model-weights-fifo": Case(lambda w: ["--model", str(w.model_with("m", _weights_fifo))],
                               r"m/model\.safetensors: cannot read weights: a FIFO, not a regular file"),
    "model-template-fifo": Case(lambda w: ["--model", str(w.model_with("m", _template_fifo))],
                                r"m/chat_template\.jinja: cannot read a tokenizer or config file: a FIFO, not a "
                                r"regular file"),
    "later-model-missing": Case(lambda w: ["--replication-model", str(w.root / "none")], r"none: model directory not"),
    "later-model-truncated": Case(lambda w: ["--replication-model", str(w.model_with("m", _truncate))],
                                  r"m/model\.safetensors: not a readable safetensors file"),
    "later-model-small-vocab": Case(lambda w: ["--replication-model", str(w.model_with("m", lambda p: _config(
        p, vocab_size=100)))], r"m/config\.json: vocab_size 100 does not hold .*\(--replication-model\)"),
    # report directories
    "report-dir-baseline": Case(lambda w: ["--report-dir", str(Options().baseline_ledger.parent)],
                                r"--report-dir .*cpu-tiny[-a-z]*: holds the run's baseline"),
    "report-dir-fixtures": Case(lambda w: ["--report-dir", str(REPO / "fixtures")], r"--report-dir .*fixtures: holds"),
    "report-dir-in-model": Case(lambda w: ["--model", str(w.model), "--accept-changed", "model", "--report-dir",
                                           str(w.model / "out")], r"--report-dir .*model/out: holds the run's model"),
    "report-dir-a-file": Case(lambda w: ["--report-dir", str(w.write("f.txt", "x"))],
                              r"--report-dir .*f\.txt: exists and is not a directory"),
    "report-dir-under-a-file": Case(lambda w: ["--report-dir", str(w.write("g.txt", "x") / "sub")],
                                    r"--report-dir .*g\.txt/sub: cannot write there"),
    "report-dir-foreign": Case(lambda w: ["--report-dir", str(w.write("mine/notes.txt", "keep").parent)],
                               r"--report-dir .*mine: a non-empty directory that is not a replaytests report root"),
    "report-dir-name-too-long": Case(lambda w: ["--report-dir", str(w.root / ("r" * 300))],
                                     r"--report-dir .*: cannot use it: File name too long"),
    "lock-a-link": Case(lambda w: ["--report-dir", str(_root_with(w, lambda r: (r / ".lock").symlink_to(
        w.write("precious.txt", "keep me")))), "--rows", "1"], r"cannot lock .*/\.lock: a link, not a lock file"),
    "latest-a-file": Case(lambda w: ["--report-dir", str(_root_with(w, lambda r: (r / "latest").write_text("x"))),
                                     "--rows", "1"], r"root/latest is not a link replaytests made \(a file\)"),
    "latest-dangling": Case(lambda w: ["--report-dir", str(_root_with(w, lambda r: (r / "latest").symlink_to(
        "gone"))), "--rows", "1"], r"root/latest points at 'gone', not at a run directory here"),
    "run-name-dangling-link": Case(lambda w: ["--report-dir", str(_root_with(w, lambda r: (r / "x").symlink_to(
        w.root / "nowhere"))), "--run-name", "x"], r"--run-name x: .*root/x exists already"),
    "run-name-latest": Case(lambda w: ["--run-name", "latest"], r"--run-name 'latest': expected letters, digits"),
    "run-name-taken": Case(lambda w: ["--report-dir", str(_root_with_run(w, "x")), "--run-name", "x"],
                           r"--run-name x: .*/r/x exists already"),
    # baselines and overrides
    "baseline-missing": Case(lambda w: ["--baseline", str(w.root / "none.jsonl")], r"none\.jsonl: cannot read ledger"),
    "baseline-malformed": Case(lambda w: ["--baseline", str(w.write("base.jsonl", '{"schema": 1}\n'))],
                               r"base\.jsonl:1: field 'schema' is 1, expected"),
    # what would pass having checked nothing, or checked the wrong thing
    "model-nan-weights": Case(lambda w: ["--model", str(w.model_with("m", _poison(float("nan"))))],
                              r"m/model\.safetensors: tensor 'model\.norm\.weight' holds 3 NaN and 0 infinite values"),
    "model-inf-weights": Case(lambda w: ["--model", str(w.model_with("m", _poison(float("inf"))))],
                              r"m/model\.safetensors: tensor 'model\.norm\.weight' holds 0 NaN and 3 infinite"),
    "model-deleted-tensor": Case(lambda w: ["--model", str(w.model_with("m", _drop_tensor)), "--accept-changed",
                                            "model"], r"/m: 1 weight tensor\(s\) missing from the checkpoint .*: "
                                                      r"model\.norm\.weight"),
    "aten-capability-unknown": Case(lambda w: [], r"ATEN_CPU_CAPABILITY='banana' in the environment: torch would "
                                                  r"ignore it", env={"ATEN_CPU_CAPABILITY": "banana"}),
    "aten-capability-uppercase": Case(lambda w: [], r"ATEN_CPU_CAPABILITY='AVX2' in the environment",
                                      env={"ATEN_CPU_CAPABILITY": "AVX2"}),
    "onednn-isa-unknown": Case(lambda w: [], r"ONEDNN_MAX_CPU_ISA='avx9' in the environment: .* expected one of "
                                             r"DEFAULT", env={"ONEDNN_MAX_CPU_ISA": "avx9"}),
    "baseline-other-bank": Case(lambda w: ["--baseline", str(REPO / "fixtures" / "ledgers" / "cpu-smollm2")],
                                r"--baseline .*cpu-smollm2/ledger\.jsonl: none of its \d+ records is one this run "
                                r"computes \(its rows smollm2-000, .*; this run.s tiny-000, .*\): nothing would be "
                                r"audited"),
    "baseline-other-rows": Case(lambda w: ["--baseline", str(_rows_only(w, "b", "tiny-000")), "--rows", "1:2"],
                                r"--baseline .*b/ledger\.jsonl: none of its \d+ records is one this run computes "
                                r"\(its rows tiny-000; this run's tiny-001, cells bf16, fp32\)"),
    "baseline-interrupted": Case(lambda w: ["--baseline", str(_interrupted(w))],
                                 r"--baseline .*interrupted/ledger\.jsonl: an interrupted run .*pass "
                                 r"--accept-interrupted"),
    "shard-empty": Case(lambda w: ["--rows", "1", "--shard", "2/2"],
                        r"--shard 2/2: this shard holds none of the 1 selected row\(s\)"),
    "strict-with-drift": Case(lambda w: ["--contract", str(w.contract_with("software: {torch: '0.0.1'}\n")),
                                         "--strict-contract"],
                              r"--strict-contract: the environment differs from contract bad in \d+ field\(s\)"),
}

COMMANDS = {
    "compare-comparisons-null": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_ledger(w, comparisons=None))],
                                     r"bad\.jsonl:1: ledger record .* field 'comparisons': expected an object, "
                                     r"got None",
                                     "compare"),
    "compare-comparisons-empty": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_ledger(w, comparisons={}))],
                                      r"bad\.jsonl:1: .* field 'comparisons': expected a non-empty object .*, got \{\}",
                                      "compare"),
    "compare-comparisons-text": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_ledger(w, comparisons="x"))],
                                     r"bad\.jsonl:1: .* field 'comparisons': expected an object, got 'x'",
                                     "compare"),
    "compare-missing": Case(lambda w: [str(w.root / "none.jsonl"), str(DEFAULT_BASELINE_DIR)],
                            r"none\.jsonl: cannot read ledger", "compare"),
    "history-without-families": Case(lambda w: ["show", str(_history(w, families=None))],
                                     r"h\.jsonl:1: field 'families' must be a dict", "history"),
    "history-numeric-date": Case(lambda w: ["show", str(_history(w, date=20261201))],
                                 r"h\.jsonl:1: field 'date' must be a str, got 20261201", "history"),
    "history-label-escape": Case(lambda w: ["show", str(_history(w, label="night\x1b]0;pwned\x07"))],
                                 r"h\.jsonl:1: field 'label' holds a control character U\+001B at index 5", "history"),
    "history-bad-date": Case(lambda w: ["show", str(_history(w, date="yesterday"))],
                             r"h\.jsonl:1: field 'date' is not an ISO 8601 date", "history"),
    "history-huge-integer": Case(lambda w: ["show", str(w.write("h.jsonl", '{"n": ' + "9" * 5000 + "}\n"))],
                                 r"h\.jsonl:1: not valid JSON \(Exceeds the limit \(4300 digits\) for integer",
                                 "history"),
    "compare-run-json-huge-integer": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(
        w, '{"n": ' + "9" * 5000 + "}"))], r"run\.json: cannot read run metadata: not valid JSON \(Exceeds the limit "
                                           r"\(4300 digits\)", "compare"),
    # a history line wrong deep inside: refused as it is read, naming the field, never a traceback
    "history-cell-digest-a-number": Case(lambda w: ["show", str(_history(w, cells={"bf16": 3}))],
                                         r"h\.jsonl:1: field 'cells\.bf16' must be a cell digest \(a string\), got 3$",
                                         "history"),
    "history-without-label": Case(lambda w: ["show", str(_history(w, label=None))],
                                  r"h\.jsonl:1: field 'label' must be a string or null, missing$", "history"),
    "history-pair-an-integer": Case(lambda w: ["show", str(_history_summary(w, pairs={"incremental~prefill": 3}))],
                                    r"h\.jsonl:1: field 'families\.crossing\.bf16\.pairs\.incremental~prefill' "
                                    r"must be an object of Wilson proportions, got 3$", "history"),
    "history-wilson-without-n": Case(lambda w: ["show", str(_history_summary(w, pairs={"incremental~prefill": {
        "suffix_divergence": {"k": 1, "rate": 0.5, "ci_low": 0.1, "ci_high": 0.9}}}))],
        r"h\.jsonl:1: field 'families\.crossing\.bf16\.pairs\.incremental~prefill\.suffix_divergence\.n' must "
        r"be a non-negative integer, missing$", "history"),
    "history-count-a-string": Case(lambda w: ["show", str(_history_summary(w, replicas_exact={"k": "12", "n": 12}))],
                                   r"h\.jsonl:1: field 'families\.crossing\.bf16\.replicas_exact\.k' must be a "
                                   r"non-negative integer, got '12'$", "history"),
    "history-rows-negative": Case(lambda w: ["show", str(_history_summary(w, rows=-1))],
                                  r"h\.jsonl:1: field 'families\.crossing\.bf16\.rows' must be a non-negative "
                                  r"integer, got -1$", "history"),
    "history-rate-missing": Case(lambda w: ["show", str(_history_summary(w, replicas_exact={"k": 1, "n": 2}))],
                                 r"h\.jsonl:1: field 'families\.crossing\.bf16\.replicas_exact\.rate' must be a "
                                 r"number from 0 to 1, missing$", "history"),
    "history-family-name-escape": Case(lambda w: ["show", str(_history(w, families={"x\x1b[2J": {}}))],
                                       r"h\.jsonl:1: field 'families': the name 'x\\x1b\[2J' holds a control "
                                       r"character U\+001B at index 1$", "history"),
    "history-html-empty-causal": Case(lambda w: ["show", str(_history(w, causal={"transplant": {}})), "--html",
                                                 str(w.root / "h.html")],
                                      r"h\.jsonl:1: field 'causal\.transplant\.follows_donor' must be an object of "
                                      r"Wilson proportions per direction, got None$", "history"),
    "history-replication-without-label": Case(lambda w: ["show", str(_history(w, causal={"replication": {
        "follows_donor": {}, "control_third": {}, "divergent": {"k": 0, "n": 0}}}))],
        r"h\.jsonl:1: field 'causal\.replication\.label' must be a string of printable characters, missing$",
        "history"),
    # run.json wrong deep inside: refused as it is read, naming the field
    "report-run-json-verdict-result": Case(lambda w: [str(_run_json(w, '{"verdict": {"result": 3}}')), "--out",
                                                      str(w.root / "out")],
                                           r"run\.json: field 'verdict\.result' must be a string, got 3$", "report"),
    "report-run-json-verdict-baseline": Case(lambda w: [str(_run_json(
        w, '{"verdict": {"result": "pass", "tests": {}, "failures": [], "baseline": ["b"]}}')), "--out",
        str(w.root / "out")], r"run\.json: field 'verdict\.baseline' must be a string, got \['b'\]$", "report"),
    "compare-run-json-verdict-tests": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(
        w, '{"verdict": {"result": "pass", "tests": {"passed": "12"}, "failures": []}}'))],
        r"run\.json: field 'verdict\.tests' must be an object of test counts per outcome, got \{'passed': '12'\}$",
        "compare"),
    "compare-run-json-verdict-failure": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(
        w, '{"verdict": {"result": "fail", "tests": {"failed": 1}, "failures": [{"check": "x"}]}}'))],
        r"run\.json: field 'verdict\.failures\[0\]' must be an object with the strings check and message, got "
        r"\{'check': 'x'\}$", "compare"),
    "compare-run-json-software-a-list": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(
        w, '{"environment": {"software": ["torch"], "hardware": {}}}'))],
        r"run\.json: field 'environment\.software' must be an object, got \['torch'\]$", "compare"),
    # an expected-state file's fields are printed in reason lines: no control character
    "compare-expected-escape": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(DEFAULT_BASELINE_DIR), "--expected", str(
        _expected(w, why="a\x1b[2Jb"))], r"e\.yaml: changes\[0\]: field 'why' holds a control character U\+001B at "
                                          r"index 1$", "compare"),
    "compare-expected-newline": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(DEFAULT_BASELINE_DIR), "--expected",
                                                str(_expected(w, family="crossing\nPASS"))],
                                     r"e\.yaml: changes\[0\]: field 'family' holds a control character U\+000A at "
                                     r"index 8$", "compare"),
    "freeze-out-a-directory": Case(lambda w: ["--out", str(w.root)], r"--out .*: is a directory; expected a file",
                                   "freeze"),
    "freeze-manifest-a-directory": Case(lambda w: ["--out", str(w.write("f/b.manifest.json/x", "") and
                                                                 w.write("f/b.jsonl", "an earlier bank\n"))],
                                        r"--out \(its manifest\) .*f/b\.manifest\.json: is a directory", "freeze"),
    "freeze-out-under-a-file": Case(lambda w: ["--out", str(w.write("o.txt", "x") / "b.jsonl")],
                                    r"--out .*o\.txt/b\.jsonl: cannot create", "freeze"),
    # a command that writes over a file the user has: refused unless --force says to replace it
    "freeze-over-a-bank": Case(lambda w: ["--out", str(w.bank)], r"--out .*banks/tiny\.jsonl: tiny\.jsonl and "
                               r"tiny\.manifest\.json exist already; pass --force to replace them, or another --out$",
                               "freeze"),
    "freeze-over-a-manifest": Case(lambda w: ["--out", str(w.write("f/b.manifest.json", "{}").with_name("b.jsonl"))],
                                   r"--out .*f/b\.jsonl: b\.manifest\.json exists already; pass --force to replace "
                                   r"it, or another --out$", "freeze"),
    "freeze-over-a-link": Case(lambda w: ["--out", str(_link(w, "l.jsonl"))], r"--out .*l\.jsonl: l\.jsonl exists "
                               r"already; pass --force", "freeze"),
    "history-html-over-a-page": Case(lambda w: ["show", str(_history(w)), "--html", str(w.write("p.html", "mine"))],
                                     r"--html .*p\.html: p\.html exists already; pass --force to replace it, or "
                                     r"another --html$", "history"),
    "report-force-through-a-link": Case(lambda w: [str(_planted_link(w)), "--force"],
                                        r"cannot write report: a symbolic link \(to .*bashrc\), never written through",
                                        "report"),
    "compare-run-json-deep": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(w, "[" * 100000 + "]" * 100000))],
                                  r"run\.json: cannot read run metadata: JSON nested too deeply", "compare"),
    "report-over-a-report": Case(lambda w: [str(_reported(w))], r"holds report\.json, report\.md, report\.html "
                                                                r"already; pass --out DIR", "report"),
    "report-empty-ledger": Case(lambda w: [str(w.write("e/ledger.jsonl", ""))], r"ledger\.jsonl: empty ledger",
                                "report"),
    # strict JSON: NaN and infinities are refused where they are read, and never written (report.json)
    "compare-ledger-nan": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_ledger_metric(w, "k_rel_l2", "NaN"))],
                               r"bad\.jsonl:1: field 'comparisons\.[^']+\.k_rel_l2' is NaN; expected a finite "
                               r"number \(strict JSON has no NaN or Infinity\)$", "compare"),
    "report-ledger-infinity": Case(lambda w: [str(_ledger_metric(w, "logits_max_abs", "-Infinity"))],
                                   r"bad\.jsonl:1: field 'comparisons\.[^']+\.logits_max_abs' is -Infinity; "
                                   r"expected a finite number", "report"),
    "report-ledger-overflow": Case(lambda w: [str(_ledger_metric(w, "v_max_abs", "1e999"))],
                                   r"bad\.jsonl:1: field 'comparisons\.[^']+\.v_max_abs' is 1e999; expected a "
                                   r"finite number", "report"),
    "report-mean-overflows": Case(lambda w: [str(_ledger_metric(w, "k_max_abs", "1.7e308", every=True))],
                                  r"report\.json: cannot write report: field 'families\.[^']+\.median' is inf; "
                                  r"strict JSON has no NaN or Infinity$", "report"),
    "compare-run-json-nan": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_run_json(
        w, '{\n  "schema": "replaytests.run/1",\n  "drift": [Infinity]\n}\n'))],
        r"run\.json:3: cannot read run metadata: field 'drift\[0\]' is Infinity; expected a finite number",
        "compare"),
    "history-nan": Case(lambda w: ["show", str(_history(w, families={"live": {"bf16": {
        "rows": float("nan"), "excluded": 0, "pairs": {}}}}))],
        r"h\.jsonl:1: field 'families\.live\.bf16\.rows' is NaN; expected a finite number", "history"),
    "compare-unrelated-runs": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(REPO / "fixtures/ledgers/cpu-smollm2")],
                                   r"the runs were made on other inputs \(the input bank: .*--across-inputs",
                                   "compare"),
    "compare-unrelated-across-inputs": Case(
        lambda w: [str(DEFAULT_BASELINE_DIR), str(REPO / "fixtures/ledgers/cpu-smollm2"), "--across-inputs"],
        r"no \(family, row, cell\) record in common \(baseline rows tiny-000, .*; new rows smollm2-000, .*"
        r"nothing to compare", "compare"),
    "compare-disjoint-rows": Case(lambda w: [str(_rows_only(w, "a", "tiny-000")), str(_rows_only(w, "b", "tiny-001"))],
                                  r"no \(family, row, cell\) record in common", "compare"),
    "compare-root-latest-a-file": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_root_with(
        w, lambda r: (r / "latest").write_text("x")))], r"root/latest is a file, not the link to a run", "compare"),
    "report-root-latest-a-file": Case(lambda w: [str(_root_with(w, lambda r: (r / "latest").write_text("x")))],
                                      r"root/latest is a file, not the link to a run", "report"),
    "compare-interrupted-new": Case(lambda w: [str(DEFAULT_BASELINE_DIR), str(_interrupted(w))],
                                    r"interrupted \(new\) is an interrupted run .*--accept-interrupted", "compare"),
    "compare-interrupted-baseline": Case(lambda w: [str(_interrupted(w)), str(DEFAULT_BASELINE_DIR)],
                                         r"interrupted \(baseline\) is an interrupted run", "compare"),
    "history-interrupted-night": Case(lambda w: ["append", str(_interrupted(w)), "--into", str(w.root / "h.jsonl")],
                                      r"interrupted: an interrupted run .*not a night of the history", "history"),
    "check-model-path-controls": Case(lambda w: ["--model", str(w.root / "m\x07\x9b2J")],
                                      r"m\\x07\\x9b2J: no config\.json|m\\x07\\x9b2J.*not found", "check-model"),
    "check-model-nan-weights": Case(lambda w: ["--model", str(w.model_with("m", _poison(float("nan"))))],
                                    r"m/model\.safetensors: tensor 'model\.norm\.weight' holds 3 NaN", "check-model"),
    "check-model-weights-fifo": Case(lambda w: ["--model", str(w.model_with("m", _weights_fifo))],
                                     r"m/model\.safetensors: cannot read weights: a FIFO, not a regular file",
                                     "check-model"),
    "check-model-deleted-tensor": Case(lambda w: ["--model", str(w.model_with("m", _drop_tensor))],
                                       r"/m: 1 weight tensor\(s\) missing from the checkpoint .*: model\.norm\.weight",
                                       "check-model"),
    "models-cache-a-file": Case(lambda w: ["prepare", "smollm2"], r"models prepare smollm2: cannot write the model "
                                r"cache .*cache\.txt/models .*set REPLAYTESTS_CACHE to a writable directory", "models",
                                env={"REPLAYTESTS_CACHE": "WS/cache.txt"}),
    "env-aten-capability-unknown": Case(lambda w: [], r"ATEN_CPU_CAPABILITY='banana' in the environment", "env",
                                        env={"ATEN_CPU_CAPABILITY": "banana"}),
    "env-contract-bound": Case(contract("environment: {cpu_threads: 100000}\n"),
                               r"bad\.yaml: environment\.cpu_threads: expected an integer from 1 to 1024", "env"),
}
# A finished run of the embedded default, the good side of a case: its committed baseline made on the Xeon (192
# records, 0.8 MB), not cpu-tiny/ (578 records, 14 MB, a second to read each time): the cases are about the bad side.
DEFAULT_BASELINE_DIR = REPO / "fixtures" / "ledgers" / "cpu-tiny-xeon"


def _ledger(ws: Workspace, **fields) -> Path:
    record = json.loads((DEFAULT_BASELINE_DIR / "ledger.jsonl").read_text().splitlines()[0]) | fields
    return ws.write("bad.jsonl", json.dumps(record) + "\n")


def _ledger_metric(ws: Workspace, name: str, text: str, every: bool = False) -> Path:
    """The committed baseline's first record (`every`: all its records), each comparison's metric `name`
    spelled `text` (a NaN, an infinity, a number past the float range)."""
    lines = (DEFAULT_BASELINE_DIR / "ledger.jsonl").read_text().splitlines()[: None if every else 1]
    return ws.write("e/bad.jsonl", "".join(re.sub(rf'"{name}": [^,}}]+', f'"{name}": {text}', line) + "\n"
                                           for line in lines))


def _history(ws: Workspace, **fields) -> Path:
    line = {"schema": "replaytests.history/1", "date": "2026-12-01T00:00:00", "label": "night", "ledger": "x",
            "ledger_sha256": "0" * 64, "families": {}} | fields
    return ws.write("h.jsonl", json.dumps({k: v for k, v in line.items() if v is not None}) + "\n")


def _history_summary(ws: Workspace, **fields) -> Path:
    """A history line whose one precision summary (crossing, bf16) is a valid one changed by `fields`."""
    summary = {"rows": 12, "excluded": 0, "replicas_exact": wilson(12, 12).to_json(),
               "pairs": {"incremental~prefill": {"suffix_divergence": wilson(3, 12).to_json()}}} | fields
    return _history(ws, families={"crossing": {"bf16": summary}})


def _expected(ws: Workspace, **fields) -> Path:
    """An expected-state file of one entry, changed by `fields`."""
    entry = {"family": "crossing", "precision": "fp32", "level": "bits", "why": "a known change"} | fields
    return ws.write("e.yaml", "schema: replaytests.expected/1\nchanges:\n  - " + json.dumps(entry) + "\n")


def _reported(ws: Workspace) -> Path:
    run = ws.root / "run"
    run.mkdir()
    shutil.copy(DEFAULT_BASELINE_DIR / "ledger.jsonl", run / "ledger.jsonl")
    for name in ("report.json", "report.md", "report.html"):
        (run / name).write_text("a report someone reads")
    return run


def _run_json(ws: Workspace, text: str) -> Path:
    """A copy of the committed baseline's run whose run.json is `text`."""
    run = _reported(ws)
    (run / "run.json").write_text(text)
    return run


def _planted_link(ws: Workspace) -> Path:
    """A run whose report.md is a link to a file of the user's (report --force must not write it)."""
    run = _reported(ws)
    (run / "report.md").unlink()
    (run / "report.md").symlink_to(ws.write("bashrc", "the user's own file\n"))
    return run


def _link(ws: Workspace, name: str) -> Path:
    """A link, dangling, where a command would write (what it names may appear later)."""
    link = ws.root / name
    link.symlink_to(ws.root / "nowhere")
    return link


def digests(*directories: Path) -> dict[str, str]:
    # Not the lock (a run writes it) nor a sparse file of gigabytes (a case's own input, never written).
    return {str(p): _sha256(p, s) for d in directories for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != ".lock" and (s := p.stat()).st_size < 1 << 26}


_HASHED: dict[Path, tuple[tuple[int, ...], str]] = {}  # a file's identity and times when hashed, and its sha256


def _sha256(path: Path, stat: os.stat_result) -> str:
    """The file's sha256; hashed again wherever its inode, size, modification or change time moved since. A
    write moves the change time, which no call sets back, so the repository's fixtures (100 MB) are hashed once
    a session instead of twice a case. Only a file whose change time is a second old is remembered: a write in
    the same clock tick as its last change would leave its times as they were."""
    seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if (known := _HASHED.get(path)) is not None and known[0] == seen:
        return known[1]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if time.time_ns() - stat.st_ctime_ns > 1_000_000_000:
        _HASHED[path] = (seen, digest)
    return digest


def protected(ws: Workspace) -> tuple[Path, ...]:
    return ws.root, REPO / "fixtures", REPO / "contracts"


@pytest.mark.parametrize("case", [pytest.param(c, id=name) for name, c in PYTEST.items()])
def test_bad_pytest_input_is_one_line_and_loses_nothing(pytester, ws, case, monkeypatch):
    for name, value in (case.env or {}).items():
        monkeypatch.setenv(name, value)
    args = case.args(ws)
    before = digests(*protected(ws))
    result = pytester.runpytest("--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", *args)
    err = [line for line in result.stderr.lines if line.strip()]
    assert result.ret == USAGE, f"exit {result.ret} for {args}:\n{result.stdout.str()[-2000:]}"
    assert len(err) == 1 and err[0].startswith("ERROR: "), f"not one line: {err}"
    assert re.search(case.line, err[0]), f"{err[0]!r} does not match {case.line!r}"
    assert len(err[0]) < 1000, f"an error line of {len(err[0])} characters"
    assert "Traceback" not in result.stdout.str() + result.stderr.str(), "a traceback reached the user"
    assert digests(*protected(ws)) == before, "a refused run changed files that existed before it"


@pytest.mark.parametrize("case", [pytest.param(c, id=name) for name, c in COMMANDS.items()])
def test_bad_command_input_is_one_line_and_loses_nothing(ws, case, monkeypatch):
    for name, value in (case.env or {}).items():
        if value.startswith("WS/"):  # a file of the case's own workspace
            value = str(ws.write(value.removeprefix("WS/"), "not a directory"))
        monkeypatch.setenv(name, value)
    args = [case.command, *case.args(ws)]
    before = digests(*protected(ws))
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(args)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == 4, f"exit {code} for {args}: {err.getvalue()!r}"
    assert len(lines) == 1 and lines[0].startswith("replaytests: error: "), f"not one line: {lines}"
    assert re.search(case.line, lines[0]), f"{lines[0]!r} does not match {case.line!r}"
    assert "Traceback" not in out.getvalue() + err.getvalue(), "a traceback reached the user"
    assert digests(*protected(ws)) == before, "a refused command changed files that existed before it"


def test_the_table_is_large_enough():
    assert len(PYTEST) + len(COMMANDS) >= 126, f"{len(PYTEST) + len(COMMANDS)} bad-input cases"
