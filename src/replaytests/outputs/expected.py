"""Known changes: an expected-state file that accepts changes per family and cell.

A nightly gate against a baseline stays green on a difference that is known and explained, and turns
red on a new one. Like PyTorch's `ci_expected_accuracy` files, it fails in both directions: a change
it does not list fails (as without the file), and a listed change that no longer occurs fails as
"improved", so the file never goes on excusing a difference that has gone (docs/nightly.md).

    schema: replaytests.expected/1
    changes:
      - family: crossing
        precision: fp32      # a cell's name
        level: bits          # what may change: bits, trajectories (and bits) or rates (and both)
        why: transformers 5.24 reorders the FP32 attention sum
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from replaytests.errors import ConfigError, control_character, short
from replaytests.inputs.cells import NAME_PATTERN
from replaytests.inputs.gates import LEVELS
from replaytests.inputs.schema import read_yaml

SCHEMA = "replaytests.expected/1"
FIELDS = {"family": str, "precision": str, "level": str, "why": str}


@dataclass(frozen=True)
class Entry:
    family: str
    precision: str  # the file's field: a cell's name
    level: str
    why: str

    def __str__(self) -> str:
        return f"{self.family}/{self.precision} may change at {self.level}: {self.why}"


@dataclass(frozen=True)
class Expected:
    path: Path
    entries: dict[tuple[str, str], Entry]  # (family, cell) -> its entry

    @classmethod
    def load(cls, path: Path) -> Expected:
        data = read_yaml(path, "expected-state file")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else data
            raise ConfigError(f"{path}: field 'schema' is {short(found)}, expected {SCHEMA!r}")
        if set(data) - {"schema", "changes"} or not isinstance(data.get("changes"), list) or not data["changes"]:
            raise ConfigError(f"{path}: expected the fields 'schema' and 'changes' (a non-empty list of entries)")
        entries: dict[tuple[str, str], Entry] = {}
        for index, item in enumerate(data["changes"]):
            where = f"{path}: changes[{index}]"
            if not isinstance(item, dict) or set(item) != set(FIELDS):
                raise ConfigError(f"{where}: expected exactly the fields {', '.join(FIELDS)}, got {short(item)}")
            if bad := next((f for f, kind in FIELDS.items() if not isinstance(item[f], kind) or not item[f]), None):
                raise ConfigError(f"{where}: field {bad!r} must be a non-empty string, got {short(item[bad])}")
            if found := next(((f, c) for f in FIELDS if (c := control_character(item[f]))), None):
                # each is printed in a reason line: a newline would fake a line, an escape code drive the terminal
                raise ConfigError(f"{where}: field {found[0]!r} holds a {found[1]}")
            if not re.fullmatch(NAME_PATTERN, item["precision"]):
                raise ConfigError(f"{where}: field 'precision' is {short(item['precision'])}, expected a cell name")
            if item["level"] not in LEVELS:
                raise ConfigError(f"{where}: field 'level' is {short(item['level'])}, expected one of "
                                  f"{', '.join(LEVELS)}")
            key = (item["family"], item["precision"])
            if key in entries:
                raise ConfigError(f"{where}: {'/'.join(key)} is listed twice")
            entries[key] = Entry(**item)
        return cls(path, entries)

    def accepts(self, group: tuple[str, str], level: str) -> Entry | None:
        """The entry that accepts a finding at `level` in `group` (one at that level or a coarser one)."""
        entry = self.entries.get(group)
        return entry if entry is not None and LEVELS.index(level) <= LEVELS.index(entry.level) else None

    def improved(self, found: set[tuple[str, str, str]], compared: set[tuple[str, str]]) -> list[str]:
        """A reason for each entry of a (family, cell) both runs hold whose own level had no
        finding: the change it expects no longer occurs. `found`: (family, cell, level) of every
        finding (a changed trajectory is found at bits too)."""
        return [f"improved: {'/'.join(key)} no longer changes at {entry.level} ({self.path}: {entry}); "
                "narrow or remove the entry" for key, entry in sorted(self.entries.items())
                if key in compared and (*key, entry.level) not in found]

    def unmatched(self, compared: set[tuple[str, str]]) -> list[str]:
        """A reason for each entry whose (family, cell) the two runs do not both hold: it can accept
        nothing (a typo, or a family or cell these runs did not run), so it would be ignored for ever."""
        held = ", ".join("/".join(key) for key in sorted(compared)) or "none"
        return [f"unmatched: {self.path}: {'/'.join(key)} is not a family and cell both runs hold (they hold "
                f"{held}); fix or remove the entry" for key in sorted(self.entries) if key not in compared]
