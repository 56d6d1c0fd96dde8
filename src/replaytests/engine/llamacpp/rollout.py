"""Rollouts on llama.cpp (engine/rollout.py): the live decoder's and the replays', each on seq 0 of a llama.cpp
context (the runtime's own, or a fresh one for a `*_replica`), as on the Hugging Face backend
(engine/hf/rollout.py, the reference):

- live: z in one llama_decode call (an engine's prompt), then one token per call, `length` tokens, greedy
  (the first maximal id) or sampled by the suite's own sampler; the last one is fed too, so that the state
  after z + response is in hand (`end`);
- incremental: teacher forcing of the live tokens on the live schedule (z in one call, then one per call):
  the same calls as live, so its log-probabilities must be the live ones bit for bit;
- prefill: one llama_decode call over z + response with every token an output (the trainer's recompute).

"One call" is one llama_decode of at most n_batch tokens, and n_ubatch = n_batch = runtime.llamacpp.n_ctx in
the contexts these arms run in, so one call is one physical ubatch as well (runtime.llamacpp.chunk is the
serving family's chunked arm only). Each arm proves it from the context's own count of calls.

The log-probabilities are the suite's (SUITE_LOGPROBS): llama.cpp's float32 logits of each step, log-softmax
in FP32 over the full vocabulary by torch, no structural mask. The sampler is the suite's too (torch.multinomial
over softmax of those logits with a CPU generator seeded by the row's seed), never llama.cpp's, so the per-row
seed draws the same tokens wherever the logits are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from replaytests.engine.protocol import MERGE
from replaytests.engine.rollout import Rollout
from replaytests.engine.sampling import chooser, scored
from replaytests.errors import BoundaryMismatch, ConfigError

if TYPE_CHECKING:
    from replaytests.engine.llamacpp.context import Context
    from replaytests.engine.llamacpp.runtime import Runtime


def _roles(runtime: Runtime, z: list[int], response: list[int], where: str) -> list[int]:
    """z's roles by the grammar; the response's queries take the open block's role, <|merge|>'s (z ends with
    that opener), as on the Hugging Face backend: a response is the model's own tokens, outside the grammar."""
    return runtime.grammar.parse(z, where) + [MERGE] * len(response)


def _check_room(runtime: Runtime, z: list[int], length: int, construction: str) -> None:
    n_ctx = runtime.settings["n_ctx"]
    if len(z) + length > n_ctx:
        raise BoundaryMismatch(f"llamacpp {construction} ({runtime.cell}): z ({len(z)} tokens) and a response "
                               f"of {length} do not fit the context of {n_ctx} tokens (runtime.llamacpp.n_ctx)")


def _calls(context: Context, before: int, expected: int, what: str) -> int:
    """The llama_decode calls an arm made since `before`: exactly its schedule's, or the arm is not what it names."""
    made = context.calls - before
    if made != expected:
        raise BoundaryMismatch(f"{what}: {made} llama_decode calls, expected {expected} (n_batch {context.n_batch})")
    return made


def _stepwise(runtime: Runtime, z: list[int], length: int, construction: str,
              choose: Callable[[torch.Tensor, int], int]) -> Rollout:
    """z in one call, then `length` tokens one per call, each `choose(logits, step)`'s; the last one fed too."""
    _check_room(runtime, z, length, construction)
    where = f"llamacpp {construction} ({runtime.cell})"
    with runtime.arm_context(construction) as context:
        before, calls = context.evaluated(), context.calls
        logits = runtime.feed(context, z, f"{construction} prompt")
        rows, tokens = [], []
        for step in range(length):
            rows.append(logits)
            token = choose(logits, step)
            tokens.append(token)
            logits = runtime.feed(context, [token], f"{construction} response token {step}")
        _calls(context, calls, 1 + length, where)
        end = runtime.boundary_of(construction, context, z + tokens, logits, context.evaluated() - before, 1,
                                  roles=_roles(runtime, z, tokens, where))
    return scored(torch.stack(rows), tokens, construction, end)


def live(runtime: Runtime, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
    """The live rollout: greedy (seed None; the first maximal id of the full vocabulary) or sampled at
    temperature 1, top-p 1 from softmax of the FP32 logits with a CPU generator seeded by `seed`
    (torch.multinomial), as engine/hf/rollout.py draws."""
    return _stepwise(runtime, z, length, construction, chooser(seed))


def replay(runtime: Runtime, construction: str, z: list[int], response: list[int]) -> Rollout:
    """`incremental` or `prefill` (or a `*_replica`) over z + response."""
    kind = construction.removesuffix("_replica")
    if kind == "incremental":
        return _stepwise(runtime, z, len(response), construction, lambda logits, step: response[step])
    if kind != "prefill":
        raise ConfigError(f"llamacpp: no rollout replay {construction!r} (incremental, prefill, or a *_replica)")
    _check_room(runtime, z, len(response), construction)
    where = f"llamacpp {construction} ({runtime.cell})"
    with runtime.arm_context(construction) as context:
        before, calls = context.evaluated(), context.calls
        rows = runtime.feed_every(context, z + response, f"{construction} call over z and the response")
        prefill_steps = _calls(context, calls, 1, where)
        end = runtime.boundary_of(construction, context, z + response, rows[-1], context.evaluated() - before,
                                  prefill_steps, roles=_roles(runtime, z, response, where))
    return scored(rows[len(z) - 1:-1], response, construction, end)
