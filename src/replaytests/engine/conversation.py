"""A conversation's turns as the families see them (docs/protocol.md §16, "Conversations"): the state a
construction reached at turn k, just before the assistant's first token, and the assistant turn decoded from it;
and what a chat template says about a conversation's tokens (its end-of-turn token, each user turn's segment).

Every token of a conversation takes the prompt's role, so attention is plain causal under either visibility
(a chat is not the protocol's multi-branch reasoning). An assistant turn is decoded greedily: any content token
or the template's end-of-turn token (the closer), only the closer once the turn holds `cap` content tokens.

No torch here: the registry and the outputs read the names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replaytests.errors import BankError

if TYPE_CHECKING:
    from replaytests.engine.boundary import Boundary, Suffix

# session: one cache carried across turns, assistant turns decoded live, each user turn appended in one call;
# replay: one call over the token history (the generated ids kept); rerendered: one call over the history as
# the chat template renders the messages, tokenized again; incremental: the token history one token per call.
CONSTRUCTIONS = ("session", "replay", "rerendered", "incremental")
ONE_CALL = ("replay", "rerendered")  # one prefill call per turn


@dataclass(frozen=True)
class TurnState:
    """One construction at turn k (1-based): its state over the history through the generation prompt, and
    the assistant turn decoded from there (content ids, then the closer)."""

    construction: str
    turn: int
    boundary: Boundary
    answer: Suffix


# An assistant turn's content as the template sees it when the suite reads the template's structure: it never
# reaches a tokenizer, and no chat holds it.
SENTINEL = "\x00replaytests-assistant-content\x00"

Render = Callable[[list[dict], bool], str]  # messages, generation prompt -> the template's text


def _chat(users: list[str], turn: int) -> list[dict]:
    out = []
    for index, user in enumerate(users[:turn]):
        out += [{"role": "user", "content": user}] + ([{"role": "assistant", "content": SENTINEL}]
                                                      if index < turn - 1 else [])
    return out


def _after_last_answer(text: str, where: str) -> str:
    if SENTINEL not in text:
        raise BankError(f"{where}: the chat template drops the assistant turn's content")
    return text[text.rindex(SENTINEL) + len(SENTINEL):]


def end_of_turn(render: Render, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
                where: str) -> int:
    """The token the template closes an assistant turn with: the first token of what it writes after the
    content (one token: `<|im_end|>` for ChatML, the answer closer for the tiny model's template)."""
    tail = _after_last_answer(render([{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}],
                                     False), where)
    ids = encode(tail)
    if not ids or not tail.startswith(decode(ids[:1])) or not decode(ids[:1]):
        raise BankError(f"{where}: the chat template writes {tail!r} after an assistant turn, which does not begin "
                        f"with one token (expected an end-of-turn token such as <|im_end|>)")
    return ids[0]


def user_segments(render: Render, closer_text: str, users: list[str], where: str) -> list[str]:
    """Each user turn's text as a token-in session appends it (after the previous assistant turn's content and
    its closer): turn 1 the whole rendering through it (a system prompt included), turn k what the template
    writes after turn k-1's closer through turn k's generation prompt."""
    out = [render(_chat(users, 1), True)]
    for turn in range(2, len(users) + 1):
        after = _after_last_answer(render(_chat(users, turn), True), f"{where} turn {turn}")
        if not after.startswith(closer_text):
            raise BankError(f"{where} turn {turn}: the chat template writes {after[:40]!r} after an assistant "
                            f"turn, not its end-of-turn token {closer_text!r} first")
        out.append(after[len(closer_text):])
    return out


NUMBER_WORDS = {word: str(n) for n, word in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"))}
_WORDS = re.compile(r"-?\d+|[^\W\d_]+")


def graded(answer: str, expected: str | None) -> bool | None:
    """Whether a chat's assistant turn answers `expected` (None: no key). A chat model answers in a sentence
    ("The capital of France is Paris.", "7 + 6 = 13", "A dog has four legs."), so the turn's final answer is
    read as an evaluation harness reads it: for a numeric key its last number (digits or a number word up to
    twenty), else its last word, compared case-insensitively."""
    if expected is None:
        return None
    words = _WORDS.findall(answer)
    if re.fullmatch(r"-?\d+", expected.strip()):
        numbers = [w if w[-1].isdigit() else NUMBER_WORDS.get(w.casefold()) for w in words]
        numbers = [n for n in numbers if n is not None]
        return bool(numbers) and int(numbers[-1]) == int(expected)
    return bool(words) and words[-1].casefold() == expected.strip().casefold()
