"""Fail-closed input integrity: a run uses the bank, model and tokenizer its bank's manifest recorded.

A bank whose sha256 changed, a model whose digest changed, a tokenizer whose delimiter ids changed:
each is refused with a message naming what changed, unless the user accepts that change by name
(`--accept-changed=bank|model|tokenizer`); an accepted change is returned so the report records it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.bank import changed_since_frozen, manifest_field, model_digest, read_manifest
from replaytests.contract import suggest
from replaytests.errors import ConfigError
from replaytests.files import sha256_file
from replaytests.options import ACCEPT_OPTION, OVERRIDES


@dataclass(frozen=True)
class Integrity:
    manifest: dict
    overridden: list[str] = field(default_factory=list)  # one line per accepted change
    actual: dict = field(default_factory=dict)  # the inputs used: bank and model sha256, tokenizer delimiter ids


def _short(value: object) -> str:
    return f"{value[:12]}…" if isinstance(value, str) else str(value)


def verify_inputs(bank: Path, model_dir: Path, delimiter_ids: list[int],
                  accept: frozenset[str] = frozenset()) -> Integrity:
    """Compare the bank, the model's weights and the tokenizer's delimiter ids with the manifest."""
    unknown = sorted(set(accept) - set(OVERRIDES))
    if unknown:
        raise ConfigError(f"{ACCEPT_OPTION}: unknown input {unknown[0]!r}; {suggest(unknown[0], list(OVERRIDES))}")
    manifest = read_manifest(bank)
    # (override name, file at fault, what, manifest field, the input's value): computed one at a time,
    # so that a refused bank costs no hashing of the weights.
    checks: list[tuple[str, Path, str, str, Callable[[], object]]] = [
        ("bank", bank, "bank sha256", "bank_sha256", lambda: sha256_file(bank)),
        ("model", model_dir, "model sha256", "model.sha256", lambda: model_digest(model_dir)),
        ("tokenizer", model_dir, "tokenizer delimiter-id list", "tokenizer.delimiter_ids", lambda: list(delimiter_ids)),
    ]
    overridden, actual = [], {}
    for name, where, what, key, compute in checks:
        recorded, actual[name] = manifest_field(manifest, key, bank), compute()
        if recorded != actual[name]:
            change = changed_since_frozen(where, what, key, _short(actual[name]), _short(recorded), name)
            if name not in accept:
                raise ConfigError(f"{change}; refused (pass {ACCEPT_OPTION}={name} to use it anyway; "
                                  "the report records it)")
            overridden.append(f"{change}; accepted with {ACCEPT_OPTION}={name}")
    return Integrity(manifest, overridden, actual)
