"""Result objects: a ledger record and its parts as frozen types, read from the ledger's JSON and written
back to it (docs/ledger.md holds the schema; this module is its one reading).

- `from_json` reads a record of every readable ledger version and refuses a malformed one with a
  `RecordError` naming the field by its path (`arms.prefill.suffix[3]`); the ledger reader adds the file
  and the line.
- `to_json` writes a record back as the JSON it was read from, byte for byte under `json.dumps(...,
  sort_keys=True)` (tests/unit/test_records.py runs the round trip over every committed ledger).
- `None` is the one spelling of "not measured" (a K/V comparison where a runtime exposes no K/V, a
  correctness label without an expected answer). A field that a record's version or family does not carry
  reads as `None` too (an excluded record's arms and comparisons: as empty); the record keeps the names of
  those (`absent`) only to write them back as they were.
- Each field says whether it fingerprints numbers (`BITS`): the audit's line between bits and trajectories.
- A family makes each record once (`Record.of`), and nothing changes it after: the types are frozen.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replaytests.errors import short

JSON = Any  # a JSON value kept as read (lists as tuples, objects as read-only mappings)
SCHEMA_PREFIX = "replaytests.ledger/"
LATEST = 5  # the ledger version families write
SCHEMA = f"{SCHEMA_PREFIX}{LATEST}"
READABLE = tuple(f"{SCHEMA_PREFIX}{n}" for n in range(1, LATEST + 1))


class RecordError(ValueError):
    """A record that is not one: `field` is the path of the offending value, `problem` what is wrong."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"field {field_path!r}: {problem}" if field_path else problem)
        self.field, self.problem = field_path, problem


def since(version: float) -> dict:
    """A field every record of this ledger version and later carries; an earlier one lacks it."""
    return {"since": version}


OPTIONAL = since(math.inf)  # a field no version requires: another family's, or a runtime's
# A field that fingerprints the numbers at a boundary or a step (a digest, a drift, a bit-exactness flag, a
# decision margin): a change of it alone is a change of bits. Every other field belongs to a trajectory (a
# suffix, an answer, a label, a z, an outcome, a status), so a new field is never taken for mere bits.
BITS = {"bits": True}


@dataclass(frozen=True)
class Part:
    """What every result type shares: reading itself from JSON, strictly, and writing itself back."""

    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False, kw_only=True)

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name != "absent"]

    @classmethod
    def from_json(cls, value: object, where: str = "", version: int = LATEST):
        """The result `value` holds, read as a record of ledger `version` writes it."""
        if not isinstance(value, dict):
            raise RecordError(where, f"expected an object, got {short(value)}")
        plan = _plan(cls)
        if unknown := sorted(set(value) - plan.keys()):
            raise RecordError(_join(where, unknown[0]), f"no {cls.__name__} field has this name")
        read, absent = {}, set()
        for name, (first, reader) in plan.items():
            if name in value:
                if version < first < math.inf:
                    raise RecordError(_join(where, name), f"not a field of {SCHEMA_PREFIX}{version} records (it came "
                                                          f"with {SCHEMA_PREFIX}{first})")
                read[name] = reader(value[name], _join(where, name), version)
            elif version < first:
                absent.add(name)
            else:
                raise RecordError(_join(where, name), "missing")
        record = cls(**read, absent=frozenset(absent))
        record.check(where)
        return record

    def check(self, where: str) -> None:
        """What a type requires beyond its fields' types (nothing, unless a subclass says)."""

    def to_json(self) -> dict:
        return {f.name: _write(getattr(self, f.name)) for f in self._fields() if f.name not in self.absent}


