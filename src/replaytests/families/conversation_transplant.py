"""The conversation transplant, the fourth fidelity layer across turns (docs/protocol.md §16): at a turn k where a
conversation's session and replay write different assistant turns, which turn's K/V carries the divergence?

Rows come from the finished conversation records of a cell (`panel`), as the transplant's come from the crossing:
a divergent row's turn k is its first turn whose session and replay assistant turns differ; a control (a
conversation whose session and replay agree at every turn) is run at its last turn. Session and replay, and a
replica of each, are rebuilt and checked against the conversation record (a contemporaneous baseline). Then, at
turn k, by position (engine/turn_splice.py: nothing recomputed, the recipient's own boundary logits kept):

- the validity control first: each construction's whole turn-k K/V spliced into its replica must reproduce its
  own assistant turn bit for bit, or decoding here is not a function of the cache values alone and the row is
  excluded (TransplantInvalid, with the evidence);
- per direction (the replay given the session's K/V, and the other way round), for j = 1..k, the recipient given
  the donor's K/V over positions [0, end of turn j) (turn j's user segment and assistant turn, for j < k; the
  whole turn-k history for j = k), and the assistant turn k decoded from it: follows the donor, keeps its own, or
  a third trajectory (the curve), and the earliest j that follows the donor (the carrier turn).

A row is testable only where session and replay choose the same first token at turn k: the spliced state keeps
the recipient's boundary logits, which choose that token (`not_testable_reason`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Boundary, Suffix, check_same_state, check_storage_isolated
from replaytests.engine.turn_splice import first_kv_difference
from replaytests.errors import BankError, FailClosed, NotContemporaneous, TransplantInvalid
from replaytests.families.conversation import conversation_of, spans
from replaytests.families.panels import spaced
from replaytests.families.registry import (
    CONVERSATION_SPLICE,
    FAMILIES,
    ROLES,
    SELF_SPLICES,
    SPLICE_DIRECTIONS,
    Panel,
)
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base
from replaytests.families.transplant import outcome
from replaytests.inputs.bank import BankRow
from replaytests.inputs.blocks import direction
from replaytests.outputs.conversation_transplant_outcome import divergent_turn, not_testable_reason
from replaytests.outputs.records import ConversationTurn, Record, as_written, title

FAMILY = FAMILIES["conversation_transplant"]
BUILT = tuple(arm for c in CONVERSATION_SPLICE for arm in (c, f"{c}_replica"))
ARM_FIELDS = ("suffix", "cache_digest", "logits_digest", "z_sha256")  # what the rebuilt arms must reproduce


class _Ref(NamedTuple):
    id: str
    prefix_len: int


def panel(conversation_records: list[Record], cell: str, divergent: int, controls: int) -> Panel:
    """The rows of one cell, from that cell's finished conversation records only: divergent rows (session and
    replay differ at some turn, the first tokens there agreeing), then controls (equal at every turn), each group
    at spaced order statistics of history length."""
    finished = [r for r in conversation_records if r.family == "conversation" and r.precision == cell and r.ok]
    split = {r.row: turn for r in finished if (turn := divergent_turn(r)) is not None}
    refs = {r.row: _Ref(r.row, r.prefix_len) for r in finished}
    testable = [refs[row] for row, turn in split.items() if not not_testable_reason(turn)]
    equal = [refs[r.row] for r in finished if r.row not in split]
    by_length = {ref.id: (ref.prefix_len, ref.id) for ref in refs.values()}
    return Panel([(ref.id, "divergent") for ref in spaced(testable, divergent)]
                 + [(ref.id, "control") for ref in sorted(spaced(equal, controls), key=lambda r: by_length[r.id])],
                 sorted((row, reason) for row, turn in split.items() if (reason := not_testable_reason(turn))))


def turn_of(record: Record, role: str) -> int:
    """The turn a row is transplanted at: a divergent row's first divergent turn, a control's last turn."""
    if role == "divergent":
        turn = divergent_turn(record)
        if turn is None:
            raise ValueError(f"{record.title}: no turn whose session and replay assistant turns differ")
        return turn.turn
    return len(record.turns)


def turn_ends(users: list[list[int]], answers: list[list[int]], turn: int) -> list[int]:
    """The end of each turn j = 1..`turn` in the turn-`turn` history: its assistant turn's closer for j < turn, the
    history's end (its user segment and generation prompt) for j = turn."""
    parts = spans(users, answers, turn)
    return [end for _, segment, _, end in parts if segment == "assistant"] + [parts[-1][3]]


def check_contemporaneous(rebuilt: dict[str, dict], turn: ConversationTurn, where: str) -> None:
    """The rebuilt arms (as the ledger holds them) reproduce the conversation record's at the turn."""
    for arm, fields in rebuilt.items():
        held = turn.arms[arm].to_json()
        for field in ARM_FIELDS:
            if held.get(field) != fields[field]:
                raise NotContemporaneous(f"{where}: not contemporaneous: rebuilt {arm} {field} at turn {turn.turn} "
                                         "differs from the conversation record")


