"""Ledger audit (docs/protocol.md §7.4): re-run every row of a saved ledger; every trajectory and fingerprint
must reproduce. This is the gate for a runtime or checkpoint upgrade.

A record is compared leaf by leaf (every scalar in its JSON tree), exactly: two leaves are equal
when their JSON texts are equal, so 1 differs from 1.0 and floats are compared bit for bit. A
baseline written under an earlier ledger schema is compared on the leaves it has (a field that
schema did not have is not a change), so an old baseline still audits every number it holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from replaytests.errors import shorten
from replaytests.outputs.records import Record, bit_fields

# Leaves are reported in this order, so the first change named is the most telling one: the
# record's identity and status, then each arm's fingerprints before its trajectory, then metrics.
ORDER = ("schema", "family", "row", "precision", "status", "reason", "prefix_len", "expected_answer",
         "z_matches_bank", "arms", "z_sha256", "cache_digest", "logits_digest", "suffix", "answer", "correct",
         "comparisons")
RANK = {name: index for index, name in enumerate(ORDER)}  # a field's place in ORDER; others after, by name
_ABSENT = object()

# The fields that fingerprint numbers (records.BITS, declared with each field): a leaf under one of them that
# changed, alone, is a change of bits; every other leaf belongs to a trajectory.
NUMERIC_FIELDS = bit_fields()


def numeric(path: str) -> bool:
    """Whether a leaf path (`arms.prefill.layer_digests.k[3]`) lies under a numeric fingerprint field."""
    return any(part.partition("[")[0] in NUMERIC_FIELDS for part in path.split("."))


def leaves(value: object, path: str = "") -> dict[str, object]:
    """Every scalar leaf of a JSON value by its path, e.g. `arms.prefill.suffix[3]`, in ORDER's order (a record has
    a million and a half: one call per container, none per scalar)."""
    found: dict[str, object] = {}
    if isinstance(value, (dict, list)):
        _collect(value, path, found)
    else:
        found[path] = value
    return found


def _collect(value: dict | list, path: str, found: dict[str, object]) -> None:
    if isinstance(value, dict):
        items = ((f"{path}.{name}" if path else name, value[name])
                 for name in sorted(value, key=lambda k: (RANK.get(k, len(ORDER)), k)))
    else:
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    for where, item in items:
        if isinstance(item, (dict, list)):
            _collect(item, where, found)
        else:
            found[where] = item


def _text(value: object) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value)


def _same(a: object, b: object) -> bool:
    """Whether two leaves are written alike (their JSON text): at once where both are of one type, equal, and, for
    floats, of one sign (0.0 and -0.0 are equal but written apart); from their text otherwise (NaN, 1 and 1.0)."""
    if type(a) is type(b) and a == b and (type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b)):
        return True
    return _text(a) == _text(b)


@dataclass(frozen=True)
class Change:
    path: str
    baseline: object
    current: object

    def __str__(self) -> str:
        return f"{self.path}: baseline {shorten(_text(self.baseline), 80)}, now {shorten(_text(self.current), 80)}"


@dataclass(frozen=True)
class Audit:
    """One baseline record against its recomputation."""

    leaves: int
    changes: list[Change]

    @property
    def reproduced(self) -> bool:
        return not self.changes

    @property
    def trajectory_changes(self) -> list[Change]:
        """The changes that are not numeric fingerprints alone (see NUMERIC_FIELDS)."""
        return [change for change in self.changes if not numeric(change.path)]


def audit_record(baseline: Record, current: Record) -> Audit:
    """The leaves of `baseline`'s ledger line that `current`'s does not reproduce (compare_leaves)."""
    return compare_leaves(baseline.to_json(), current.to_json())


def compare_leaves(baseline: dict, current: dict) -> Audit:
    """Two ledger lines (JSON objects), leaf by leaf."""
    old, new = leaves(baseline), leaves(current)
    if baseline.get("schema") != current.get("schema"):  # an earlier schema: its own leaves, not its version
        old.pop("schema", None)
        paths = list(old)
    else:
        paths = list(old) + [path for path in new if path not in old]
    changes = [Change(p, old.get(p, _ABSENT), new.get(p, _ABSENT)) for p in paths
               if not _same(old.get(p, _ABSENT), new.get(p, _ABSENT))]
    return Audit(len(old), changes)
