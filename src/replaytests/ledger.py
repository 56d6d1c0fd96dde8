"""The ledger: one JSON object per (family, row, precision), the public, versioned run output.

Schema `replaytests.ledger/1` (see docs/ledger.md):
  schema, family, row, precision, prefix_len, status ("ok" | "excluded"), reason (excluded only),
  expected_answer, arms: {arm: {suffix, answer, correct, cache_digest, logits_digest, z_sha256}},
  comparisons: {"A~B": {§5 metrics}}.
"""

from __future__ import annotations

import json
from pathlib import Path

from replaytests.errors import LedgerError
from replaytests.files import write_jsonl_atomic

SCHEMA = "replaytests.ledger/1"
KEY_FIELDS = ("family", "row", "precision")


def key(record: dict) -> tuple[str, str, str]:
    return tuple(str(record[f]) for f in KEY_FIELDS)


def merge(records: list[dict]) -> list[dict]:
    """Deduplicate records by key (a row computed twice must agree), sorted by key."""
    by_key: dict[tuple, dict] = {}
    for record in records:
        k = key(record)
        if k in by_key and by_key[k] != record:
            raise LedgerError(f"ledger record {'/'.join(k)} was computed twice with different results")
        by_key[k] = record
    return [by_key[k] for k in sorted(by_key)]


def write_ledger(path: Path, records: list[dict]) -> None:
    write_jsonl_atomic(path, merge(records))


def read_ledger(path: Path) -> list[dict]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise LedgerError(f"{path}: cannot read ledger: {exc.strerror}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LedgerError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            found = record.get("schema") if isinstance(record, dict) else type(record).__name__
            raise LedgerError(f"{path}:{number}: field 'schema' is {found!r}, expected {SCHEMA!r}")
        records.append(record)
    return records