@dataclasses.dataclass
class _Turn:
    """Session and replay (and their replicas) at turn k, and splices between them."""

    runtime: Backend
    boundaries: dict[str, Boundary]
    suffixes: dict[str, Suffix]
    cap: int
    closer: int
    answers: list[list[int]]  # the session's assistant turns before turn k (content and closer): the history's

    def attempt(self, recipient: str, donor: str, end: int) -> tuple[Boundary, Suffix, dict]:
        moved = self.runtime.splice(self.boundaries[recipient], self.boundaries[donor], end)
        answer = self.runtime.answer(moved, self.cap, self.closer)
        return moved, answer, outcome(answer.tokens, self.suffixes[donor].tokens, self.suffixes[recipient].tokens)


def _rebuild(runtime: Backend, users: list[list[int]], cap: int, closer: int, k: int, where: str) -> _Turn:
    sessions = {arm: runtime.session(users, cap, closer, arm) for arm in ("session", "session_replica")}
    histories = [s.boundary.tokens for s in sessions["session"]]
    states = sessions | {arm: runtime.replayed(arm, histories, cap, closer) for arm in ("replay", "replay_replica")}
    boundaries = {arm: dataclasses.replace(states[arm][k - 1].boundary, construction=arm) for arm in BUILT}
    check_same_state(list(boundaries.values()), f"{where} turn {k}")
    check_storage_isolated(list(boundaries.values()), f"{where} turn {k}")
    return _Turn(runtime, boundaries, {arm: states[arm][k - 1].answer for arm in BUILT}, cap, closer,
                 [s.answer.tokens for s in sessions["session"][:k - 1]])


def check_valid(comparisons: dict, where: str) -> None:
    """The validity control: each self-splice (the whole history into the construction's replica) reproduced
    its construction's own assistant turn bit for bit; else TransplantInvalid with the evidence."""
    for name, own in SELF_SPLICES:
        metrics = comparisons[f"{name}~{own}"]
        if not metrics["suffix_equal"]:
            raise TransplantInvalid(
                f"{where}: transplant invalid here: decoding is not a function of the cache values alone: {own}'s "
                f"K/V spliced into its replica ({name}) diverges from {own}'s own assistant turn at token "
                f"{metrics['first_divergence']} (cache {'bit-exact' if metrics['cache_exact'] else 'not bit-exact'}, "
                f"boundary logits {'bit-equal' if metrics['logits_exact'] else 'different'})")


def run(runtime: Backend, row: BankRow, conversation_record: Record, role: str, settings: dict) -> Record:
    """The record of one panel row (`role` "divergent" or "control") at the runtime's cell."""
    if role not in ROLES:
        raise ValueError(f"conversation transplant role must be one of {ROLES}, got {role!r}")
    base = record_base(FAMILY.name, row, runtime) | {"role": role}
    where = title(FAMILY.name, row.id, runtime.cell)
    cap, k = settings["cap"], turn_of(conversation_record, role)
    runtime.activate()
    if (found := conversation_of(runtime, row, settings)) is None:
        return excluded(base, BankError(f"{settings['bank']}: no conversation {row.id!r}"))
    conversation, _, closer, users = found
    expected = conversation.turns[k - 1].expected_answer
    try:
        trial = _rebuild(runtime, users, cap, closer, k, where)
        arms = as_written({arm: arm_record(trial.boundaries[arm], trial.suffixes[arm], expected) for arm in BUILT})
        check_contemporaneous(arms, conversation_record.turns[k - 1], where)
        history = trial.boundaries["session"].tokens
        ends = turn_ends(users, trial.answers, k)
        selves = {name: trial.attempt(name.split("<-")[0], own, len(history)) for name, own in SELF_SPLICES}
        curves = {direction(r, d): [trial.attempt(r, d, end) for end in ends] for r, d in SPLICE_DIRECTIONS}
        moved = selves | {name: curve[-1] for name, curve in curves.items()}
        boundaries = trial.boundaries | {name: b for name, (b, _, _) in moved.items()}
        suffixes = trial.suffixes | {name: s for name, (_, s, _) in moved.items()}
        arms |= {name: arm_record(b, s, expected) for name, (b, s, _) in moved.items()}
        comparisons = compare_arms(FAMILY.pairs, boundaries, suffixes, arms)
        check_valid(comparisons, where)
        differs = first_kv_difference(trial.boundaries["session"], trial.boundaries["replay"])
    except FailClosed as exc:
        return excluded(base, exc)
    steps = {name: [{"turn": j, "end": end, "cache_digest": b.cache_digest(), "suffix": s.tokens} | result
                    for j, (end, (b, s, result)) in enumerate(zip(ends, curve, strict=True), start=1)]
             for name, curve in curves.items()}
    splice = {"turn": k, "history_len": len(history), "turn_ends": ends, "first_kv_difference": differs,
              "first_kv_difference_turn": None if differs is None else next(j for j, e in enumerate(ends, 1)
                                                                            if differs < e),
              "curves": steps,
              # a control's donor and own assistant turns agree: following one is following both, no carrier
              "carrier_turn": {name: next((s["turn"] for s in curve if s["outcome"] == "follows_donor"), None)
                               if role == "divergent" else None for name, curve in steps.items()}}
    return Record.of(base | {"status": "ok", "prefix_len": len(history), "expected_answer": expected, "arms": arms,
                             "comparisons": comparisons,
                             "transplants": {name: curve[-1][2] for name, curve in curves.items()},
                             "turn_splice": splice})
