"""Conversations: turn k of a cached chat, rebuilt the ways servers and clients rebuild it (docs/protocol.md §16).

Per bank row and cell, the conversation of the same id from the conversation bank beside the prefix bank
(inputs/conversations.py): its fixed user turns, each rendered alone through the bank's chat template with the
generation prompt. At each turn k, four constructions (engine/conversation.py) and a replica of each:
- session: one cache carried across turns, the assistant turns decoded live (this run's tokens: the
  history every other construction replays), each user turn appended in one call;
- replay: one call over the session's token history;
- rerendered: one call over the messages (user turns, assistant turns as decoded text) rendered through the
  template and tokenized again: where its ids differ from the generated ones, the record says at which turn,
  position and why, and its cache is compared over the tokens both histories share;
- incremental: the token history one token per call.
From each state the same greedy decoder writes the assistant turn k (an arm's suffix), compared pair by pair.
On a serving engine (vLLM) each arm also records the engine's counters for its request (`served`), and each turn
k >= 2 the session's prefix-cache hit (`prefix_hit`): a session's only where it reached into a block written
while turn k-1 decoded (`covers_decode`), else vacuous (docs/vllm.md, "Conversations").
"""

from __future__ import annotations

import functools
from pathlib import Path

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Boundary, check_same_state, check_storage_isolated
from replaytests.engine.comparisons import first_divergence
from replaytests.engine.conversation import TurnState, end_of_turn, graded, user_segments
from replaytests.errors import BankError, FailClosed
from replaytests.families.registry import FAMILIES
from replaytests.families.serving import SERVED, prefix_hit
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base
from replaytests.inputs.bank import BankRow
from replaytests.inputs.conversations import Conversation, read_conversations, read_template
from replaytests.outputs.records import Record, title

FAMILY = FAMILIES["conversation"]


@functools.cache
def _bank(path: Path, vocab_size: int, cap: int) -> dict[str, tuple[Conversation, str]]:
    """Each conversation by id, with its chat template's text (read once per process)."""
    return {c.id: (c, read_template(path, c)) for c in read_conversations(path, vocab_size, cap)}


def conversation_of(runtime: Backend, row: BankRow,
                    settings: dict) -> tuple[Conversation, str, int, list[list[int]]] | None:
    """The row's conversation (None: the bank has none of its id), its template, the template's end-of-turn
    token and each user turn's segment, tokenized."""
    found = _bank(settings["bank"], len(runtime.grammar.content), settings["cap"]).get(row.id)
    if found is None:
        return None
    conversation, template = found
    closer, users = chat(runtime, template, [t.user for t in conversation.turns],
                         f"{settings['bank']}:{conversation.line} (conversation {conversation.id}): field 'template'")
    return conversation, template, closer, users


def chat(runtime: Backend, template: str, users: list[str], where: str) -> tuple[int, list[list[int]]]:
    """The template's end-of-turn token (each assistant turn's closer) and each user turn's segment as a
    token-in session appends it, tokenized (engine/conversation.py). A template that fails to render, or
    writes no single end-of-turn token, is a BankError naming `where`."""
    def render(messages: list[dict], generation_prompt: bool) -> str:
        try:
            return runtime.render(template, messages, generation_prompt)
        except Exception as exc:  # jinja2's errors, and whatever a template's own raise_exception raises
            raise BankError(f"{where}: the chat template fails to render: {type(exc).__name__}: {exc}") from None

    closer = end_of_turn(render, runtime.encode, runtime.decode, where)
    return closer, [runtime.encode(text) for text in user_segments(render, runtime.decode([closer]), users, where)]


def messages(conversation: Conversation, answers: list[str], turn: int) -> list[dict]:
    """The chat through user turn `turn` (1-based), the assistant turns as the text a client keeps."""
    out = []
    for index, t in enumerate(conversation.turns[:turn]):
        out.append({"role": "user", "content": t.user})
        if index < turn - 1:
            out.append({"role": "assistant", "content": answers[index]})
    return out


def spans(users: list[list[int]], answers: list[list[int]], turn: int) -> list[tuple[int, str, int, int]]:
    """(turn, segment, start, end) of each part of the generated history through user turn `turn`."""
    out, start = [], 0
    for index in range(turn):
        out.append((index + 1, "user", start, start + len(users[index])))
        start += len(users[index])
        if index < turn - 1:
            out.append((index + 1, "assistant", start, start + len(answers[index])))
            start += len(answers[index])
    return out


def round_trips(ids: list[int], encode, decode) -> str | None:
    """Why an assistant turn's content ids do not come back from its text (None where they do)."""
    text = decode(ids)
    again = encode(text)
    if again == ids:
        return None
    if "\ufffd" in text:
        return "lossy decode: the turn's ids decode to text with U+FFFD (bytes that are not UTF-8, replaced)"
    return "retokenized: the turn's text encodes to other ids (a merge the model did not make)"


