"""File helpers: sha256 digests and atomic writes (a reader never sees a half-written file)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from replaytests.errors import ConfigError


def lookup(tree: object, *keys: str, default: object = None) -> object:
    """The value under `keys` in nested JSON objects (run.json, a manifest, a contract, a report), or
    `default` where a key is absent or a value on the way is not an object: the one reader of such paths."""
    for key in keys:
        if not isinstance(tree, dict) or key not in tree:
            return default
        tree = tree[key]
    return tree


def sha256_file(path: Path, what: str = "a file to hash", error: type[Exception] = ConfigError) -> str:
    """The sha256 of a regular file, read in chunks (a weight file may be any size; memory stays bounded).
    A FIFO, a device or a directory is `error`, one line naming it: a FIFO would block the hash for ever,
    /dev/zero would never end."""
    digest = hashlib.sha256()
    with open_regular(path, what, error) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_json(value: object) -> str:
    """Digest of a JSON-able value, independent of key order."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for a read-modify-write of `path` (replaced atomically, so its own inode cannot
    carry the lock): the lock is on its directory, which leaves no lock file behind. Writers in other
    processes wait for it; readers need none (they see the old file or the new one)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    write_set({path: text})


def write_set(files: dict[Path, str]) -> None:
    """Write several files as one: every one to a temporary file beside it first (flushed to disk), and
    only once all of them are written, each renamed over its path. A failure while writing (a full
    disk) leaves every existing file as it was. A path that is a symbolic link is refused, never written
    through: a link planted where a report goes would otherwise aim the write at any file the user can
    write (the folders on the way may be links: `reports/latest/` is one)."""
    temporaries: dict[Path, str] = {}
    try:
        for path, text in files.items():
            path = Path(os.path.abspath(path))
            if path.is_symlink():
                raise OSError(errno.ELOOP, f"a symbolic link (to {os.readlink(path)}), never written through",
                              str(path))
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            temporaries[path] = tmp
            os.chmod(tmp, 0o666 & ~umask())  # the mode open() would give, not mkstemp's private 0600
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        for path, tmp in temporaries.items():
            os.replace(tmp, path)
    except BaseException:
        for tmp in temporaries.values():
            Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(path: Path, records: Iterable[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def write_json_atomic(path: Path, value: object, sort_keys: bool = True) -> None:
    write_atomic(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")


MAX_INPUT = 256 << 20  # bytes: a contract, bank, manifest, ledger or history larger than this is not one


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def _check(info: os.stat_result, path: Path, what: str, error: type[Exception], limit: int | None) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path}: cannot read {what}: {_kind(info.st_mode)}, not a regular file")
    if limit is not None and info.st_size > limit:
        raise error(f"{path}: cannot read {what}: {info.st_size} bytes, more than the {_size(limit)} an input may be")


def regular_file(path: Path, what: str, error: type[Exception], limit: int | None = None) -> None:
    """`path` is a regular file of at most `limit` bytes (None: any size), by its type alone, before anything
    opens it (opening a FIFO blocks, opening a device can act); else `error`, one line naming it."""
    try:
        _check(os.stat(path), path, what, error, limit)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def open_regular(path: Path, what: str, error: type[Exception], limit: int | None = None) -> Iterator:
    """`path` open for reading bytes, a regular file of at most `limit` bytes (None: any size); anything
    else is `error`, one line naming it. The type is checked before opening and again on the open file
    (the path may have been swapped meanwhile); O_NONBLOCK keeps a FIFO swapped in from blocking the open."""
    regular_file(path, what, error, limit)
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            _check(os.fstat(handle.fileno()), path, what, error, limit)
            yield handle
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


def read_text(path: Path, what: str, error: type[Exception], limit: int = MAX_INPUT) -> str:
    """A UTF-8 text file, a regular one of at most `limit` bytes (a FIFO would block for ever, a device
    or a huge sparse file would fill the memory); anything else is `error`, one line naming it. Line
    ends read as text mode reads them (universal newlines)."""
    with open_regular(path, what, error, limit) as handle:
        data = handle.read(limit + 1)  # a file that grew after its stat is still bounded
    if len(data) > limit:
        raise error(f"{path}: cannot read {what}: more than the {_size(limit)} an input may be")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_json(path: Path, what: str, error: type[Exception], limit: int = MAX_INPUT) -> object:
    """A JSON file read as every input is (read_text: a regular file of bounded size), with nesting bounded
    and a key written twice refused: anything else is `error`, one line naming the file."""
    text = read_text(path, what, error, limit)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise error(f"{path}: cannot read {what}: field {exc.args[0]!r} written twice in one object") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: cannot read {what}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{path}: cannot read {what}: JSON nested too deeply") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        raise _DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return value


def jsonl_objects(path: Path, text: str, error: type[Exception]) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSONL text; a line that is not a JSON object
    is `error`, naming the file and the line."""
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            raise error(f"{path}:{number}: field {exc.args[0]!r} written twice in one object (JSON would keep "
                        "the last)") from None
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise error(f"{path}:{number}: JSON nested too deeply") from None
        if not isinstance(value, dict):
            raise error(f"{path}:{number}: expected a JSON object per line, got {type(value).__name__}")
        objects.append((number, value))
    return objects
