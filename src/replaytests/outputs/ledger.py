"""The ledger: one JSON object per (family, row, cell), the public, versioned run output (docs/ledger.md).

Its records' fields, their types and the version each came with are written once, as the result types of
outputs/records.py; this module appends, merges, writes and reads the lines, and refuses a line that is not
a record there, naming the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from replaytests.errors import LedgerError, short
from replaytests.files import jsonl_objects, read_text, write_jsonl_atomic
from replaytests.outputs.records import READABLE, SCHEMA, Record, RecordError

__all__ = ["KEY_FIELDS", "READABLE", "SCHEMA", "append_record", "key", "label", "merge", "parse_versioned_jsonl",
           "read_appended", "read_ledger", "record_line", "record_problem", "write_ledger"]

KEY_FIELDS = ("family", "row", "precision")


def key(record: dict) -> tuple[str, str, str]:
    return tuple(str(record[f]) for f in KEY_FIELDS)


def label(record: dict) -> str:
    """A record's key as messages name it, `family/row/precision` (a field it lacks shows as None)."""
    return "/".join(str(record.get(f)) for f in KEY_FIELDS)


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


def append_record(path: Path, record: dict) -> None:
    """Append one record to a run's records file as one line, as soon as it is computed: several
    processes (xdist workers) append to one file, each line written whole under an exclusive lock and
    flushed to disk, so a run that is stopped keeps every record it finished. A write cut short (a full
    disk) is taken back, and a line left unfinished by a process that died while writing it is ended
    first, so that it never swallows the next record."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = b"\n" + line
        try:
            if os.write(fd, line) != len(line):
                raise OSError(errno.ENOSPC, "a write cut short (is the disk full?)")
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def record_line(line: str) -> dict | None:
    """The record one line of a records file holds, or None where the line is torn (not a JSON object)."""
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def read_appended(path: Path) -> tuple[list[dict], list[int]]:
    """The records appended to a records file (none if it is absent), and the numbers of its torn lines:
    lines cut short by a process that died or a disk that filled while writing them. A torn line is not a
    record; every whole line around it still is."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    lines = text.split("\n")
    torn = [number for number, line in enumerate(lines, start=1) if line.strip() and record_line(line) is None]
    cut = set(torn)
    kept = "\n".join("" if number in cut else line for number, line in enumerate(lines, start=1))
    return parse_versioned_jsonl(path, kept, READABLE, LedgerError), torn


def parse_versioned_jsonl(path: Path, text: str, schema: str | tuple[str, ...], error: type[Exception],
                          problem: Callable[[dict], str | None] | None = None) -> list[dict]:
    """One JSON object per line, each with `"schema"` one of `schema` and, given `problem` (what makes
    an object unreadable, or None), readable; anything else is `error` naming the file and the line."""
    schemas = (schema,) if isinstance(schema, str) else schema
    objects = []
    for number, value in jsonl_objects(path, text, error):
        if value.get("schema") not in schemas:
            raise error(f"{path}:{number}: field 'schema' is {short(value.get('schema'))}, expected "
                        f"{' or '.join(map(repr, schemas))}")
        if problem is not None and (found := problem(value)):
            raise error(f"{path}:{number}: {found}")
        objects.append(value)
    return objects


def record_problem(value: dict) -> str | None:
    """What makes an object unreadable as a ledger record (records.Record names the field), or None."""
    try:
        Record.from_json(value)
    except RecordError as exc:
        return f"ledger record {label(value)}: {exc}"
    return None


def read_ledger(path: Path, problem: Callable[[dict], str | None] | None = None) -> list[dict]:
    """A ledger's records, each a readable record (record_problem) and, given `problem`, one it accepts; an
    unreadable one is a LedgerError naming the file, the line and the field."""
    def unreadable(value: dict) -> str | None:
        return record_problem(value) or (problem(value) if problem else None)

    return parse_versioned_jsonl(path, read_text(path, "ledger", LedgerError), READABLE, LedgerError, unreadable)