def rerender_difference(history: list[int], rendered: list[int], users: list[list[int]], answers: list[list[int]],
                        turn: int, encode, decode) -> dict:
    """Where the re-rendered history first differs from the generated one, in which turn and part, and why."""
    index = first_divergence(history, rendered)
    not_round_tripping = [n + 1 for n, ids in enumerate(answers[:turn - 1]) if round_trips(ids[:-1], encode, decode)]
    out = {"ids_equal": index is None, "length": len(rendered), "shared": len(history) if index is None else index,
           "first_difference": index, "turn": None, "segment": None, "reason": None,
           "turns_not_round_tripping": not_round_tripping}
    if index is None:
        return out
    where = next(((t, part, start, end) for t, part, start, end in spans(users, answers, turn) if start <= index < end),
                 None)
    if where is None:
        reason = f"template: the re-rendered history has {len(rendered)} tokens, the generated one {len(history)}"
        return out | {"turn": turn, "segment": "user", "reason": reason}
    t, part, start, end = where
    content_reason = round_trips(answers[t - 1][:-1], encode, decode) if part == "assistant" else None
    reason = content_reason if content_reason and index < end - 1 else (
        f"template: the rendering's ids differ from the {'generated' if part == 'assistant' else 'appended'} "
        f"{part} turn at its token {index - start} ({history[index]} generated, "
        f"{rendered[index] if index < len(rendered) else 'none'} rendered)")
    return out | {"turn": t, "segment": part, "reason": reason}


def _shared(boundary: Boundary, count: int) -> Boundary:
    """The boundary's cache and tokens over the first `count` positions (its logits kept: they are compared as
    the two arms' next-token logits, at different positions where the histories differ)."""
    return Boundary(boundary.construction, boundary.tokens[:count], boundary.roles[:count],
                    _Prefix(boundary.layers, count) if boundary.has_kv else None, boundary.logits)


class _Prefix:
    """A cache read over its first positions (Boundary.layers reads `layers[i].keys` and `get_seq_length`)."""

    def __init__(self, layers, count: int) -> None:
        self.layers = [_Layer(keys[:, :, :count], values[:, :, :count]) for keys, values in layers]
        self._count = count

    def get_seq_length(self) -> int:
        return self._count


class _Layer:
    def __init__(self, keys, values) -> None:
        self.keys, self.values = keys, values


def _turn_record(k: int, states: dict[str, TurnState], conversation: Conversation, rerendered: dict) -> dict:
    expected = conversation.turns[k - 1].expected_answer
    boundaries = {arm: s.boundary for arm, s in states.items()}
    suffixes = {arm: s.answer for arm, s in states.items()}
    arms = {arm: arm_record(states[arm].boundary, s, expected) | {"correct": graded(s.answer, expected)}
            | _served(states[arm]) for arm, s in suffixes.items()}
    # A re-rendered history against a generated one: over the ids they share; a pair of one history: whole.
    cut = boundaries if rerendered["ids_equal"] else {arm: _shared(b, rerendered["shared"])
                                                      for arm, b in boundaries.items()}
    comparisons = {}
    for a, b in FAMILY.pairs:
        crosses = a.startswith("rerendered") != b.startswith("rerendered")
        comparisons |= compare_arms([(a, b)], cut if crosses else boundaries, suffixes, arms)
    return {"turn": k, "history_len": len(states["session"].boundary.tokens), "expected_answer": expected,
            "session_matches_bank": tuple(states["session"].answer.tokens) == conversation.turns[k - 1].assistant_ids,
            "arms": arms, "comparisons": comparisons,
            "rerendered": rerendered,
            **({"prefix_hit": prefix_hit(arms["session"]["served"])} if k > 1 and "served" in arms["session"] else {})}


def _served(state: TurnState) -> dict:
    """A serving engine's own counters for the turn's request (vLLM's, as families/serving.py records them);
    nothing for a backend that keeps none."""
    served = state.boundary.state
    return {"served": {name: getattr(served, name) for name in SERVED}} if all(
        hasattr(served, name) for name in SERVED) else {}


def run(runtime: Backend, row: BankRow, settings: dict) -> Record:
    """The record of the conversation named like the row: every turn's constructions, checked (the same
    history for session, replay and incremental; no shared storage) and compared."""
    base = record_base(FAMILY.name, row, runtime)
    where = title(FAMILY.name, row.id, runtime.cell)
    cap = settings["cap"]
    runtime.activate()
    if (found := conversation_of(runtime, row, settings)) is None:
        return excluded(base, BankError(f"{settings['bank']}: no conversation {row.id!r}"))
    conversation, template, closer, users = found
    try:
        sessions = {arm: runtime.session(users, cap, closer, arm) for arm in ("session", "session_replica")}
        answers = [s.answer.tokens for s in sessions["session"]]
        texts = [s.answer.answer for s in sessions["session"]]
        histories = [s.boundary.tokens for s in sessions["session"]]
        rendered = [runtime.encode(runtime.render(template, messages(conversation, texts, k), True))
                    for k in range(1, len(users) + 1)]
        states = {**sessions, **{arm: runtime.replayed(arm, rendered if arm.startswith("rerendered") else histories,
                                                       cap, closer)
                                 for arm in FAMILY.arms if not arm.startswith("session")}}
        for k in range(len(users)):
            same = [states[arm][k].boundary for arm in FAMILY.arms if not arm.startswith("rerendered")]
            check_same_state(same, f"{where} turn {k + 1}")
            check_storage_isolated([states[arm][k].boundary for arm in FAMILY.arms], f"{where} turn {k + 1}")
    except FailClosed as exc:
        return excluded(base, exc)
    encode, decode = runtime.encode, runtime.decode
    turns = [_turn_record(k, {arm: states[arm][k - 1] for arm in FAMILY.arms}, conversation,
                          rerender_difference(histories[k - 1], rendered[k - 1], users, answers, k, encode, decode))
             for k in range(1, len(users) + 1)]
    return Record.of(base | {"status": "ok", "prefix_len": len(histories[-1]), "arms": turns[-1]["arms"],
                             "comparisons": turns[-1]["comparisons"], "turns": turns})
