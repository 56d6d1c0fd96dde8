"""Fail-closed input integrity: a run uses the bank, model and tokenizer its bank's manifest recorded.

A bank whose sha256 changed, a model whose digest changed (its config, generation config or any
weight file), a tokenizer whose digest changed (any tokenizer file, or the delimiter ids resolved
from them): each is refused with a message naming what changed, unless the user accepts that change
by name (`--accept-changed=bank|model|tokenizer`); an accepted change is returned so the report
records it.

One change needs no flag: the GGUF file the bank's prepared model was dequantized from, known by the
sha256 this version of replaytests pins for it (`dequantized_from`). Its model and tokenizer digests differ
from the manifest's by construction; the delimiter ids it resolves must still be the manifest's, and the
run records the relation.

A conversion record beside a GGUF (`replaytests models gguf --type` writes one) is a claim, not evidence:
anyone can write one beside any bytes. It never accepts a change; where the change is accepted by name,
the accepted line quotes what the record claims (`conversion_claim`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.errors import ConfigError, control_character
from replaytests.files import lookup, read_json, sha256_file
from replaytests.inputs.bank import (
    changed_since_frozen,
    manifest_field,
    model_digest,
    model_digest_of,
    read_manifest,
    tokenizer_digest,
)
from replaytests.inputs.models import MODELS
from replaytests.inputs.options import ACCEPT_OPTION, OVERRIDES
from replaytests.inputs.schema import suggest

CONVERSION_RECORD = ".json"  # beside a GGUF `replaytests models gguf --type` made (engine/llamacpp/conversion.py)
RECORD_LIMIT = 1 << 16  # bytes: a conversion record is a few lines


@dataclass(frozen=True)
class Integrity:
    manifest: dict
    overridden: list[str] = field(default_factory=list)  # one line per accepted change
    actual: dict = field(default_factory=dict)  # the inputs used: bank, model and tokenizer sha256, delimiter ids


def _short(value: object) -> str:
    return f"{value[:12]}…" if isinstance(value, str) else str(value)


def _which(recorded: dict, actual: dict) -> str:
    """The files (and delimiter ids) two digests differ in, e.g. ' (config.json changed)'."""
    def entries(digest: dict) -> dict:
        return {**digest.get("files", {}), **({"delimiter ids": digest["delimiter_ids"]}
                                              if "delimiter_ids" in digest else {})}

    old, new = entries(recorded), entries(actual)
    changed = [f"{name} {'added' if name not in old else 'removed' if name not in new else 'changed'}"
               for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]
    return f" ({', '.join(changed)})" if changed else ""


def dequantized_from(model: Path, manifest: dict, bank: Path) -> str | None:
    """How the GGUF file `model` is the bank's own model, or None: the GGUF the bank's prepared model
    (`models:NAME`, its digest the one recorded for NAME) was dequantized from, by that file's sha256 as
    this version of replaytests pins it (nothing the user writes can make a file pass)."""
    label = str((manifest.get("model") or {}).get("path") or "")
    spec = MODELS.get(label.removeprefix("models:")) if label.startswith("models:") else None
    if not (spec and spec.gguf and model.is_file()):
        return None
    source = manifest_field(manifest, "model.sha256", bank)
    if spec.gguf.sha256 == sha256_file(model, "model", ConfigError) and model_digest_of(spec.files) == source:
        return f"the GGUF the bank's model {label} was dequantized from ({spec.gguf.distribution})"
    return None


def conversion_claim(model: Path, manifest: dict, bank: Path) -> str | None:
    """What the conversion record beside the GGUF file `model` claims, where it names the bank's model digest
    as its source and this file's sha256 as what it wrote, else None. A claim only: the record is a file
    like any other, so it is quoted where a change is accepted by name, never taken as the acceptance."""
    record = model.with_name(model.name + CONVERSION_RECORD)
    if not (model.is_file() and (record.exists() or record.is_symlink())):
        return None
    made = read_json(record, "conversion record", ConfigError, RECORD_LIMIT)
    quoted = (lookup(made, "type"), lookup(made, "llama_cpp_python"))  # they reach the report: short, plain text
    if not (lookup(made, "source_model_sha256") == manifest_field(manifest, "model.sha256", bank)
            and all(isinstance(v, str) and len(v) <= 40 and not control_character(v) for v in quoted)
            and lookup(made, "sha256") == sha256_file(model, "model", ConfigError)):
        return None
    return (f"its record {record.name} claims the bank's model converted to {quoted[0]} by llama.cpp's converter, "
            f"llama-cpp-python {quoted[1]}")


def _not_evidence(claim: str | None) -> str:
    return f"{claim}, but a record beside a file is not evidence; " if claim else ""


def verify_inputs(bank: Path, model_dir: Path, delimiter_ids: list[int],
                  accept: frozenset[str] = frozenset()) -> Integrity:
    """Compare the bank, the model and the tokenizer (with its delimiter ids) with the manifest."""
    unknown = sorted(set(accept) - set(OVERRIDES))
    if unknown:
        raise ConfigError(f"{ACCEPT_OPTION}: unknown input {unknown[0]!r}; {suggest(unknown[0], list(OVERRIDES))}")
    manifest = read_manifest(bank)
    # (override name, file at fault, manifest field, the input's digest): computed one at a time, so that a
    # refused bank costs no hashing of the weights.
    checks: list[tuple[str, Path, str, Callable[[], dict]]] = [
        ("bank", bank, "bank_sha256", lambda: {"sha256": sha256_file(bank, "bank", ConfigError)}),
        ("model", model_dir, "model.sha256", lambda: model_digest(model_dir)),
        ("tokenizer", model_dir, "tokenizer.sha256", lambda: tokenizer_digest(model_dir, delimiter_ids)),
    ]
    overridden, actual = [], {}
    derived = claim = None
    for name, where, key, compute in checks:
        recorded, digest = manifest_field(manifest, key, bank), compute()
        actual[name] = digest["sha256"]
        if recorded != digest["sha256"]:
            change = changed_since_frozen(where, f"{name} sha256", key, _short(digest["sha256"]), _short(recorded),
                                          name) + _which(manifest.get(name) if name != "bank" else {}, digest)
            if name == "model":
                derived = dequantized_from(model_dir, manifest, bank)
                claim = None if derived else conversion_claim(model_dir, manifest, bank)
            delimiters = manifest_field(manifest, "tokenizer.delimiter_ids", bank)
            if derived and name != "bank" and (name == "model" or list(delimiter_ids) == delimiters):
                overridden.append(f"{change}; accepted: {derived}")
                continue
            if name not in accept:
                raise ConfigError(f"{change}; refused ({_not_evidence(claim)}pass {ACCEPT_OPTION}={name} to use "
                                  "it anyway; the report records it)")
            overridden.append(f"{change}; accepted with {ACCEPT_OPTION}={name}" + (f" ({claim})" if claim else ""))
    actual["delimiter_ids"] = list(delimiter_ids)
    return Integrity(manifest, overridden, actual)
