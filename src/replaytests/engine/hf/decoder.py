"""Greedy decoding under the structural mask: the live decoder and the shared suffix decoder.

Both choose the argmax of the masked logits (torch.argmax returns the first maximal index, so ties
go to the lowest id) and feed one token per forward call. The suffix decoder continues every arm
from its boundary with the same tokens, roles, positions, caps and batch; only the cache and the
boundary logits differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf.forward import Step, check_batch_equal, copies_differ
from replaytests.engine.protocol import MERGE, Cursor, Visibility, answer_ids
from replaytests.errors import NonFinite

CHUNK = 64  # calls whose copies are compared in one go; masked logit rows whose top two are taken in one go


@dataclass
class DecodeState:
    """A sequence being extended: tokens and roles so far, the grammar cursor, cache and logits.

    The tensors a forward call reads live in buffers sized once (`capacity` tokens), each with its
    physical-batch view: token ids and the visibility columns (protocol.Visibility). Pushing a token
    is Python only; a call writes what was pushed since the last one and reads views; a choice is
    one masked copy and its argmax, whose id is the one device-to-host copy a step makes. The calls'
    physical-batch copies are compared CHUNK calls at a time and always before the state is handed on
    (`boundary`, `settle`): a desync anywhere still fails closed, naming its call.
    """

    runtime: Step
    tokens: list[int]
    roles: list[int]
    cursor: Cursor
    cache: object
    logits: torch.Tensor | None
    capacity: int

    def __post_init__(self) -> None:
        device, batch = self.runtime.device, self.runtime.batch
        self._ids = torch.zeros(self.capacity, dtype=torch.long, device=device)
        self._ids[: len(self.tokens)] = torch.tensor(self.tokens, dtype=torch.long)
        self._batched_ids = self._ids.expand(batch, -1)
        self._visibility = Visibility(self.capacity, batch, device, self.runtime.visibility)
        self._visibility.extend(self.roles)
        self._unchecked: list[tuple[torch.Tensor, str]] = []  # (every copy's logits, step) not compared yet
        self._choices = 0
        self._masked = self._top2 = self._minus_inf = None  # allocated at the first choice

    @classmethod
    def empty(cls, runtime: Step, capacity: int) -> DecodeState:
        """A sequence with no token yet (room for `capacity`), on a new cache."""
        return cls(runtime, [], [], Cursor(), runtime.new_cache(), None, capacity)

    def push(self, token: int) -> None:
        """Append a token (checked against the grammar) with the role it takes."""
        role = self.cursor.role_of_next()
        self.cursor.advance(token, self.runtime.grammar)
        self.tokens.append(token)
        self.roles.append(role)

    def append(self, token: int, role: int) -> None:
        """Append a token outside the block grammar (a rollout's response: the model's own distribution,
        unmasked), in the role its queries take."""
        self.tokens.append(token)
        self.roles.append(role)

    def feed(self, count: int, step: str, every: bool = False) -> torch.Tensor:
        """Run the model over the last `count` pushed tokens; keep the new logits (the last position's).
        `every`: return every position's logits [count, vocab], checked across the physical batch (a
        trainer's recompute reads them all)."""
        if len(self._unchecked) == CHUNK or (every and self._unchecked):
            self.settle()
        start, end, written = len(self.tokens) - count, len(self.tokens), self._visibility.length
        if end - written == 1:
            self._ids[written] = self.tokens[written]
        else:
            self._ids[written:end] = torch.tensor(self.tokens[written:], dtype=torch.long)
        self._visibility.extend(self.roles[written:])
        batch_logits = self.runtime.forward(self._batched_ids[:, start:end],
                                            self._visibility.mask(self.roles[start:], start), start, self.cache,
                                            0 if every else 1)
        self._unchecked.append((batch_logits, step))
        if every:
            self.settle()
            self.logits = batch_logits[0, -1]
            return batch_logits[0]
        self.logits = batch_logits[0]
        return self.logits

    def settle(self) -> None:
        """Fail closed unless every call so far gave finite logits, bitwise equal in every physical-batch
        copy (one comparison and one host sync for all calls not compared yet)."""
        if not self._unchecked:
            return
        stacked = torch.stack([logits for logits, _ in self._unchecked])
        if bool(copies_differ(stacked) | ~torch.isfinite(stacked).all()):  # one host sync for both checks
            for logits, step in self._unchecked:
                if not bool(torch.isfinite(logits).all()):
                    raise NonFinite(f"{step} (logits): {int(torch.isnan(logits).sum())} NaN and "
                                    f"{int(torch.isinf(logits).sum())} infinite values of {logits.numel()}")
                check_batch_equal(logits, f"{step} (logits)")  # raises at the first call that desynced
        self._unchecked = []

    def choose(self) -> int:
        """The greedy token under the structural mask (the first maximal id); its masked logits are kept
        for `top2`."""
        if self._masked is None:
            self._allocate()
        masked = self._masked[self._choices % CHUNK]
        torch.where(self.runtime.grammar.eligible(self.cursor), self.logits, self._minus_inf, out=masked)
        self._choices += 1
        if self._choices % CHUNK == 0:
            self._take_top2()
        return int(masked.argmax())

    def _allocate(self) -> None:
        logits = self.logits
        self._masked = logits.new_empty(CHUNK, len(logits))
        self._minus_inf = logits.new_tensor(float("-inf"))
        self._top2 = logits.new_empty(self.capacity - len(self.tokens), 2)

    def _take_top2(self) -> None:
        """The top two of the masked rows chosen since the last time, in one call."""
        done = (self._choices - 1) // CHUNK * CHUNK
        self._top2[done:self._choices] = torch.topk(self._masked[: self._choices - done], 2).values

    def top2(self) -> torch.Tensor:
        """The top two masked logits (float32) at each choice, computed once for all of them."""
        if self._choices % CHUNK:
            self._take_top2()
        return self._top2[: self._choices].float()


    def boundary(self, construction: str) -> Boundary:
        self.settle()
        return Boundary(construction, list(self.tokens), list(self.roles), hf_adapter.boundary_cache(self.cache),
                        self.logits)


def live_boundary(runtime: Step, prompt_block: list[int]) -> Boundary:
    """Ordinary generation: the prompt block in one call, then one greedy token per call,
    until the call that consumes <|merge|>."""
    caps = runtime.grammar.caps
    state = DecodeState.empty(runtime, len(prompt_block) + 3 * (caps.branch + 2) + 1 + caps.suffix_room())
    for token in prompt_block:
        state.push(token)
    state.feed(len(prompt_block), "live prompt block")
    while not (state.cursor.block == MERGE and state.cursor.open):
        state.push(state.choose())
        state.feed(1, f"live token {len(state.tokens) - 1}")
    return state.boundary("live")


def decode_suffix(runtime: Step, boundary: Boundary) -> Suffix:
    """Continue from a boundary (on a copy of its cache) through <|/answer|>."""
    cursor = Cursor(block=MERGE, open=True, count=0)
    state = DecodeState(runtime, list(boundary.tokens), list(boundary.roles), cursor,
                        hf_adapter.clone_cache(runtime.model, boundary.cache), boundary.logits,
                        capacity=len(boundary.tokens) + runtime.grammar.caps.suffix_room())
    start = len(state.tokens)
    while True:
        state.push(state.choose())
        if state.cursor.done:
            break
        state.feed(1, f"suffix token {len(state.tokens) - 1 - start}")
    state.settle()
    suffix = state.tokens[start:]
    top2 = state.top2()  # the margins: top-1 minus top-2 masked logit at each choice
    return Suffix(suffix, (top2[:, 0] - top2[:, 1]).tolist(),
                  runtime.tokenizer.decode(answer_ids(suffix, runtime.grammar)), top2[:, 0].tolist())


def suffix_of(runtime: Step, boundary: Boundary) -> Suffix:
    """decode_suffix, once per boundary the runtime's arms hold (engine.arms); any other boundary, such
    as a transplanted one, is decoded each time."""
    return runtime.arms.suffix(boundary, functools.partial(decode_suffix, runtime))

