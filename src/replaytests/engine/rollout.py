"""A rollout as the families see it (docs/protocol.md §15, "Rollouts"): the response a live decoder sampled
from a boundary, token by token, with each chosen token's log-probability, or a replay of the same tokens
(the trainer's recompute, one prefill call; or teacher forcing on the live schedule, one token per call).

Every log-probability is read one way, on every arm and runtime that computes it itself: log-softmax of the
step's logits in FP32 over the full vocabulary, at the chosen token, with no structural mask (a rollout is
the model's own distribution, as an RL trainer scores it). A sampled rollout draws at temperature 1 and
top-p 1 from that distribution with a generator seeded per row (`row_seed`), so an audit reproduces it.

No torch here: the registry and the outputs read the names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replaytests.engine.boundary import Boundary

MODES = ("greedy", "sampled")
LIVE_CONSTRUCTIONS = ("live", "live_replica")  # a rollout decoded live (its own tokens)
REPLAYS = ("incremental", "prefill")  # replays over the live rollout's tokens (and their *_replica)
# How a log-probability was computed: the suite's own definition, or an engine's mode where it reports its
# own (vLLM's logprobs_mode; checked against the suite's definition before any number counts).
SUITE_LOGPROBS = "fp32-log-softmax-full-vocab"


def row_seed(seed: int, row: str) -> int:
    """The sampler's seed for one bank row: the contract's rollout seed and the row id, hashed to 63 bits
    (recorded in every sampled record, so an audit draws the same tokens)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{row}".encode()).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class Rollout:
    """One arm of a rollout: the response tokens after z, each one's log-probability (float32 values as
    Python floats) and its two most likely ids, and the state after z + response where the runtime shows one
    (`end`: the cache over every token and the logits of the next one)."""

    construction: str
    tokens: list[int]
    logprobs: list[float]
    top2: list[tuple[int, int]]  # the two most likely ids at each step (the first is the greedy choice)
    margins: list[float]  # top-1 minus top-2 log-probability at each step
    end: Boundary
    logprobs_mode: str = SUITE_LOGPROBS
