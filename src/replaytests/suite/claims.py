"""Records shared between pytest-xdist workers: each is computed by one worker, read by any.

Under `-n N` the tests of one (cell, row) run on one worker, but some tests read the records of
other rows: the transplant panel reads the whole BF16 crossing, the transplant family's gate every
panel row's transplant record. Before a worker computes a record it claims it (a file created with
O_EXCL in a directory the controller made for the run). A worker that needs a record finds it in the
run's records file (another worker finished it), or claims it and computes it, or, where another
worker holds the claim, waits for that worker to append it. Whoever reaches a row first computes it:
a worker that needs the whole crossing computes the rows nobody has started while the others compute
theirs, instead of one worker computing all of them. Waits only go from a record to the records it
reads (the transplant waits for the crossing, never the other way round), and a claim is held only
while its record is computed, so no two workers wait for each other. A claim whose process has died
is taken over.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from replaytests.files import jsonl_lines
from replaytests.outputs import ledger
from replaytests.outputs.records import Record

POLL_SECONDS = 0.2
Key = tuple[str, str, str]  # (family, row, cell)


class Claims:
    """The claims of one worker in one run: `directory` holds a file per claimed record (its holder's
    pid), `records` is the run's records file, which every worker appends to."""

    def __init__(self, directory: Path, records: Path) -> None:
        self.directory = directory
        self.records = records
        self._offset = 0  # how much of the records file has been read
        self._finished: dict[Key, Record] = {}

    def shared(self, keys: list[Key], compute: Callable[[Key], Record]) -> dict[Key, Record]:
        """The records `keys`: each appended by another worker, or computed here by `compute` (which appends
        what it finishes). Those another worker holds are waited for only once none is left to compute
        here, so two workers that need the same rows compute half of them each."""
        found: dict[Key, Record] = {}
        while pending := [key for key in keys if key not in found]:
            for key in pending:
                if (record := self.finished(key)) is None and self._claim(key):
                    try:
                        # Appended between the check above and the claim: not computed twice.
                        record = self.finished(key) or compute(key)
                    finally:
                        self.path(key).unlink(missing_ok=True)
                if record is not None:
                    found[key] = record
                else:
                    self._reap(key)
            if len(found) == len(keys) - len(pending):  # nothing came this round: the others are computing
                time.sleep(POLL_SECONDS)
        return found

    def finished(self, key: Key) -> Record | None:
        """The record `key` if some worker has appended it (read from where the last call stopped)."""
        if key not in self._finished:
            with contextlib.suppress(FileNotFoundError), open(self.records, "rb") as handle:
                handle.seek(self._offset)
                text = handle.read()
                whole = text[: text.rfind(b"\n") + 1]  # a line still being written is read next time
                self._offset += len(whole)
                for line in jsonl_lines(whole.decode(errors="replace")):
                    if (value := ledger.record_line(line)) is not None:  # a torn line is nobody's record
                        record = Record.from_json(value)
                        self._finished[record.key] = record
        return self._finished.get(key)

    def path(self, key: Key) -> Path:
        """The claim file of `key` (named by a digest: a bank row's id may hold any character)."""
        return self.directory / hashlib.sha256("\0".join(key).encode()).hexdigest()

    def _claim(self, key: Key) -> bool:
        try:
            fd = os.open(self.path(key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except FileNotFoundError:  # the directory was removed under the run (a /tmp cleaner): made again
            self.directory.mkdir(parents=True, exist_ok=True)
            return self._claim(key)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
        return True

    def _reap(self, key: Key) -> None:
        """Remove the claim of `key` if its holder has died (the next round claims it here)."""
        try:
            holder = int(self.path(key).read_text() or 0)
        except (FileNotFoundError, ValueError):  # released, or its pid not written yet
            return
        if holder and not _alive(holder):
            self.path(key).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie (a worker killed, not yet reaped by its parent) does not: its claim would
    otherwise be waited for for ever."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux), or gone since
        return True
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")
