"""Conversations on llama.cpp (engine/conversation.py; engine/hf/conversation.py is the reference), each on seq 0
of a llama.cpp context (the runtime's own, or a fresh one for a `*_replica`):

- session: one context kept across turns, as llama.cpp's server keeps a slot with `cache_prompt`. Each turn is a
  request for the whole token history: the context keeps the longest prefix of it its cache holds (one token
  less where it holds all of it: the last is evaluated again for its logits), drops the rest, and evaluates what
  remains in one llama_decode call (at turn k > 1, the previous closer and user turn k); the assistant turn is
  then decoded one token per call on the same context. llama.cpp's own count of the tokens the request evaluated
  (llama_perf_context) is the turn's `Saved.evaluated`, so its `cached_tokens` are the history's tokens read
  from the cache, not evaluated, and its `prompt_block_tokens` the previous turn's history (what it computed by
  prefill): a hit is a session's only where it reaches past them, into the tokens turn k-1 decoded (the family's
  `prefix_hit`, as on vLLM); else the turn evaluated its history again and is vacuous (the gates say so);
- replay and rerendered: each turn's history in one call in a cleared context (n_batch = n_ctx, so one
  llama_decode of one ubatch; the calls are counted);
- incremental: the last history one token per call, each turn's state saved where its history ends.

Every arm but the session decodes assistant turn k from its saved state loaded into its own context, as the suffix
decoder does; the session decodes live, in place. A boundary is the saved sequence state (K/V read from its bytes,
engine/llamacpp/state.py) and the logits before the assistant's first token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.conversation import ONE_CALL, TurnState
from replaytests.engine.llamacpp.context import DecodeFailed
from replaytests.errors import BoundaryMismatch
from replaytests.inputs.blocks import PROMPT

if TYPE_CHECKING:
    from replaytests.engine.llamacpp.context import Context
    from replaytests.engine.llamacpp.runtime import Runtime

ROLE = PROMPT  # every conversation token: plain causal attention (engine/conversation.py)


def render(runtime: Runtime, template: str, messages: list[dict], generation_prompt: bool) -> str:
    """The messages through the chat template, as llama-cpp-python's chat handler renders them (context.py)."""
    return runtime.model.render_chat(template, messages, generation_prompt)


def _check_room(runtime: Runtime, length: int, cap: int, where: str) -> None:
    """A history and an assistant turn of `cap` content tokens must fit the context."""
    n_ctx = runtime.settings["n_ctx"]
    if length + cap > n_ctx:
        raise BoundaryMismatch(f"{where}: a history of {length} tokens and an assistant turn of up to {cap} do not "
                               f"fit the context of {n_ctx} tokens (runtime.llamacpp.n_ctx)")


def _boundary(runtime: Runtime, context: Context, construction: str, tokens: list[int], logits: torch.Tensor,
              evaluated: int, calls: int, prefilled: int = 0) -> Boundary:
    """The state the context holds after `tokens` (saved), and what llama.cpp counted building it (`prefilled`:
    the tokens a hit may read without reaching a decoded one)."""
    from replaytests.engine.llamacpp.runtime import Saved  # runtime.py imports this module


    where = f"llamacpp {construction} ({runtime.cell})"
    saved = Saved(context.save(), context.length, evaluated, prefilled, calls)
    cache = runtime._cache(saved.state, where)
    # llama.cpp's count of what it did not evaluate is a claim about its cache: the cells must be there
    if not saved.length == cache.get_seq_length() == len(tokens):
        raise BoundaryMismatch(f"{where}: llama.cpp's state holds {cache.get_seq_length()} cells after a history of "
                               f"{len(tokens)} tokens ({saved.length} placed, {evaluated} of them evaluated by its "
                               "count): the cache it read from is not there")
    return Boundary(construction, list(tokens), [ROLE] * len(tokens), cache, logits, saved)


def _decode(runtime: Runtime, context: Context, logits: torch.Tensor, cap: int, closer: int, where: str) -> Suffix:
    """The assistant turn from `logits`, decoded on the context: greedy (the first maximal id) over the content
    tokens and the closer, only the closer once the turn holds `cap` content tokens; each content token fed, one
    per call, the closer chosen and not fed."""
    content = runtime.grammar.content
    closer_only = torch.zeros_like(content)
    closer_only[closer] = True
    either, minus_inf = content | closer_only, torch.tensor(float("-inf"))
    tokens, margins, top1 = [], [], []
    while True:
        masked = torch.where(either if len(tokens) < cap else closer_only, logits, minus_inf)
        top = torch.topk(masked, 2).values
        token = int(masked.argmax())
        tokens.append(token)
        margins.append(float(top[0] - top[1]))
        top1.append(float(top[0]))
        if token == closer:
            return Suffix(tokens, margins, runtime.model.decode(tokens[:-1]), top1)
        logits = runtime.feed(context, [token], f"{where} assistant token {len(tokens) - 1}")