@functools.cache
def _plan(cls: type[Part]) -> dict[str, tuple[float, object]]:
    """Each field of a result type: the first ledger version whose records all carry it (never, for one a
    record may lack), and the reader of its value."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f.metadata.get("since", 1), _reader(hints[f.name])) for f in cls._fields()}


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
# bool is an int in Python and an int is a number in JSON: a float field keeps an integer as written
_SCALARS = {str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool),
            int: lambda v: isinstance(v, int) and not isinstance(v, bool),
            float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), type(None): lambda v: v is None}


@functools.cache
def _exact_types(hint: object) -> frozenset[type] | None:
    """The types a value read from JSON for a scalar hint or a union of scalars may have, exactly (`type(v)`,
    no subclass: bool is not int here), else None. A value of one of them passes its test without a call, and a
    list of them without a call per item (a ledger holds hundreds of thousands); any other is tested as before."""
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not all(kind in _SCALARS for kind in kinds):
        return None
    return frozenset(exact for kind in kinds for exact in ((int, float) if kind is float else (kind,)))


@functools.cache
def _scalar_test(hint: object):
    """A test of one value for a scalar hint or a union of scalars, else None."""
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not all(kind in _SCALARS for kind in kinds):
        return None
    tests = [_SCALARS[kind] for kind in kinds]
    return tests[0] if len(tests) == 1 else lambda v: any(test(v) for test in tests)


@functools.cache
def _reader(hint: object):
    """The function `(value, path, version)` that reads a value of `hint`: a Part, a tuple, a mapping of
    strings, a scalar, or a union of those (built once per hint: a ledger holds many records)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if (test := _scalar_test(hint)) is not None:
        exact = _exact_types(hint)

        def scalar(value, path, version):
            if type(value) not in exact and not test(value):
                raise RecordError(path, f"expected {_describe(hint)}, got {short(value)}")
            return value
        return scalar
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        inner = [_reader(kind) for kind in kinds]

        def union(value, path, version):
            if value is None and type(None) in args:
                return None
            if len(inner) == 1:
                return inner[0](value, path, version)
            for read in inner:
                try:
                    return read(value, path, version)
                except RecordError:
                    continue
            raise RecordError(path, f"expected {_describe(hint)}, got {short(value)}")
        return union
    if isinstance(hint, type) and issubclass(hint, Part):
        return hint.from_json
    if origin is tuple:
        item_test, item_types, read_item = _scalar_test(args[0]), _exact_types(args[0]), _reader(args[0])

        def sequence(value, path, version):
            if not isinstance(value, list):
                raise RecordError(path, f"expected a list, got {short(value)}")
            if item_types is not None and item_types.issuperset(map(type, value)):
                return tuple(value)
            if item_test is not None:
                bad = next((i for i, item in enumerate(value) if not item_test(item)), None)
                if bad is not None:
                    read_item(value[bad], f"{path}[{bad}]", version)  # raises, naming the item
                return tuple(value)
            return tuple(read_item(item, f"{path}[{i}]", version) for i, item in enumerate(value))
        return sequence
    if origin is Mapping:
        read_item = _reader(args[1])

        def mapping(value, path, version):
            if not isinstance(value, dict):
                raise RecordError(path, f"expected an object, got {short(value)}")
            return types.MappingProxyType({key: read_item(item, _join(path, key), version)
                                           for key, item in value.items()})
        return mapping
    if hint is JSON:
        return lambda value, path, version: _freeze(value)
    raise TypeError(f"records: no reader for {hint!r}")


def as_written(value: object) -> object:
    """A plain Python value as the ledger's JSON reads back (a tuple as a list, a key as a string)."""
    return json.loads(json.dumps(value))


def _describe(hint: object) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, typing.get_args(hint)))
    if isinstance(hint, type) and issubclass(hint, Part):
        return f"a {hint.__name__.lower()} object"
    return "a list" if origin is tuple else "an object" if origin is Mapping else _NAMES.get(hint, str(hint))


def _freeze(value: object) -> object:
    if isinstance(value, list):
        return tuple(map(_freeze, value))
    if isinstance(value, dict):
        return types.MappingProxyType({key: _freeze(item) for key, item in value.items()})
    return value


