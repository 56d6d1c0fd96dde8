"""Conversations on the Hugging Face backend (engine/conversation.py), every call with the physical-batch
forward and its checks, as every construction.

- session: turn by turn, the previous assistant turn's closer (generated, not yet processed) and the next user
  turn in one call, then the assistant turn one token per call on the same cache;
- incremental: the session's token history teacher-forced one token per call;
- replay and rerendered: one call over the turn's history (the generated ids, or the messages rendered and
  tokenized again).
Each turn's state is copied out (storage-isolated) before the turn is decoded from it.
"""

from __future__ import annotations

import dataclasses

import torch

from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.conversation import ONE_CALL, TurnState
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf.constructions import _checked
from replaytests.engine.hf.decoder import DecodeState
from replaytests.engine.hf.forward import Step
from replaytests.inputs.blocks import PROMPT

ROLE = PROMPT  # every conversation token: plain causal attention (engine/conversation.py)


def render(runtime: Step, template: str, messages: list[dict], generation_prompt: bool) -> str:
    """The messages through the chat template, as text (what a server tokenizes for a client's messages)."""
    return runtime.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                 add_generation_prompt=generation_prompt)


def _snapshot(runtime: Step, state: DecodeState, construction: str, turn: int) -> Boundary:
    state.settle()
    cache = hf_adapter.clone_cache(runtime.model, hf_adapter.boundary_cache(state.cache))
    boundary = Boundary(construction, list(state.tokens), list(state.roles), hf_adapter.boundary_cache(cache),
                        state.logits.clone())
    return _checked(dataclasses.replace(boundary, construction=f"{construction} turn {turn}"))


def _decode(runtime: Step, state: DecodeState, cap: int, closer: int, where: str) -> Suffix:
    """The assistant turn from the state's logits, decoded on its cache: greedy over the content tokens and the
    closer (the template's end-of-turn token), each content token fed, the closer chosen (or forced at the
    cap) and not fed."""
    content = runtime.grammar.content.to(state.logits.device)
    closer_only = torch.zeros_like(content)
    closer_only[closer] = True
    either = content | closer_only
    tokens, margins, top1 = [], [], []
    while True:
        eligible = either if len(tokens) < cap else closer_only
        masked = torch.where(eligible, state.logits, state.logits.new_tensor(float("-inf")))
        top = torch.topk(masked.float(), 2).values
        token = int(masked.argmax())
        tokens.append(token)
        margins.append(float(top[0] - top[1]))
        top1.append(float(top[0]))
        if token == closer:
            break
        state.append(token, ROLE)
        state.feed(1, f"{where} assistant token {len(tokens) - 1}")
    state.settle()
    return Suffix(tokens, margins, runtime.tokenizer.decode(tokens[:-1]), top1)


def _decoded_from(runtime: Step, boundary: Boundary, cap: int, closer: int, capacity: int) -> Suffix:
    state = DecodeState(runtime, list(boundary.tokens), list(boundary.roles), None,
                        hf_adapter.clone_cache(runtime.model, boundary.cache), boundary.logits, capacity)
    return _decode(runtime, state, cap, closer, boundary.construction)


def answer(runtime: Step, boundary: Boundary, cap: int, closer: int) -> Suffix:
    """The assistant turn decoded from any turn state (a spliced one: the conversation transplant), on a copy of
    its cache, from its own boundary logits."""
    return _decoded_from(runtime, boundary, cap, closer, len(boundary.tokens) + cap + 1)


def session(runtime: Step, users: list[list[int]], cap: int, closer: int,
            construction: str = "session") -> list[TurnState]:
    """The session: each user turn (with the generation prompt) appended in one call, the assistant turn
    decoded live on the same cache."""
    state = DecodeState(runtime, [], [], None, runtime.new_cache(), None,
                        sum(map(len, users)) + len(users) * (cap + 1))
    turns, pending = [], []
    for turn, user in enumerate(users, start=1):
        for token in pending + user:
            state.append(token, ROLE)
        state.feed(len(pending) + len(user), f"{construction} turn {turn} user call")
        boundary = _snapshot(runtime, state, construction, turn)
        answer = _decode(runtime, state, cap, closer, f"{construction} turn {turn}")
        turns.append(TurnState(construction, turn, boundary, answer))
        pending = answer.tokens[-1:]  # the closer: processed with the next user turn
    return turns


def replayed(runtime: Step, construction: str, histories: list[list[int]], cap: int,
             closer: int) -> list[TurnState]:
    """`replay` or `rerendered` (one call over each turn's history) or `incremental` (one token per call over
    the last history, each turn's state taken where its history ends: the histories are prefixes of it)."""
    base, capacity = construction.removesuffix("_replica"), max(map(len, histories)) + cap + 1
    if base in ONE_CALL:
        boundaries = []
        for turn, history in enumerate(histories, start=1):
            state = DecodeState(runtime, [], [], None, runtime.new_cache(), None, len(history))
            for token in history:
                state.append(token, ROLE)
            state.feed(len(history), f"{construction} turn {turn} call over the history")
            boundaries.append(_snapshot(runtime, state, construction, turn))
    else:
        boundaries, ends = [], {len(h): turn for turn, h in enumerate(histories, start=1)}
        state = DecodeState(runtime, [], [], None, runtime.new_cache(), None, len(histories[-1]))
        for position, token in enumerate(histories[-1]):
            state.append(token, ROLE)
            state.feed(1, f"{construction} token {position}")
            if position + 1 in ends:
                boundaries.append(_snapshot(runtime, state, construction, ends[position + 1]))
    return [TurnState(construction, turn, dataclasses.replace(b, construction=construction),
                      _decoded_from(runtime, b, cap, closer, capacity))
            for turn, b in enumerate(boundaries, start=1)]
