"""Greedy decoding under the structural mask: the live decoder and the shared suffix decoder.

Both choose the argmax of the masked logits (torch.argmax returns the first maximal index, so ties
go to the lowest id) and feed one token per forward call. The suffix decoder continues every arm
from its boundary with the same tokens, roles, positions, caps and batch; only the cache and the
boundary logits differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaytests.engine import hf_adapter
from replaytests.engine.boundary import Boundary
from replaytests.engine.protocol import ANSWER, MERGE, Caps, Cursor
from replaytests.engine.runtime import Runtime


@dataclass
class DecodeState:
    """A sequence being extended: tokens and roles so far, the grammar cursor, cache and logits."""

    runtime: Runtime
    tokens: list[int]
    roles: list[int]
    cursor: Cursor
    cache: object
    logits: torch.Tensor | None
    capacity: int

    def __post_init__(self) -> None:
        self._roles = torch.zeros(self.capacity, dtype=torch.long, device=self.runtime.device)
        self._roles[: len(self.roles)] = torch.tensor(self.roles, dtype=torch.long)
        self._top2: list[torch.Tensor] = []  # each choice's two largest masked logits, in float32

    def push(self, token: int) -> None:
        """Append a token (checked against the grammar) with the role it takes."""
        role = self.cursor.role_of_next()
        self.cursor.advance(token, self.runtime.grammar)
        self._roles[len(self.tokens)] = role
        self.tokens.append(token)
        self.roles.append(role)

    def feed(self, count: int, step: str) -> None:
        """Run the model over the last `count` pushed tokens; keep the new logits."""
        start = len(self.tokens) - count
        self.logits = self.runtime.forward(self.tokens[start:], self._roles, start, self.cache, step)

    def choose(self) -> int:
        """The greedy token under the structural mask; keep its top-2 masked logits for `margins`."""
        eligible = self.runtime.grammar.eligible(self.cursor)
        masked = self.logits.masked_fill(~eligible, float("-inf"))
        self._top2.append(torch.topk(masked.float(), 2).values)
        return int(masked.argmax())

    @property
    def margins(self) -> list[float]:
        """Top-1 minus top-2 masked logit (float32) at each choice, computed once for all of them:
        the decode loop keeps only the one device-to-host copy per step that the token needs."""
        if not self._top2:
            return []
        top2 = torch.stack(self._top2)
        return (top2[:, 0] - top2[:, 1]).tolist()

    def boundary(self, construction: str) -> Boundary:
        return Boundary(construction, list(self.tokens), list(self.roles), self.cache, self.logits)


def suffix_room(caps: Caps) -> int:
    """Tokens the suffix can add after the boundary: merge content, 3 delimiters, answer content."""
    return caps.merge + caps.answer + 3


def live_boundary(runtime: Runtime, prompt_block: list[int]) -> Boundary:
    """Ordinary generation: the prompt block in one call, then one greedy token per call,
    until the call that consumes <|merge|>."""
    caps = runtime.grammar.caps
    state = DecodeState(runtime, [], [], Cursor(), runtime.new_cache(), None,
                        capacity=len(prompt_block) + 3 * (caps.branch + 2) + 1 + suffix_room(caps))
    for token in prompt_block:
        state.push(token)
    state.feed(len(prompt_block), "live prompt block")
    while not (state.cursor.block == MERGE and state.cursor.open):
        state.push(state.choose())
        state.feed(1, f"live token {len(state.tokens) - 1}")
    return state.boundary("live")


@dataclass(frozen=True)
class Suffix:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 masked logit at each choice
    answer: str


def decode_suffix(runtime: Runtime, boundary: Boundary) -> Suffix:
    """Continue from a boundary (on a copy of its cache) through <|/answer|>."""
    cursor = Cursor(block=MERGE, open=True, count=0)
    state = DecodeState(runtime, list(boundary.tokens), list(boundary.roles), cursor,
                        hf_adapter.clone_cache(runtime.model, boundary.cache), boundary.logits,
                        capacity=len(boundary.tokens) + suffix_room(runtime.grammar.caps))
    start = len(state.tokens)
    while True:
        state.push(state.choose())
        if state.cursor.done:
            break
        state.feed(1, f"suffix token {len(state.tokens) - 1 - start}")
    suffix = state.tokens[start:]
    answer_ids = _answer_content(suffix, state.roles[start:], runtime)
    return Suffix(suffix, state.margins, runtime.tokenizer.decode(answer_ids))


def _answer_content(suffix: list[int], roles: list[int], runtime: Runtime) -> list[int]:
    delims = set(runtime.grammar.delims.all_ids)
    return [t for t, r in zip(suffix, roles, strict=True) if r == ANSWER and t not in delims]
