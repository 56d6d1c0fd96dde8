"""File helpers: sha256 digests and atomic writes (a reader never sees a half-written file)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from replaytests.errors import ConfigError, shorten


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
    text = dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def dumps(value: object, **options) -> str:
    """`value` as strict JSON: a NaN or an infinity is a NotStrictJSON naming its field, never written
    as the `NaN` or `Infinity` that json.dumps writes by default and that strict JSON parsers (browsers, jq,
    Go, Rust) refuse. The one writer of the suite's JSON."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        found = _first(value, lambda v: isinstance(v, float) and not math.isfinite(v))
        if found is None:
            raise
        raise NotStrictJSON(f"{_field(found[0])} is {found[1]}; strict JSON has no NaN or Infinity") from None


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


LOCK_NOTICE = 1.0  # seconds: a lock held longer than this is said on stderr, once
LOCK_POLL = 0.05  # seconds between tries


@contextlib.contextmanager
def exclusive(path: Path, timeout: float, error: type[Exception]) -> Iterator[None]:
    """Hold an exclusive lock for a read-modify-write of `path` (replaced atomically, so its own inode cannot
    carry the lock): the lock is on its directory, which leaves no lock file behind. Writers in other
    processes wait for it; readers need none (they see the old file or the new one). A wait past
    LOCK_NOTICE is said in one line on stderr (the directory, and the process holding it where Linux says),
    and a wait past `timeout` seconds is `error`, one line: a lock left held never hangs a nightly job."""
    directory = Path(path).parent
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _wait_for_lock(fd, Path(path), timeout, error)
        yield
    finally:
        os.close(fd)


def _wait_for_lock(fd: int, path: Path, timeout: float, error: type[Exception]) -> None:
    start, told = time.monotonic(), False
    lock = f"the lock on {path.parent}/"
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
        if waited >= timeout:
            raise error(f"{path}: gave up after {timeout:g} s waiting for {lock}{_holder(fd)} (another writer of it; "
                        "the lock is released when that process ends)")
        if not told and waited >= LOCK_NOTICE:
            print(f"replaytests: {path}: waiting up to {timeout:g} s for {lock}{_holder(fd)} (another writer of it)",
                  file=sys.stderr, flush=True)
            told = True
        time.sleep(LOCK_POLL)


def _holder(fd: int) -> str:
    """', held by process N' where /proc/locks names the process holding a flock on `fd`'s file, else ''."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:5678 0 EOF"; a waiter's line has "->" after the number
            pids = [fields[4] for line in locks if len(fields := line.split()) > 5 and fields[1] == "FLOCK"
                    and fields[5] == inode]
    except OSError:
        return ""
    return f", held by process {pids[0]}" if pids else ""


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
            os.chmod(tmp, _mode(path))
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


def _mode(path: Path) -> int:
    """The mode open() would give: the file's own where it exists (a rename must not reset a chmod), else
    what the umask leaves of 0666; never mkstemp's private 0600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~umask()


def write_jsonl_atomic(path: Path, records: Iterable[dict]) -> None:
    write_atomic(path, "".join(dumps(r, sort_keys=True) + "\n" for r in records))


def write_json_atomic(path: Path, value: object, sort_keys: bool = True) -> None:
    write_atomic(path, dumps(value, indent=2, sort_keys=sort_keys) + "\n")


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
    """A JSON file read as every input is (read_text: a regular file of bounded size), as strict JSON (no
    NaN or Infinity), with nesting bounded and a key written twice refused: anything else is `error`, one
    line naming the file."""
    text = read_text(path, what, error, limit)
    try:
        return loads(text)
    except NotStrictJSON as exc:
        raise error(f"{path}:{_line_of_constant(text)}: cannot read {what}: {exc}") from None
    except _DuplicateKey as exc:
        raise error(f"{path}: cannot read {what}: field {exc.args[0]!r} written twice in one object") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: cannot read {what}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise error(f"{path}: cannot read {what}: JSON nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise error(f"{path}: cannot read {what}: not valid JSON ({exc})") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        raise _DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return value


class NotStrictJSON(ValueError):
    """A `NaN`, `Infinity` or `-Infinity` in a JSON text, or a number too large for a float (`1e999`):
    Python's json reads them as NaN and infinities, strict JSON has none, so a value read with one would be
    written on into a report.json no strict parser reads. Its text names the field that holds it."""


class _Constant:
    """Where a NaN or an infinity was read: found by its field's path once the text is known to hold one."""

    def __init__(self, name: str) -> None:
        self.name = name


class _ConstantFound(Exception):
    pass


def _refuse_constant(name: str) -> object:
    raise _ConstantFound(name)


def _finite_float(text: str) -> float:
    if math.isfinite(value := float(text)):
        return value
    raise _ConstantFound(text)


def _float_or_constant(text: str) -> object:
    return value if math.isfinite(value := float(text)) else _Constant(text)


def loads(text: str) -> object:
    """`text` read as strict JSON: a key written twice is a _DuplicateKey, a NaN or an infinity a
    NotStrictJSON naming its field. Only a text that holds one is read twice (to find the field)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant,
                          parse_float=_finite_float)
    except _ConstantFound:
        path, found = _first(json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_Constant,
                                        parse_float=_float_or_constant), lambda v: isinstance(v, _Constant))
        raise NotStrictJSON(f"{_field(path)} is {shorten(found.name, 40)}; expected a finite number (strict "
                                "JSON has no NaN or Infinity)") from None


def _first(value: object, test: Callable[[object], bool], path: str = "") -> tuple[str, object] | None:
    """The path (`a.b[2]`) of the first value in `value` that passes `test`, in the text's order, and it."""
    if test(value):
        return path, value
    if isinstance(value, dict):
        items = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    else:
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value if isinstance(value, (list, tuple)) else ()))
    return next((found for inner, item in items if (found := _first(item, test, inner)) is not None), None)


def _field(path: str) -> str:
    return f"field {path!r}" if path else "the value"


# A JSON string (skipped whole: it may spell "NaN"), or a constant or a number outside one.
_STRING_OR_VALUE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN|-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+))')


def _line_of_constant(text: str) -> int:
    """The line of the first NaN or infinity of a JSON text (one of several lines: a run.json)."""
    found = next(m for m in _STRING_OR_VALUE.finditer(text)
                 if m.group(1) and not math.isfinite(float(m.group(1))))
    return text.count("\n", 0, found.start()) + 1


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSONL text: split at "\n" alone (a "\r" before it is JSON whitespace), never where
    str.splitlines would also split: inside a string holding U+2028, U+2029 or U+0085 (NEL)."""
    return text.split("\n")


def jsonl_objects(path: Path, text: str, error: type[Exception]) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSONL text, read as strict JSON; a line that is
    not a JSON object is `error`, naming the file, the line and the field."""
    objects = []
    for number, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            value = loads(line)
        except NotStrictJSON as exc:
            raise error(f"{path}:{number}: {exc}") from None
        except _DuplicateKey as exc:
            raise error(f"{path}:{number}: field {exc.args[0]!r} written twice in one object (JSON would keep "
                        "the last)") from None
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise error(f"{path}:{number}: JSON nested too deeply") from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise error(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise error(f"{path}:{number}: expected a JSON object per line, got {type(value).__name__}")
        objects.append((number, value))
    return objects
