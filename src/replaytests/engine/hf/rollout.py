"""Rollouts on the Hugging Face backend (engine/rollout.py): the live decoder's and the replays', every call
with the physical-batch forward and its checks, as every construction.

- live: z in one call (an engine's prompt), then one token per call, greedy or sampled, `length` tokens; the
  last one is fed too, so that the state after z + response is in hand (`end`);
- incremental: teacher forcing of the live tokens on the live schedule (z in one call, then one per call):
  the same calls as live, so its log-probabilities must be the live ones bit for bit;
- prefill: one call over z + response, every position's logits (the trainer's recompute).
Each `*_replica` is a second, independent execution (nothing is shared with the arms cache: each builds its
own z).
"""

from __future__ import annotations

import torch

from replaytests.engine.hf.decoder import DecodeState
from replaytests.engine.hf.forward import Step
from replaytests.engine.rollout import Rollout
from replaytests.engine.sampling import chooser, scored


def _prompt(runtime: Step, z: list[int], capacity: int, construction: str) -> DecodeState:
    state = DecodeState.empty(runtime, capacity)
    for token in z:
        state.push(token)
    state.feed(len(z), f"{construction} prompt")
    return state


def _stepwise(runtime: Step, z: list[int], length: int, construction: str, choose) -> Rollout:
    """z in one call, then `length` tokens one per call, each `choose(logits, step)`'s."""
    state = _prompt(runtime, z, len(z) + length, construction)
    role = state.cursor.role_of_next()  # the response's queries: the open block's content role
    rows, tokens = [], []
    for step in range(length):
        rows.append(state.logits)
        token = choose(state.logits, step)
        tokens.append(token)
        state.append(token, role)
        state.feed(1, f"{construction} response token {step}")
    return scored(torch.stack(rows), tokens, construction, state.boundary(construction))


def live(runtime: Step, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
    """The live rollout: greedy (seed None; the first maximal id) or sampled at temperature 1, top-p 1 from
    softmax of the FP32 logits with a generator seeded by `seed` (torch.multinomial)."""
    return _stepwise(runtime, z, length, construction, chooser(seed, runtime.device))


def replay(runtime: Step, construction: str, z: list[int], response: list[int]) -> Rollout:
    """`incremental` or `prefill` (or a `*_replica`) over z + response."""
    if construction.removesuffix("_replica") == "incremental":
        return _stepwise(runtime, z, len(response), construction, lambda logits, step: response[step])
    state = DecodeState.empty(runtime, len(z) + len(response))
    for token in z:
        state.push(token)
    role = state.cursor.role_of_next()
    for token in response:
        state.append(token, role)
    logits = state.feed(len(z) + len(response), f"{construction} call over z and the response", every=True)
    return scored(logits[len(z) - 1:-1], response, construction, state.boundary(construction))