def _write(value: object) -> object:
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, tuple):
        return [_write(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _write(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class LayerDigests(Part):
    """One K and one V digest per layer, in layer order."""

    k: tuple[str, ...]
    v: tuple[str, ...]

    def check(self, where: str) -> None:
        if len(self.k) != len(self.v):
            raise RecordError(where, f"{len(self.k)} K and {len(self.v)} V digests: expected one each per layer")


@dataclass(frozen=True)
class Served(Part):
    """A serving engine's own counters for one request (families/serving.py)."""

    cached_tokens: int
    prompt_block_tokens: int
    prefill_steps: int | None
    steps_digest: str = field(metadata=BITS)


@dataclass(frozen=True)
class Arm(Part):
    """One construction's boundary fingerprints and the suffix decoded from it."""

    suffix: tuple[int, ...]
    answer: str
    correct: bool | None
    cache_digest: str | None = field(metadata=BITS)  # None: the runtime exposes no K/V
    logits_digest: str = field(metadata=BITS)
    z_sha256: str
    layer_digests: LayerDigests | None = field(default=None, metadata=since(3) | BITS)
    # each suffix step's top-1 minus top-2 logit; None at a step where one token was eligible
    margins: tuple[float | None, ...] | None = field(default=None, metadata=since(4) | BITS)
    served: Served | None = field(default=None, metadata=OPTIONAL)
    # a quantized cache's codes, scales and residual
    stored_digest: str | None = field(default=None, metadata=OPTIONAL | BITS)
    # a rollout arm (families/rollout.py): each response token's log-probability, the two most likely ids at
    # each step, and how the log-probabilities were computed (engine/rollout.py)
    logprobs: tuple[float, ...] | None = field(default=None, metadata=OPTIONAL | BITS)
    top2: tuple[tuple[int, ...], ...] | None = field(default=None, metadata=OPTIONAL | BITS)
    logprobs_mode: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class Comparison(Part):
    """Two arms compared: their boundaries (K/V, logits) and their suffixes."""

    cache_exact: bool | None = field(metadata=BITS)
    k_max_abs: float | None = field(metadata=BITS)
    k_rel_l2: float | None = field(metadata=BITS)
    v_max_abs: float | None = field(metadata=BITS)
    v_rel_l2: float | None = field(metadata=BITS)
    k_max_abs_per_layer: tuple[float, ...] | None = field(metadata=BITS)
    k_rel_l2_per_layer: tuple[float, ...] | None = field(metadata=BITS)
    v_max_abs_per_layer: tuple[float, ...] | None = field(metadata=BITS)
    v_rel_l2_per_layer: tuple[float, ...] | None = field(metadata=BITS)
    logits_exact: bool = field(metadata=BITS)
    logits_max_abs: float = field(metadata=BITS)
    argmax_equal: bool = field(metadata=BITS)
    suffix_equal: bool
    first_divergence: int | None
    answer_equal: bool
    correct_equal: bool
    margins_at_divergence: tuple[float | None, ...] | None = field(metadata=BITS)
    first_token_equal: bool | None = field(default=None, metadata=since(2))
    top1_at_divergence: JSON = field(default=None, metadata=since(4) | BITS)
    stored_exact: bool | None = field(default=None, metadata=OPTIONAL | BITS)
    steps_exact: bool | None = field(default=None, metadata=OPTIONAL | BITS)
    steps_first_difference: int | None = field(default=None, metadata=OPTIONAL | BITS)
    steps_max_abs: float | None = field(default=None, metadata=OPTIONAL | BITS)
    # two rollout arms (outputs/mismatch.py, docs/ledger.md "Rollout measures"), over the response tokens they
    # share: every log-probability bitwise equal; how many tokens, how many equal; |delta logp| max, median,
    # 99th percentile; the k3 estimate of KL per token; tokens with the ratio outside the bounds; the first
    # position past the |delta logp| threshold
    logprobs_exact: bool | None = field(default=None, metadata=OPTIONAL | BITS)
    logprob_tokens: int | None = field(default=None, metadata=OPTIONAL)
    logprob_tokens_equal: int | None = field(default=None, metadata=OPTIONAL | BITS)
    abs_dlogp_max: float | None = field(default=None, metadata=OPTIONAL | BITS)
    abs_dlogp_median: float | None = field(default=None, metadata=OPTIONAL | BITS)
    abs_dlogp_p99: float | None = field(default=None, metadata=OPTIONAL | BITS)
    k3: float | None = field(default=None, metadata=OPTIONAL | BITS)
    outside_bounds: int | None = field(default=None, metadata=OPTIONAL | BITS)
    first_exceeding: int | None = field(default=None, metadata=OPTIONAL | BITS)


@dataclass(frozen=True)
class RolloutSettings(Part):
    """How a rollout record's rollout was drawn and judged (families/rollout.py)."""

    mode: str  # greedy or sampled
    length: int
    seed: int | None  # the sampler's per-row seed (engine.rollout.row_seed); None where greedy
    temperature: float
    top_p: float
    ratio_low: float
    ratio_high: float
    delta_threshold: float


@dataclass(frozen=True)
class Rerendered(Part):
    """A conversation turn's history as the chat template renders the messages, tokenized again, against the
    token history the session generated (families/conversation.py)."""

    ids_equal: bool
    length: int  # tokens of the re-rendered history
    shared: int  # tokens it has in common with the generated history, from the start
    first_difference: int | None  # the position of the first id that differs (None: equal)
    turn: int | None  # the turn whose part of the history holds it
    segment: str | None  # "user" or "assistant": which part of that turn
    reason: str | None  # why: a lossy decode, a retokenization, the template's edit
    # the earlier assistant turns whose ids decode to text that encodes to other ids
    turns_not_round_tripping: tuple[int, ...]


@dataclass(frozen=True)
class ConversationTurn(Part):
    """One turn k of a conversation: every construction's state before the assistant's first token, the
    assistant turn decoded from it (an arm's suffix), and the pairs compared."""

    turn: int
    history_len: int  # tokens of the generated history through the generation prompt
    expected_answer: str | None
    session_matches_bank: bool  # the session's assistant turn is the bank's (the ids it was frozen with)
    arms: Mapping[str, Arm]
    comparisons: Mapping[str, Comparison]
    rerendered: Rerendered
    # a serving engine's (vLLM): the session's prefix-cache hit at turn k >= 2, and whether it read a block written
    # while turn k-1 decoded (families/conversation.py)
    prefix_hit: PrefixHit | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class Outcome(Part):
    """Where a transplanted construction's suffix went: its donor's trajectory or its own."""

    outcome: str
    first_divergence_vs_donor: int | None
    first_divergence_vs_own: int | None


@dataclass(frozen=True)
class PartOutcome(Outcome):
    """A transplant of one part of the cache (K only, V only), with its result."""

    cache_digest: str = field(metadata=BITS)
    suffix: tuple[int, ...]


@dataclass(frozen=True)
class SpliceStep(Outcome):
    """One position splice of the conversation transplant: the recipient given the donor's K/V over turns 1 to
    `turn` (positions [0, end)), and the assistant turn decoded from it (families/conversation_transplant.py)."""

    turn: int
    end: int
    cache_digest: str = field(metadata=BITS)
    suffix: tuple[int, ...]


@dataclass(frozen=True)
class TurnSplice(Part):
    """The conversation transplant at turn k: per direction, the splice of every turn j = 1..k (the curve) and the
    earliest j whose K/V carries the donor's assistant turn."""

    turn: int  # k: the turn whose assistant turn is decoded (a divergent row's first session~replay divergence)
    history_len: int  # tokens of the turn-k history (the spliced state's positions)
    turn_ends: tuple[int, ...]  # the end of turn j's positions (its assistant turn's closer; turn k: the history)
    # the first position whose K or V (any layer) differs between session and replay, and its turn (None: equal)
    first_kv_difference: int | None = field(metadata=BITS)
    first_kv_difference_turn: int | None = field(metadata=BITS)
    curves: Mapping[str, tuple[SpliceStep, ...]]  # direction -> the splice of turns 1..j, for j = 1..k
    carrier_turn: Mapping[str, int | None]  # direction -> the earliest j whose splice follows the donor (None: none)

    def check(self, where: str) -> None:
        if len(self.turn_ends) != self.turn:
            raise RecordError(_join(where, "turn_ends"), f"{len(self.turn_ends)} ends for turn {self.turn}: expected "
                                                         "one per turn 1..k")
        for name, curve in self.curves.items():
            if [step.turn for step in curve] != list(range(1, self.turn + 1)):
                raise RecordError(_join(where, f"curves.{name}"), f"turns {[step.turn for step in curve]}: expected "
                                                                  f"1..{self.turn}")


@dataclass(frozen=True)
class SweepPoint(Part):
    """One point of an edge sweep (families/sweep.py): the swept axis and its value, the engine edge the point sits
    beside, every arm's state there and the continuation decoded from it, and the pairs compared."""

    axis: str  # the axis swept: "position" (the prefix's length), "batch" (other requests beside it), ...
    value: int
    # the edge the point sits beside, by the contract field that sets it: "runtime.vllm.block_size 32 x2 - 1"; None
    # where the point is the row's own (its whole prefix)
    edge: str | None
    tokens: int  # the prefix the arms consumed (the row's first `tokens`)
    arms: Mapping[str, Arm]
    comparisons: Mapping[str, Comparison]
    served: JSON = field(default=None, metadata=OPTIONAL)  # what the engine counted at this point, per arm


@dataclass(frozen=True)
class ZDifference(Part):
    """Where a live z first differs from the bank row's (None past an end)."""

    index: int
    live: int | None
    bank: int | None


@dataclass(frozen=True)
class PrefixHit(Part):
    """A serving engine's prefix-cache hit, and whether it reused a block the live request decoded."""

    cached_tokens: int
    prompt_block_tokens: int
    covers_decode: bool


STATUSES = ("ok", "excluded")


def title(family: str, row: str, cell: str) -> str:
    """A record as a sentence names it (before it exists, too): `crossing row tiny-001 (bf16)`."""
    return f"{family} row {row} ({cell})"


KEY_FIELDS = ("family", "row", "precision")  # what names a record: one per (family, row, cell) in a ledger
_EMPTY: Mapping = types.MappingProxyType({})


@dataclass(frozen=True)
class Record(Part):
    """One (family, row, cell) result: the ledger's line."""

    schema: str
    family: str
    row: str
    precision: str
    prefix_len: int
    status: str
    expected_answer: str | None
    reason: str | None = field(default=None, metadata=OPTIONAL)
    cell_digest: str | None = field(default=None, metadata=since(5))
    # an excluded record has no arms and no comparisons: both read as empty
    arms: Mapping[str, Arm] = field(default_factory=lambda: _EMPTY, metadata=OPTIONAL)
    comparisons: Mapping[str, Comparison] = field(default_factory=lambda: _EMPTY, metadata=OPTIONAL)
    z_matches_bank: bool | None = field(default=None, metadata=OPTIONAL)
    z_first_difference: ZDifference | None = field(default=None, metadata=OPTIONAL)
    batch: Mapping[str, int] | None = field(default=None, metadata=OPTIONAL)
    prefix_hit: PrefixHit | None = field(default=None, metadata=OPTIONAL)
    transplants: Mapping[str, Outcome] | None = field(default=None, metadata=OPTIONAL)
    role: str | None = field(default=None, metadata=OPTIONAL)
    layers: int | None = field(default=None, metadata=OPTIONAL)
    parts: Mapping[str, Mapping[str, PartOutcome]] | None = field(default=None, metadata=OPTIONAL)
    layer_search: str | None = field(default=None, metadata=OPTIONAL)
    layer_ranges: JSON = field(default=None, metadata=OPTIONAL)
    minimal_layers: JSON = field(default=None, metadata=OPTIONAL)
    rollout: RolloutSettings | None = field(default=None, metadata=OPTIONAL)
    # a conversation record: every turn (its `arms` and `comparisons` are the last turn's, for the readers
    # of every family)
    turns: tuple[ConversationTurn, ...] | None = field(default=None, metadata=OPTIONAL)
    # a conversation transplant record: the position splices at its turn (its `role` and `transplants` are read as
    # the transplant family's: the whole-history splice per direction)
    turn_splice: TurnSplice | None = field(default=None, metadata=OPTIONAL)
    # an edge sweep's record: every point, axis by axis (its `arms` and `comparisons` are the last point's, for the
    # readers of every family)
    sweep: tuple[SweepPoint, ...] | None = field(default=None, metadata=OPTIONAL)

    @classmethod
    def from_json(cls, value: object, where: str = "", version: int | None = None) -> Record:
        """A ledger record of the version its `schema` names."""
        schema = value.get("schema") if isinstance(value, dict) else None
        number = schema.removeprefix(SCHEMA_PREFIX) if isinstance(schema, str) else ""
        if not (isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX) and number.isdigit()
                and 1 <= int(number) <= LATEST):
            raise RecordError(_join(where, "schema"), f"expected {SCHEMA_PREFIX}1 to {SCHEMA_PREFIX}{LATEST}, "
                                                      f"got {short(schema)}")
        return super().from_json(value, where, int(number))

    @classmethod
    def of(cls, fields: dict) -> Record:
        """The record a family built (`fields`, as plain Python values), read as the ledger will hold it: the
        record a test reads is the one another process reads back from the run's records file."""
        return cls.from_json(as_written(fields))

    @property
    def key(self) -> tuple[str, str, str]:
        return tuple(getattr(self, name) for name in KEY_FIELDS)

    @property
    def label(self) -> str:
        """The record's key as messages name it: `family/row/precision`."""
        return "/".join(self.key)

    @property
    def title(self) -> str:
        """The record as a sentence names it: `crossing row tiny-001 (bf16)`."""
        return title(*self.key)

    @property
    def ok(self) -> bool:
        """Whether every fail-closed check passed (else the record is excluded, with its reason)."""
        return self.status == "ok"

    def check(self, where: str) -> None:
        for name in KEY_FIELDS:
            if not getattr(self, name):
                raise RecordError(_join(where, name), "expected a non-empty string")
        if self.status not in STATUSES:
            raise RecordError(_join(where, "status"), f"expected 'ok' or 'excluded', got {short(self.status)}")
        if self.status == "excluded":
            if self.reason is None:
                raise RecordError(_join(where, "reason"), "missing: an excluded record says why")
            return
        for name in ("arms", "comparisons"):
            if name in self.absent:
                raise RecordError(_join(where, name), "missing (an 'ok' record holds its arms and comparisons)")
            if not getattr(self, name):
                raise RecordError(_join(where, name), "expected a non-empty object in an 'ok' record, got {}")


def bit_fields() -> frozenset[str]:
    """The names of every field of every result type that fingerprints numbers (BITS)."""
    def types(cls: type) -> list[type]:
        return [cls, *(t for sub in cls.__subclasses__() for t in types(sub))]
    return frozenset(f.name for cls in types(Part) for f in cls._fields() if f.metadata.get("bits"))
