"""Run directories: every run writes into a directory of its own, never over another run or an input.

A report root (`--report-dir`, default `reports/`) holds one directory per run, named by its UTC start
time and a short id (`20261201-071233-3f9a1c`), and `latest`, a link to the last run that completed.
A run that was interrupted keeps what it finished in its own directory, marked so, and never moves
`latest`. The root is checked before any model work: it may not be or hold an input of the run (the
bank, the model, the contract, the baseline), a non-empty directory is used only if replaytests made
it a root (the MARKER file), it must be writable, and a lock (held for the whole run, released by
the operating system even if the process dies) stops a second concurrent run at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from replaytests.errors import ConfigError, LedgerError, short

MARKER = ".replaytests-root"
LOCK = ".lock"
LATEST = "latest"
LEDGER = "ledger.jsonl"
RECORDS = "records.jsonl"  # a run's records as they are computed; the ledger once the run has ended


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def check_root(root: Path, inputs: dict[str, Path]) -> None:
    """Refuse, with one line, a report root that is or holds an input (or lies inside a model
    directory), that is a file, that is a non-empty directory replaytests did not make a root, or that
    cannot be looked at (a name too long, no permission)."""
    try:
        _check_root(root, inputs)
    except OSError as exc:
        raise ConfigError(f"--report-dir {short(str(root))}: cannot use it: {exc.strerror or exc}") from None


def _check_root(root: Path, inputs: dict[str, Path]) -> None:
    where = Path(root).resolve()
    for name, path in inputs.items():
        path = Path(path).resolve()
        if _inside(path, where) or (path.is_dir() and _inside(where, path)):
            raise ConfigError(f"--report-dir {root}: holds the run's {name} ({path}); a run never writes beside its "
                              f"inputs: pass another --report-dir")
    if where.exists() and not where.is_dir():
        raise ConfigError(f"--report-dir {root}: exists and is not a directory")
    if (where / LATEST).is_dir() and not (where / LATEST).is_symlink():
        raise ConfigError(f"--report-dir {root}: its {LATEST}/ is a directory an earlier replaytests wrote (before "
                          f"run directories); move it away, e.g. `mv {root}/{LATEST} {root}/earlier`")
    if where.is_dir() and not (where / MARKER).exists() and any(where.iterdir()):
        kind = "a run directory, not a report root: pass its parent" if (where / LEDGER).exists() else (
            "a non-empty directory that is not a replaytests report root; pass an empty or new directory")
        raise ConfigError(f"--report-dir {root}: {kind}")


def check_name(root: Path, name: str | None) -> None:
    """A --run-name is a plain directory name, not `latest`, not taken yet under the root."""
    if name is None:
        return
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name) or name == LATEST:
        raise ConfigError(f"--run-name {short(name)}: expected letters, digits, '.', '_' or '-' (up to 100, not "
                          f"starting with a dot or dash, not '{LATEST}')")
    if os.path.lexists(Path(root) / name):  # a dangling link there too
        raise ConfigError(f"--run-name {name}: {Path(root) / name} exists already; runs never write over each other")


class Root:
    """A report root (created, marked and its writability checked); `lock` holds it for one run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / MARKER).touch()
        except OSError as exc:
            raise ConfigError(f"--report-dir {path}: cannot write there: {exc.strerror or exc}") from None

    def lock(self) -> None:
        """Hold the root for this run; a root another run holds is one line (the lock is released when
        the holding process ends, however it ends)."""
        try:  # never through a link: whatever it points at would be overwritten with our pid
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
            self._lock = open(fd, "a+", encoding="utf-8")  # noqa: SIM115 - held until the run ends
        except OSError as exc:
            why = "a link, not a lock file" if exc.errno == errno.ELOOP else exc.strerror or exc
            raise ConfigError(f"--report-dir {self.path}: cannot lock {self.path / LOCK}: {why}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "another process"
            self._lock.close()
            raise ConfigError(f"--report-dir {self.path}: another replaytests run is writing here ({holder}); wait "
                              f"for it or pass another --report-dir") from None
        self._lock.truncate(0)
        self._lock.write(f"pid {os.getpid()}, since {datetime.now(UTC).isoformat(timespec='seconds')}")
        self._lock.flush()

    def new_run(self, name: str | None = None) -> Path:
        """A new, empty directory for this run: `name`, or its UTC time and a short random id."""
        run = self.path / (name or f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}")
        run.mkdir()
        return run

    def check_latest(self) -> None:
        """`latest` is absent or a link replaytests made (to a run directory here); anything else is one
        line, before any model work (a file there would be overwritten, a dangling link misread)."""
        latest = self.path / LATEST
        if not latest.is_symlink():
            if latest.exists():
                raise ConfigError(f"--report-dir {self.path}: {latest} is not a link replaytests made (a "
                                  f"{'directory' if latest.is_dir() else 'file'}); move it away")
            return
        target = os.readlink(latest)
        if "/" in target or not (self.path / target).is_dir():
            raise ConfigError(f"--report-dir {self.path}: {latest} points at {target!r}, not at a run directory "
                              "here; remove the link")

    def publish(self, run: Path) -> None:
        """Point `latest` at a completed run (atomically: a reader sees the old or the new run)."""
        temporary = self.path / f".{LATEST}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        os.symlink(run.name, temporary)
        os.replace(temporary, self.path / LATEST)

    def release(self) -> None:
        if self._lock is not None and not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def output_dir(out: Path | None, root: Path, inputs: dict[str, Path], kind: str):
    """Where a command that is not a run writes its files (a selftest, a rollouts check), checked before any
    model work: `out`, a directory (created if absent), or by default a new directory `<time>-<kind>-<id>` in
    the report root `root`, made a root as a run makes it (so that a later run there still accepts it) when the
    files are written; `latest` is not moved. Returns the function that gives the directory."""
    if out is not None:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out}: exists and is not a directory")
        return lambda: out
    check_root(root, inputs)
    made = Root(root)
    return lambda: made.new_run(f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{kind}-{secrets.token_hex(3)}")


def ledger_of(path: Path) -> Path:
    """The ledger a path names: a ledger file, a run directory holding one, or a report root (its
    latest completed run)."""
    path = Path(path)
    latest = path / LATEST
    if path.is_dir() and not (path / LEDGER).exists():
        if (latest / LEDGER).exists() or latest.is_symlink():  # a dangling latest: named so
            return latest / LEDGER
        if latest.is_file():
            raise LedgerError(f"{path}: {latest} is a file, not the link to a run that replaytests makes, so it "
                              "names no run; pass a run directory or a ledger")
    return path / LEDGER if path.is_dir() else path
