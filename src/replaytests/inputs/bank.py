"""Problems, frozen prefix banks and their manifests (docs/protocol.md §10).

A bank is JSONL, one frozen boundary prefix z per row; its manifest records the bank's sha256,
the model's, the tokenizer's and the contract it was frozen under.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replaytests import __version__
from replaytests.errors import BankError, ConfigError, control_character, short
from replaytests.files import dumps, jsonl_objects, lookup, read_json, read_text, sha256_file, sha256_json, write_set
from replaytests.inputs import models
from replaytests.inputs.contract import Contract
from replaytests.inputs.models import TOKENIZER_FILES

if TYPE_CHECKING:  # the engine's grammar, passed in: the inputs never import the engine
    from replaytests.engine.protocol import Grammar

BANK_SCHEMA = "replaytests.bank/1"
MANIFEST_SCHEMA = "replaytests.bank-manifest/2"  # 2: the model digest covers its config, the tokenizer's every file
MODEL_FILES = ("config.json", "generation_config.json")  # beside the weights: they decide the numbers too


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    expected_answer: str | None


@dataclass(frozen=True)
class BankRow:
    id: str
    tokens: list[int]
    roles: list[int]
    expected_answer: str | None

    @property
    def prefix_len(self) -> int:
        return len(self.tokens)

    def to_json(self) -> dict:
        return {"schema": BANK_SCHEMA, "id": self.id, "tokens": self.tokens, "roles": self.roles,
                "expected_answer": self.expected_answer, "prefix_len": self.prefix_len}


def _read_jsonl(path: Path, what: str) -> list[tuple[str, dict]]:
    text = read_text(path, what, BankError)
    objects = [(f"{path}:{number}", obj) for number, obj in jsonl_objects(path, text, BankError)]
    if not objects:
        raise BankError(f"{path}: no {what} rows")
    return objects


def _field(obj: dict, key: str, kind: type | tuple, where: str):
    if key not in obj:
        raise BankError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind) or (isinstance(obj[key], bool) and kind is not bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise BankError(f"{where}: field {key!r} has type {type(obj[key]).__name__}, expected {names}")
    return obj[key]


MAX_ID = 200  # characters: a row id names test ids, records and report lines


def _row_id(obj: dict, where: str) -> str:
    """A row's id as the suite names it: non-empty, at most MAX_ID characters, no control character."""
    row_id = str(_field(obj, "id", (str, int), where))
    problem = ("is empty" if not row_id.strip() else f"has {len(row_id)} characters, more than {MAX_ID}"
               if len(row_id) > MAX_ID else f"holds a {found}" if (found := control_character(row_id)) else None)
    if problem:
        raise BankError(f"{where}: field 'id' {problem}; expected a name of printable characters")
    return row_id


def _expected_answer(obj: dict, where: str) -> str | None:
    answer = obj.get("expected_answer")
    if answer is not None and not isinstance(answer, str):
        raise BankError(f"{where}: field 'expected_answer' must be a string or null, got {answer!r}")
    return answer


def read_problems(path: Path) -> list[Problem]:
    problems = []
    for where, obj in _read_jsonl(path, "problem"):
        problems.append(Problem(_row_id(obj, where),
                                _field(obj, "prompt", str, where), _expected_answer(obj, where)))
    _check_unique([p.id for p in problems], path)
    return problems


def read_bank(path: Path, grammar: Grammar, max_positions: int, suffix_room: int) -> list[BankRow]:
    """Read and validate every row: types, the block grammar, roles and the position budget."""
    rows = []
    for where, obj in _read_jsonl(path, "bank"):
        row_id = _row_id(obj, where)
        where = f"{where} (row {row_id})"
        tokens = _field(obj, "tokens", list, where)
        roles = _field(obj, "roles", list, where)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens + roles):
            raise BankError(f"{where}: fields 'tokens' and 'roles' must hold integers only")
        derived = grammar.parse(tokens, where)
        if roles != derived:
            index = next((i for i, (a, b) in enumerate(zip(roles, derived, strict=False)) if a != b),
                         min(len(roles), len(derived)))
            found = roles[index] if index < len(roles) else "missing"
            wanted = derived[index] if index < len(derived) else "nothing (z ends at <|merge|>)"
            raise BankError(f"{where}: field 'roles'[{index}] is {found}, the block grammar gives {wanted}")
        if len(tokens) + suffix_room > max_positions:
            raise BankError(f"{where}: field 'tokens' has {len(tokens)} tokens; with room for the suffix "
                            f"({suffix_room}) that exceeds the model's {max_positions} positions")
        rows.append(BankRow(row_id, tokens, roles, _expected_answer(obj, where)))
    _check_unique([r.id for r in rows], path)
    return rows


def read_prefixes(path: Path) -> dict[str, tuple[list[int], list[int]]]:
    """Each row's id -> (tokens, roles), read without the model's grammar (what a record names by row id; the
    z digest a record carries says whether it is the z this run consumed)."""
    rows = []
    for where, obj in _read_jsonl(path, "bank"):
        row_id = _row_id(obj, where)
        tokens, roles = _field(obj, "tokens", list, where), _field(obj, "roles", list, where)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens + roles):
            raise BankError(f"{where} (row {row_id}): fields 'tokens' and 'roles' must hold integers only")
        rows.append((row_id, (tokens, roles)))
    _check_unique([row_id for row_id, _ in rows], path)
    return dict(rows)


