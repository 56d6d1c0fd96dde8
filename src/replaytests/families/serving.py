"""Serving engine: the constructions a serving engine's users meet, each against the live request.

Per row and cell, on a backend with a prefix cache and chunked prefill (vLLM): the live request
and its replica, a prefix-cache hit (the live z again, right after the live request, on the cache it
left), a fresh prefill of the live z and its replica, a chunked prefill and the same prefill in a batch
beside other requests. Beside the usual comparisons each arm records what the engine itself counted
(`served`): the prompt tokens it read from its prefix cache, the scheduler steps the prompt took, and
a digest of every suffix step's top-k logits (a pair is `steps_exact` when all of them are bitwise
equal). A hit is evidence only where it reused a block the live request wrote while decoding
(`prefix_hit.covers_decode`); otherwise it is vacuous, and the tests say so (docs/vllm.md).
"""

from __future__ import annotations

import math

from replaytests.engine.backend import Backend
from replaytests.engine.protocol import prompt_of
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import evaluate
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record

FAMILY = FAMILIES["serving"]
SERVED = ("cached_tokens", "prompt_block_tokens", "prefill_steps", "steps_digest")


def compare_steps(a: tuple, b: tuple, divergence: int | None) -> dict:
    """Two arms' suffix steps, each its top-k (id, logit) row, compared up to the step where their tokens
    split (after it the two decode other sequences; where one stopped first, its steps are all there are): the
    first step whose row differs in any bit (None where none does), and the largest |difference| of a finite
    logit both rows hold (the mask's -inf are the grammar's, the same in both)."""
    shared = min(len(a), len(b)) if divergence is None else min(len(a), len(b), divergence + 1)
    first = next((i for i in range(shared) if a[i] != b[i]), None)
    deltas = []
    for mine, theirs in zip(a[:shared], b[:shared], strict=True):
        other = dict(theirs)
        deltas += [abs(value - other[token]) for token, value in mine
                   if token in other and math.isfinite(value) and math.isfinite(other[token])]
    return {"steps_first_difference": first, "steps_max_abs": max(deltas, default=0.0)}


def prefix_hit(served: dict) -> dict:
    """The prefix-cache hit as the engine counted it, and whether it reused a block the live request wrote
    while decoding: a token read past the prompt block's full blocks (the live request prefilled those)."""
    return {"cached_tokens": served["cached_tokens"], "prompt_block_tokens": served["prompt_block_tokens"],
            "covers_decode": served["cached_tokens"] > served["prompt_block_tokens"]}


def run(runtime: Backend, row: BankRow) -> Record:
    prompt_block = prompt_of(row.tokens, runtime.grammar.delims)
    built = {}

    def build():
        live = built["live"] = runtime.live(prompt_block)
        yield live
        for arm in FAMILY.arms[1:]:
            built[arm] = (runtime.live(prompt_block, arm) if arm == "live_replica" else
                          runtime.build(arm, live.tokens))
            yield built[arm]

    def served(fields: dict) -> dict:
        """The arms with the engine's counters, the pairs with their suffix steps compared, the prefix hit."""
        counted = {arm: {name: getattr(boundary.state, name) for name in SERVED} for arm, boundary in built.items()}
        comparisons = dict(fields["comparisons"])
        for a, b in FAMILY.pairs:
            pair = comparisons[f"{a}~{b}"]
            comparisons[f"{a}~{b}"] = pair | {"steps_exact": counted[a]["steps_digest"] == counted[b]["steps_digest"]} \
                | compare_steps(built[a].state.steps, built[b].state.steps, pair["first_divergence"])
        return fields | {
            "arms": {arm: values | {"served": counted[arm]} for arm, values in fields["arms"].items()},
            "comparisons": comparisons, "prefix_hit": prefix_hit(counted["prefix_hit"])}

    return evaluate(runtime, row, FAMILY, build, served)