def _decoded_from(runtime: Runtime, context: Context, boundary: Boundary, cap: int, closer: int,
                  where: str) -> Suffix:
    try:
        context.load(boundary.state.state, boundary.state.length)
    except DecodeFailed as exc:
        raise BoundaryMismatch(f"{where}: {exc}") from None
    return _decode(runtime, context, boundary.logits, cap, closer, where)


def _common(cached: list[int], history: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(cached, history, strict=False)) if a != b),
                min(len(cached), len(history)))


def _request(runtime: Runtime, context: Context, cached: list[int], history: list[int],
             where: str) -> tuple[torch.Tensor, int, int]:
    """The history as a request on a slot holding `cached`: the shared prefix kept (all but the history's last
    token at most), the rest evaluated; the logits, and the tokens and calls llama.cpp counted."""
    keep = min(_common(cached[:context.length], history), len(history) - 1)
    if keep < context.length:
        context.truncate(keep)
    evaluated, calls = context.evaluated(), context.calls
    logits = runtime.feed(context, history[keep:], f"{where} request")
    return logits, context.evaluated() - evaluated, context.calls - calls


def session(runtime: Runtime, users: list[list[int]], cap: int, closer: int,
            construction: str = "session") -> list[TurnState]:
    """Turn by turn on one context: the history requested (the previous closer and the user turn evaluated in one
    call, the rest read from the cache), the assistant turn decoded live in place."""
    turns, history, cached = [], [], []
    with runtime.arm_context(construction) as context:
        for turn, user in enumerate(users, start=1):
            where = f"llamacpp {construction} turn {turn} ({runtime.cell})"
            history = history + (turns[-1].answer.tokens if turns else []) + user
            _check_room(runtime, len(history), cap, where)
            logits, evaluated, calls = _request(runtime, context, cached, history, where)
            prefilled = len(turns[-1].boundary.tokens) if turns else 0  # turn k-1's history: its prompt
            boundary = _boundary(runtime, context, construction, history, logits, evaluated, calls, prefilled)
            answer = _decode(runtime, context, logits, cap, closer, where)
            cached = history + answer.tokens[:-1]  # what the slot holds: the closer is chosen, not fed
            turns.append(TurnState(construction, turn, boundary, answer))
    return turns


def replayed(runtime: Runtime, construction: str, histories: list[list[int]], cap: int,
             closer: int) -> list[TurnState]:
    """`replay` or `rerendered` (one call over each turn's history in a cleared context) or `incremental` (one
    token per call over the last history, each turn's state saved where its history ends: the histories are
    prefixes of it); then each turn's assistant decoded from its state in the same context."""
    base, where = construction.removesuffix("_replica"), f"llamacpp {construction} ({runtime.cell})"
    _check_room(runtime, max(map(len, histories)), cap, where)
    boundaries = []
    with runtime.arm_context(construction) as context:
        if base in ONE_CALL:
            for turn, history in enumerate(histories, start=1):
                context.clear()
                evaluated, calls = context.evaluated(), context.calls
                logits = runtime.feed(context, history, f"{where} turn {turn} call over the history")
                boundaries.append(_boundary(runtime, context, construction, history, logits,
                                            context.evaluated() - evaluated, context.calls - calls))
        else:
            ends = {len(h): turn for turn, h in enumerate(histories, start=1)}
            evaluated, calls = context.evaluated(), context.calls
            for position, token in enumerate(histories[-1]):
                logits = runtime.feed(context, [token], f"{where} token {position}")
                if position + 1 in ends:
                    boundaries.append(_boundary(runtime, context, construction, histories[-1][:position + 1], logits,
                                                context.evaluated() - evaluated, context.calls - calls))
        return [TurnState(construction, turn, b, _decoded_from(runtime, context, b, cap, closer,
                                                               f"{where} turn {turn}"))
                for turn, b in enumerate(boundaries, start=1)]
