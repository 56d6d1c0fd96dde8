"""The edge sweep's points on transformers (families/sweep.py): one axis, the prefix's length.

At a point p both arms consume the row's first p tokens: the reference one token per call (the live schedule's
kind of call), the edge in one call. Where the cell's K/V cache is quantized, the edge is its residual length
(`cells.<name>.kv_cache.residual_length`): decoded tokens stay unquantized until that many are held, then the
whole history is quantized again, so the one-token-per-call cache is requantized at points the one-call cache
never is. Elsewhere no engine edge lies along the prefix, and the sweep steps by the contract's `sweep.stride`.

The reference of every point comes from one pass (and its replica from a second): the state after each point's
last token is copied out as the pass goes by, so a sweep costs two passes over the longest prefix, not one per
point. Each arm is then continued greedily for `sweep.continuation` tokens under the structural mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from replaytests.engine.backend import Axis
from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import constructions
from replaytests.engine.hf.constructions import _checked
from replaytests.engine.hf.decoder import DecodeState
from replaytests.engine.hf.forward import Step
from replaytests.engine.protocol import Cursor


def axes(runtime: Step, settings: dict) -> tuple[Axis, ...]:
    kv = runtime.flags.kv_cache
    edges = (((f"cells.{runtime.cell}.kv_cache.residual_length", kv.residual_length),)
             if kv.format == "quantized" else (("sweep.stride", settings["stride"]),))
    return (Axis("position", "the prefix one token per call", "the prefix in one call", edges),)


def _snapshot(runtime: Step, state: DecodeState, construction: str) -> Boundary:
    state.settle()
    cache = hf_adapter.clone_cache(runtime.model, hf_adapter.boundary_cache(state.cache))
    return _checked(Boundary(construction, list(state.tokens), list(state.roles), hf_adapter.boundary_cache(cache),
                             state.logits.clone()))


def _one_token_per_call(runtime: Step, z: list[int], points: Sequence[int], construction: str) -> dict[int, Boundary]:
    """The state after each point's last token, from one pass that feeds z one token per call."""
    wanted, out = set(points), {}
    state = DecodeState.empty(runtime, max(points))
    for index, token in enumerate(z[:max(points)]):
        state.push(token)
        state.feed(1, f"{construction} call at position {index}")
        if index + 1 in wanted:
            out[index + 1] = _snapshot(runtime, state, construction)
    return out


def continued(runtime: Step, boundary: Boundary, count: int) -> Suffix:
    """Up to `count` greedy tokens under the structural mask from a boundary (on a copy of its cache), fewer where
    the grammar closes the answer first."""
    cursor = Cursor()
    for token in boundary.tokens:
        cursor.advance(token, runtime.grammar)
    state = DecodeState(runtime, list(boundary.tokens), list(boundary.roles), cursor,
                        hf_adapter.clone_cache(runtime.model, boundary.cache), boundary.logits,
                        capacity=len(boundary.tokens) + count)
    start = len(state.tokens)
    while True:
        state.push(state.choose())
        if state.cursor.done or len(state.tokens) - start == count:
            break
        state.feed(1, f"continuation token {len(state.tokens) - 1 - start}")
    state.settle()
    tokens, top2 = state.tokens[start:], state.top2()
    return Suffix(tokens, (top2[:, 0] - top2[:, 1]).tolist(), runtime.tokenizer.decode(tokens), top2[:, 0].tolist())


def sweep(runtime: Step, axis: Axis, z: list[int], values: Sequence[int],
          continuation: int) -> Iterator[tuple[int, dict[str, tuple[Boundary, Suffix]]]]:
    references = {arm: _one_token_per_call(runtime, z, values, arm) for arm in ("reference", "reference_replica")}
    for value in values:
        built = {arm: references[arm].pop(value) for arm in references}
        built |= {arm: dataclasses.replace(constructions.prefill(runtime, z[:value]), construction=arm)
                  for arm in ("edge", "edge_replica")}
        yield value, {arm: (boundary, continued(runtime, boundary, continuation)) for arm, boundary in built.items()}
