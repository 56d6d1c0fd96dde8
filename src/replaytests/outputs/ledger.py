"""The ledger: one JSON object per (family, row, cell), the public, versioned run output (docs/ledger.md).

Its records' fields, their types and the version each came with are written once, as the result types of
outputs/records.py; this module appends, merges, writes and reads the lines, and refuses a line that is not
a record there, naming the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib
import json
import os
from collections.abc import Callable, Container
from pathlib import Path

from replaytests.errors import LedgerError, short
from replaytests.families.registry import FAMILIES
from replaytests.files import dumps, jsonl_lines, jsonl_objects, read_text, write_jsonl_atomic
from replaytests.outputs.records import KEY_FIELDS, READABLE, SCHEMA, Record, RecordError
from replaytests.outputs.rundir import ledger_of
from replaytests.outputs.shapes import SHAPES

__all__ = ["READABLE", "SCHEMA", "Record", "append_record", "cell_digests", "collate", "headline_problem", "merge",
           "parse_records", "read_appended", "read_ledger", "record_line", "versioned_objects", "write_ledger"]


def merge(records: list[Record]) -> list[Record]:
    """Deduplicate records by key (a row computed twice must agree), sorted by key."""
    by_key: dict[tuple, Record] = {}
    for record in records:
        if record.key in by_key and by_key[record.key] != record:
            raise LedgerError(f"ledger record {record.label} was computed twice with different results")
        by_key[record.key] = record
    return [by_key[k] for k in sorted(by_key)]


def write_ledger(path: Path, records: list[Record]) -> None:
    write_jsonl_atomic(path, [record.to_json() for record in merge(records)])


def append_record(path: Path, record: Record) -> None:
    """Append one record to a run's records file as one line, as soon as it is computed: several
    processes (xdist workers) append to one file, each line written whole under an exclusive lock and
    flushed to disk, so a run that is stopped keeps every record it finished. A write cut short (a full
    disk) is taken back, and a line left unfinished by a process that died while writing it is ended
    first, so that it never swallows the next record."""
    line = (dumps(record.to_json(), sort_keys=True) + "\n").encode()
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


def read_appended(path: Path) -> tuple[list[Record], list[int]]:
    """The records appended to a records file (none if it is absent), and the numbers of its torn lines:
    lines cut short by a process that died or a disk that filled while writing them. A torn line is not a
    record; every whole line around it still is."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    lines = jsonl_lines(text)
    torn = [number for number, line in enumerate(lines, start=1) if line.strip() and record_line(line) is None]
    cut = set(torn)
    kept = "\n".join("" if number in cut else line for number, line in enumerate(lines, start=1))
    return parse_records(path, kept), torn


def versioned_objects(path: Path, text: str, schema: str | tuple[str, ...],
                      error: type[Exception]) -> list[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL text, each with `"schema"` one of `schema`; anything
    else is `error` naming the file and the line."""
    schemas = (schema,) if isinstance(schema, str) else schema
    objects = jsonl_objects(path, text, error)
    for number, value in objects:
        if value.get("schema") not in schemas:
            raise error(f"{path}:{number}: field 'schema' is {short(value.get('schema'))}, expected "
                        f"{' or '.join(map(repr, schemas))}")
    return objects


def parse_records(path: Path, text: str, problem: Callable[[Record], str | None] | None = None,
                  keys: Container[tuple] | None = None) -> list[Record]:
    """The records of a ledger's text, each read by records.Record and, given `problem` (what makes a record
    unfit for its reader, or None), accepted by it; else a LedgerError naming the file, the line and the
    field. Given `keys`, a line whose (family, row, precision) are strings it does not hold is not read as a
    record (every line is still JSON with a readable schema): a run reads the baseline records it audits, not a
    whole ledger's (most of a short run's start went to reading records it never looked at)."""
    records = []
    for number, value in versioned_objects(path, text, READABLE, LedgerError):
        key = tuple(value.get(name) for name in KEY_FIELDS)
        if keys is not None and all(type(part) is str for part in key) and key not in keys:
            continue
        try:
            record = Record.from_json(value)
        except RecordError as exc:
            names = "/".join(str(value.get(name)) for name in KEY_FIELDS)
            raise LedgerError(f"{path}:{number}: ledger record {names}: {exc}") from None
        if problem is not None and (found := problem(record)):
            raise LedgerError(f"{path}:{number}: {found}")
        records.append(record)
    return records


def read_ledger(path: Path, problem: Callable[[Record], str | None] | None = None,
                keys: Container[tuple] | None = None) -> list[Record]:
    """A ledger's records (parse_records), or those of `keys`."""
    return parse_records(path, read_text(path, "ledger", LedgerError), problem, keys)


def headline_problem(record: Record) -> str | None:
    """What makes a record unfit for a reader of its family's headline (the report, compare), or None: an ok
    record without its family's headline pair, or, for a family with causal outcomes, without a field its outcome
    module reads (its `REQUIRED`: a transplant's `transplants`, a conversation transplant's `turn_splice`)."""
    if not record.ok:
        return None
    family, required = record.family, ()
    if family in SHAPES:  # a headline table's family
        headline = SHAPES[family].headline
    elif family in FAMILIES and FAMILIES[family].outcome:  # one with causal outcomes: its outcome module reads it
        headline, required = FAMILIES[family].headline, importlib.import_module(FAMILIES[family].outcome).REQUIRED
    else:
        headline = ()
    if missing := [pair for pair in headline if pair not in record.comparisons]:
        return f"ledger record {record.label}: comparisons lack the {family} family's pair {missing[0]!r}"
    if lacking := [name for name in required if getattr(record, name) is None]:
        return f"ledger record {record.label}: field {lacking[0]!r} missing (an ok {family} record holds it)"
    return None


def collate(paths: list[Path]) -> list[Record]:
    """Records of one or more ledgers (files or run directories), de-duplicated, sorted by key.

    The same (family, row, cell) in two inputs must be identical: different results are an error, and
    so are two definitions of one cell (records of one name with another `cell_digest`), which would be
    counted as one cell.
    """
    seen: dict[tuple, tuple[Record, Path]] = {}
    defined: dict[str, tuple[str, Path]] = {}  # cell -> (the digest of its definition, the ledger saying so)
    for path in map(ledger_of, map(Path, paths)):
        records = read_ledger(path, headline_problem)
        if not records:
            raise LedgerError(f"{path}: empty ledger (no records)")
        for record in records:
            if record.key in seen and seen[record.key][0] != record:
                raise LedgerError(f"ledger record {record.label} differs between {seen[record.key][1]} and {path}")
            seen.setdefault(record.key, (record, path))
            _check_definition(defined, record, path)
    return [seen[k][0] for k in sorted(seen)]


def cell_digests(records: list[Record]) -> dict[str, str]:
    """cell -> the digest of its definition its records carry (ledger/5; collate refuses two of one cell)."""
    return {r.precision: r.cell_digest for r in records if r.cell_digest is not None}


def _check_definition(defined: dict[str, tuple[str, Path]], record: Record, path: Path) -> None:
    """One definition per cell among the ledgers read together (a record without a digest, older than
    ledger/5, names none)."""
    if record.cell_digest is None:
        return
    digest, where = defined.setdefault(record.precision, (record.cell_digest, path))
    if digest != record.cell_digest:
        raise LedgerError(f"cell {record.precision} has two definitions: digest {digest[:12]}… in {where}, "
                          f"{record.cell_digest[:12]}… in {path} ({record.label}); its records cannot be counted as "
                          "one cell")
