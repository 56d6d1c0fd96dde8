"""The suite's own reading of a rollout's steps (engine/rollout.py), shared by every backend that computes the
log-probabilities itself from a full logit row (Hugging Face, llama.cpp): the FP32 log-softmax over the full
vocabulary at each chosen token, the top two ids, and the sampler (greedy, or temperature 1, top-p 1 from a
generator seeded per row)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from replaytests.engine.rollout import Rollout

if TYPE_CHECKING:
    from replaytests.engine.boundary import Boundary


def scored(rows: torch.Tensor, tokens: list[int], construction: str, end: Boundary) -> Rollout:
    """The rollout of `tokens` from their steps' logits `rows` [n, vocab] (any dtype): FP32 log-softmax over the
    full vocabulary at each token, the top two ids and their margin."""
    logprobs = torch.log_softmax(rows.float(), dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, dtype=torch.long, device=rows.device)[:, None])[:, 0]
    top = torch.topk(logprobs, 2, dim=-1)
    return Rollout(construction, list(tokens), chosen.tolist(), [tuple(ids) for ids in top.indices.tolist()],
                   (top.values[:, 0] - top.values[:, 1]).tolist(), end)


def chooser(seed: int | None, device: torch.device | str = "cpu") -> Callable[[torch.Tensor, int], int]:
    """The live decoder's choice at a step from its logits: greedy where `seed` is None (the first maximal id),
    else a draw at temperature 1, top-p 1 from softmax of the FP32 logits (torch.multinomial) with a generator
    seeded by `seed`, on `device`."""
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)

    def choose(logits: torch.Tensor, step: int) -> int:
        if generator is None:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=generator))

    return choose
