"""Exception types, the exit statuses, and the shortening of values quoted in messages. Every message is
one line naming the file, row, field or step at fault, and never echoes a value longer than a line."""

import enum
import re
import reprlib


class Exit(enum.IntEnum):
    """The exit status of every command (docs/ci.md): pytest's own codes where they exist, so a conformance
    run, `replaytests audit`, `compare`, `report` and `history` mean the same by each number."""

    PASS = 0
    FAIL = 1  # a check failed: the verdict is FAIL, whatever produced it
    INTERRUPTED = 2  # stopped (a signal, -x, a torn records file): what was finished is kept
    BAD_INPUT = 4  # one line naming the file, field or option, before any model work
    WRITE_FAILED = 6  # a run's final files could not be written; its records are kept in RUN/records.jsonl


def shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 80, 80


def short(value: object, limit: int = 120) -> str:
    """A value's repr, cut to `limit` characters (built within bounds: a YAML alias bomb is never expanded)."""
    return shorten(_REPR.repr(value), limit)


def got(value: dict, name: str) -> str:
    """What a field of an object read from a file holds, for an error message: `got <short repr>`, or `missing`."""
    return f"got {short(value[name])}" if name in value else "missing"


CONTROLS = r"\x00-\x1f\x7f-\x9f"  # C0 and C1 control characters and DEL, as a regex class's body
CONTROL = re.compile(f"[{CONTROLS}]")


def control_character(text: str) -> str | None:
    """The first control character of `text` ("U+001B at index 4"), or None. A name, id or label that ends up
    in a terminal line, a Markdown report or JUnit XML must hold none: a newline fakes a line, an escape code
    drives the terminal, and XML 1.0 cannot hold most of them at all."""
    found = CONTROL.search(text)
    return None if found is None else f"control character U+{ord(found.group()):04X} at index {found.start()}"


class ReplaytestsError(Exception):
    """Base class: an error the suite reports as one line, without a traceback. Its text shows a control
    character it quotes (a model path's newline or escape code) as an escape, never raw."""

    def __str__(self) -> str:
        return CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), super().__str__())


class ConfigError(ReplaytestsError):
    """A model, tokenizer, contract or option that cannot be used as given."""


class BankError(ReplaytestsError):
    """A bank file, manifest or row that breaks the bank format or the block grammar."""


class DumpError(ReplaytestsError):
    """A rollouts dump (docs/rollouts.md) or a file a converter reads that breaks its format."""


class LedgerError(ReplaytestsError):
    """A ledger file that cannot be read as the versioned ledger format."""


class RecordNotKept(ReplaytestsError):
    """A finished record could not be appended to the run's records file (a full disk, a quota)."""


class FailClosed(ReplaytestsError):
    """A check that stops a row from contributing numbers."""


class NonFinite(FailClosed):
    """A logit or a K/V value is NaN or infinite: no comparison of such numbers means anything (two NaN
    runs are bitwise equal), so the row contributes none."""


class PhysicalBatchDesync(FailClosed):
    """The two duplicate rows of the physical batch produced different outputs."""


class StorageAliasing(FailClosed):
    """Two constructions share tensor storage."""


class NotServedAsAsked(FailClosed):
    """A serving engine's own counters show a request was not run as its construction names (a batch that did not
    form): comparing it would measure another construction under this one's name."""


class BoundaryMismatch(FailClosed):
    """Two constructions reached boundaries that differ in tokens, roles, positions or metadata."""


class TransplantRefused(FailClosed):
    """A cache transplant whose donor and recipient (or result) fail provenance validation."""


class NotContemporaneous(FailClosed):
    """A rebuilt construction does not reproduce the record it is meant to re-run."""


class TransplantInvalid(FailClosed):
    """A self-transplant did not reproduce its own trajectory: decoding here is not a function of the
    cache values alone, so no transplant outcome means anything."""


class PlatformDrift(UserWarning):
    """Bits that differ from a baseline made on another platform, every trajectory kept: reported, not a
    failure. A class of an importable module, so that pytest-xdist's controller can rebuild the warning."""