def _check_unique(ids: list[str], path: Path) -> None:
    seen = set()
    for row_id in ids:
        if row_id in seen:
            raise BankError(f"{path}: duplicate row id {row_id!r}")
        seen.add(row_id)


def manifest_path(bank: Path) -> Path:
    return bank.with_name(bank.name.removesuffix(".jsonl") + ".manifest.json")


def file_digests(model_dir: Path, names: tuple[str, ...] = (), pattern: str | None = None) -> dict[str, str]:
    """sha256 of each named file that exists, and of each file matching `pattern`, by name. A model that is
    one file (a GGUF: weights, configuration and tokenizer in one) is that file."""
    if model_dir.is_file():
        return {model_dir.name: sha256_file(model_dir, "model", ConfigError)}
    paths = [model_dir / name for name in names if (model_dir / name).exists()]  # a FIFO is refused, not left out
    paths += sorted(model_dir.glob(pattern)) if pattern else []
    return {path.name: sha256_file(path, "model file", ConfigError) for path in sorted(paths)}


def model_digest(model_dir: Path) -> dict:
    """The files that make the model's numbers (config, generation config, every weight file) and
    one sha256 over their names and digests."""
    files = file_digests(model_dir, MODEL_FILES, "*.safetensors")
    return {"files": files, "sha256": sha256_json(files)}


def model_digest_of(files: dict[str, str]) -> str:
    """model_digest's sha256 of a directory whose files have these digests (a prepared model's recorded
    ones): the same files, the same sha256."""
    return sha256_json({name: digest for name, digest in sorted(files.items())
                        if name in MODEL_FILES or Path(name).match("*.safetensors")})


def tokenizer_digest(model_dir: Path, delimiter_ids: list[int]) -> dict:
    """Every tokenizer file and the delimiter ids resolved from them, and one sha256 over both."""
    files = file_digests(model_dir, TOKENIZER_FILES)
    return {"files": files, "delimiter_ids": list(delimiter_ids),
            "sha256": sha256_json({"files": files, "delimiters": list(delimiter_ids)})}


def write_bank(path: Path, rows: list[BankRow], model_dir: Path, grammar: Grammar, contract: Contract,
               cell: str, platform: dict) -> None:
    """Write the bank and its manifest (with the platform the rows were generated on) as one pair: neither
    replaces what was there unless both are written."""
    text = "".join(dumps(row.to_json(), sort_keys=True) + "\n" for row in rows)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "bank": path.name,
        "bank_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "rows": len(rows),
        "prefix_len": {"min": min(r.prefix_len for r in rows), "max": max(r.prefix_len for r in rows)},
        "model": {"path": models.label(model_dir) or os.path.relpath(model_dir, path.parent),
                  **model_digest(model_dir)},
        "tokenizer": tokenizer_digest(model_dir, list(grammar.delims.all_ids)),
        "contract": {"name": contract.name, "sha256": contract.digest, "caps": vars(contract.caps),
                     "cache": contract.cache, "visibility": contract.visibility},
        "precision": cell,
        "platform": platform,
        "replaytests_version": __version__,
    }
    write_set({path: text, manifest_path(path): dumps(manifest, indent=2, sort_keys=True) + "\n"})


def read_manifest(bank: Path) -> dict:
    """The bank's manifest, as written (nothing compared yet)."""
    path = manifest_path(bank)
    if not path.exists():
        raise ConfigError(f"{path}: bank manifest not found (freeze the bank with `replaytests freeze`)")
    manifest = read_json(path, "bank manifest", ConfigError)
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise ConfigError(f"{path}: field 'schema' is {short(manifest.get('schema'))}, expected {MANIFEST_SCHEMA!r} "
                          "(an earlier manifest's model digest covers the weights only): freeze the bank again "
                          "with `replaytests freeze`")
    if not bank.is_file():
        raise ConfigError(f"{bank}: bank not found beside its manifest {path.name}")
    for dotted, kind in MANIFEST_FIELDS.items():
        if not isinstance(value := manifest_field(manifest, dotted, bank), kind):
            raise ConfigError(f"{path}: field {dotted!r} must be {_KINDS[kind]}, got {short(value)} (freeze the bank "
                              "again)")
    return manifest


_MISSING = object()
# The manifest's fields its readers take without a default (the integrity checks, the run's header, whether
# live generation re-freezes the bank): checked once, as it is read.
MANIFEST_FIELDS = {"bank_sha256": str, "model.sha256": str, "model.files": dict, "tokenizer.sha256": str,
                   "tokenizer.files": dict, "tokenizer.delimiter_ids": list, "precision": str, "contract.caps": dict}
_KINDS = {str: "a string", list: "a list", dict: "an object"}


def manifest_field(manifest: dict, dotted: str, bank: Path):
    """manifest['a']['b'] for 'a.b'; a ConfigError naming the manifest where it is missing."""
    value = lookup(manifest, *dotted.split("."), default=_MISSING)
    if value is _MISSING:
        raise ConfigError(f"{manifest_path(bank)}: manifest has no field {dotted!r} (freeze the bank again)")
    return value


def changed_since_frozen(where: Path, what: str, field: str, actual: str, recorded: str, noun: str) -> str:
    """The one-line message for an input that no longer matches what the manifest recorded."""
    since = "it" if noun == "bank" else "the bank"
    return (f"{where}: {what} {actual} differs from manifest field {field!r} {recorded}; "
            f"the {noun} changed since {since} was frozen")


