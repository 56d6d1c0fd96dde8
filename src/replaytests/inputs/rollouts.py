"""The rollouts dump, `replaytests.rollouts/1` (docs/rollouts.md): one JSON object per line, each one response
an engine decoded live with the log-probability it gave each chosen token.

Read whole and checked before any model work: a line that breaks the format is a DumpError naming the file,
the line and the field (`dump.jsonl:3: field 'logprobs[4]': expected a number, got '7'`), and so is a token the
model cannot take (`check_model`). No torch here: the inputs never import the engine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

from replaytests.errors import DumpError, control_character, short
from replaytests.files import jsonl_objects, read_text

SCHEMA = "replaytests.rollouts/1"
REQUIRED = ("schema", "prompt_ids", "response_ids", "logprobs")
TEXT = ("id", "engine", "version", "dtype", "model")  # optional strings
SAMPLING = ("temperature", "top_p", "top_k", "seed")  # optional numbers (or null) under `sampling`


class FieldError(Exception):
    """A field of one line at fault; the reader adds the file and the line."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r}: {problem}")


@dataclass(frozen=True)
class Rollout:
    """One response: the tokens the engine was given and chose, and its log-probability of each choice."""

    id: str
    line: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    meta: tuple[tuple[str, object], ...] = ()  # the optional fields as given (engine, version, dtype, sampling...)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class Dump:
    path: Path
    sha256: str
    rows: tuple[Rollout, ...]

    @property
    def tokens(self) -> int:
        """Response tokens: the ones measured."""
        return sum(len(row.response_ids) for row in self.rows)

    def check_model(self, vocab_size: int, max_positions: int, source: str) -> None:
        """Every token inside the model's vocabulary and every row inside its positions, else one line naming
        the file, the line and the field (checked before the weights load)."""
        for row in self.rows:
            for name in ("prompt_ids", "response_ids"):
                ids = getattr(row, name)
                if max(ids) >= vocab_size:
                    at = next(index for index, token in enumerate(ids) if token >= vocab_size)
                    raise DumpError(f"{self.path}:{row.line}: field '{name}[{at}]': token id {ids[at]} is outside "
                                    f"the model's vocabulary (vocab_size {vocab_size}, {source})")
            if row.length > max_positions:
                raise DumpError(f"{self.path}:{row.line}: field 'response_ids': prompt and response are {row.length} "
                                f"tokens, more than the {max_positions} positions the model takes ({source})")


def read_dump(path: Path) -> Dump:
    """The dump at `path`, every line checked; a DumpError (one line) at the first fault."""
    text = read_text(Path(path), "a rollouts dump", DumpError)
    rows: list[Rollout] = []
    seen: dict[str, int] = {}
    for number, value in jsonl_objects(path, text, DumpError):
        try:
            row = parse_row(value, number)
        except FieldError as exc:
            raise DumpError(f"{path}:{number}: {exc}") from None
        if row.id in seen:
            raise DumpError(f"{path}:{number}: field 'id': {short(row.id)} is line {seen[row.id]}'s id already")
        seen[row.id] = number
        rows.append(row)
    if not rows:
        raise DumpError(f"{path}: holds no rollout (an empty dump measures nothing)")
    return Dump(Path(path), hashlib.sha256(text.encode()).hexdigest(), tuple(rows))


def parse_row(value: dict, line: int) -> Rollout:
    """One line's object as a Rollout; a FieldError at its first fault."""
    if unknown := sorted(set(value) - {*REQUIRED, *TEXT, "sampling"}):
        raise FieldError(unknown[0], f"not a field of {SCHEMA} (fields: {', '.join((*REQUIRED, *TEXT, 'sampling'))})")
    if missing := [name for name in REQUIRED if name not in value]:
        raise FieldError(missing[0], "missing (required)")
    if value["schema"] != SCHEMA:
        raise FieldError("schema", f"expected {SCHEMA!r}, got {short(value['schema'])}")
    prompt, response = _ids(value["prompt_ids"], "prompt_ids"), _ids(value["response_ids"], "response_ids")
    logprobs = _logprobs(value["logprobs"], len(response))
    meta = {name: _text(value[name], name) for name in TEXT if name in value}
    if "sampling" in value:
        meta["sampling"] = _sampling(value["sampling"])
    return Rollout(str(meta.pop("id", f"line-{line}")), line, prompt, response, logprobs, tuple(meta.items()))


def _list(value: object, field: str) -> list:
    if not isinstance(value, list):
        raise FieldError(field, f"expected a list, got {type(value).__name__}")
    if not value:
        raise FieldError(field, "empty (a response needs a prompt before it and at least one token to measure)")
    return value


def _ids(value: object, field: str) -> tuple[int, ...]:
    for index, item in enumerate(_list(value, field)):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise FieldError(f"{field}[{index}]", f"expected a token id (an integer, 0 or more), got {short(item)}")
    return tuple(value)


def _logprobs(value: object, length: int) -> tuple[float, ...]:
    items = _list(value, "logprobs")
    if len(items) != length:
        raise FieldError("logprobs", f"{len(items)} values for {length} response tokens (one per response token)")
    for index, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, Real):
            raise FieldError(f"logprobs[{index}]", f"expected a number, got {short(item)}")
        if item > 0:
            raise FieldError(f"logprobs[{index}]", f"{item!r} is above 0; a log-probability is at most 0")
    return tuple(float(item) for item in items)


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise FieldError(field, f"expected a non-empty string, got {short(value)}")
    if problem := control_character(value):
        raise FieldError(field, problem)
    return value


def _sampling(value: object) -> tuple[tuple[str, object], ...]:
    if not isinstance(value, dict):
        raise FieldError("sampling", f"expected an object ({', '.join(SAMPLING)}), got {type(value).__name__}")
    for name, item in value.items():
        if name not in SAMPLING:
            raise FieldError(f"sampling.{name}", f"not a sampling setting of {SCHEMA} ({', '.join(SAMPLING)})")
        if item is not None and (isinstance(item, bool) or not isinstance(item, Real)):
            raise FieldError(f"sampling.{name}", f"expected a number or null, got {short(item)}")
    return tuple(value.items())
