"""The vocabulary of a YAML schema and its one checker: a schema is a tree of nodes (Value, Section, KeyedBy,
Named, ListOf), and Checker checks a plain-data value against it, filling in defaults. Every error is one
line, `FILE: dotted.path: what was expected`. inputs/contract.py writes the contract's schema in it;
`read_yaml` reads a YAML file as plain data, safely."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from replaytests.errors import ConfigError, short
from replaytests.files import read_text

REQUIRED = object()
# Upper bounds: a count past them is a typo, not a setting (threads and GPUs of one machine, the
# copies of one physical batch, rows, tokens and panel sizes).
MAX_DEVICES, MAX_BATCH, MAX_COUNT = 1024, 64, 1_000_000
NUMBER = (int, float)  # a leaf that takes an int or a float
@dataclass(frozen=True)
class Value:
    """A leaf. A default of None means "not pinned": null is then allowed too."""

    kind: type | tuple[type, ...]
    default: object = REQUIRED
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    pattern: str | None = None
    expect: str = ""  # how an allowed value reads in an error, where choices or range do not say it


def pin(kind: type = str, **kw) -> Value:
    """A leaf that is not pinned unless the file says so (null by default)."""
    return Value(kind, default=None, **kw)


@dataclass(frozen=True)
class Section:
    """A mapping with fixed keys; a default of {} makes it optional, with its keys' defaults."""

    keys: dict
    default: object = REQUIRED


@dataclass(frozen=True)
class KeyedBy:
    """A mapping whose keys come from a vocabulary (`noun`s), each holding a `value`; names left
    out take the value's default where it has one."""

    names: tuple[str, ...]
    noun: str
    value: Value | Section
    default: object = REQUIRED


@dataclass(frozen=True)
class Named:
    """A mapping whose keys are names the document itself chooses (a contract's cells), each matching
    `pattern` (`expect` says how, in an error) and holding a `value`; `reserved` names may not be chosen
    (name -> why)."""

    noun: str
    value: Value | Section
    pattern: str
    expect: str
    reserved: dict[str, str] = field(default_factory=dict)
    default: object = REQUIRED


@dataclass(frozen=True)
class ListOf:
    item: Value
    default: object = REQUIRED


def show(value: object) -> str:
    """A value as the YAML would spell it (true, null, 9.0)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def suggest(key: object, known: list[str]) -> str:
    """'did you mean 'x'?' for the closest known name (ignoring case; a known name the key begins, like
    tf32 for tf32_matmul, counts as close), else the list of known names."""
    lowered = {k.lower(): k for k in known}
    key = str(key).lower()
    close = [k for k in lowered if k.startswith(key)][:1] or difflib.get_close_matches(key, list(lowered), n=1)
    return f"did you mean {lowered[close[0]]!r}?" if close else f"expected one of {', '.join(known)}"


def _one_of(choices: tuple) -> str:
    words = [show(c) for c in choices]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class Checker:
    """Checks a value against a schema node; every error names FILE: dotted.path."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {path + ': ' if path else ''}{message}")

    def check(self, node: Value | Section | KeyedBy | Named | ListOf, value: object, path: str = ""):
        if isinstance(node, Value):
            return self.leaf(node, value, path)
        if isinstance(node, ListOf):
            items = self.typed(value, list, path)
            return [self.check(node.item, item, f"{path}[{index}]") for index, item in enumerate(items)]
        mapping = self.typed(value, dict, path)
        if isinstance(node, Named):
            for key in mapping:
                if not isinstance(key, str) or not re.fullmatch(node.pattern, key):
                    raise self.error(path, f"{node.noun} name {short(key)}: expected {node.expect}")
                if key in node.reserved:
                    raise self.error(path, f"{node.noun} name {key!r} is reserved ({node.reserved[key]})")
            return {key: self.check(node.value, child, _join(path, key)) for key, child in mapping.items()}
        known = node.keys if isinstance(node, Section) else dict.fromkeys(node.names, node.value)
        noun = "field" if isinstance(node, Section) else node.noun
        for key in mapping:
            if key not in known:
                raise self.unknown(path, noun, key, list(known))
        out = {}
        for key, child in known.items():
            if key in mapping or child.default is not REQUIRED:
                out[key] = self.check(child, mapping.get(key, child.default), _join(path, key))
            elif isinstance(node, Section):
                raise self.error(path, f"missing required field {key!r}")
        return out

    def typed(self, value: object, kind: type, path: str):
        return self.leaf(Value(kind), value, path)

    def leaf(self, node: Value, value: object, path: str):
        if value is None and node.default is None:
            return None
        kinds = node.kind if isinstance(node.kind, tuple) else (node.kind,)
        if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
            wanted = " or ".join(k.__name__ for k in kinds) + (" or null" if node.default is None else "")
            quote = " (write it in quotes)" if str in kinds and isinstance(value, float) else ""
            got = "null" if value is None else f"{type(value).__name__} {short(value)}"
            raise self.error(path, f"expected {wanted}, got {got}{quote}")
        if node.choices and value not in node.choices:
            raise self.error(path, f"expected {node.expect or _one_of(node.choices)}, got {short(value)}")
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
            wanted = node.expect or (_range(node) if node.low is not None else "a finite number")
            raise self.error(path, f"expected {wanted}, got {short(value)}")
        if (node.low is not None and value < node.low) or (node.high is not None and value > node.high):
            raise self.error(path, f"expected {node.expect or _range(node)}, got {short(value)}")
        if node.pattern and not re.fullmatch(node.pattern, value):
            raise self.error(path, f"expected {node.expect}, got {short(value)}")
        return value

    def unknown(self, path: str, noun: str, key: object, known: list[str]) -> ConfigError:
        return self.error(path, f"unknown {noun} {short(key)}; {suggest(key, known)}")


def _range(node: Value) -> str:
    kind = "an integer" if node.kind is int else "a number"
    return f"{kind} from {show(node.low)} to {show(node.high)}"


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key written twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges another mapping (its keys may be overridden)
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):  # `? [a, b]` or `[1]: 2`: no field is named so (and a set cannot hold it)
                raise yaml.constructor.ConstructorError(None, None, f"a key is a {type(key).__name__}, expected a "
                                                        "name or a number", key_node.start_mark)
            if key != "<<" and isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {short(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, what: str = "contract") -> object:
    """The plain data of a YAML file (safe loading, duplicate keys refused); bad YAML is one ConfigError line."""
    text = read_text(path, what, ConfigError)
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: plain data only, never objects
    except RecursionError:
        raise ConfigError(f"{path}: malformed YAML: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{line}: {getattr(exc, 'problem', exc)}") from None


