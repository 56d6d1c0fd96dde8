"""The cache constructions (SPEC §3): how each arm reaches the boundary.

| live        | ordinary greedy generation (decoder.live_boundary)              |
| incremental | teacher forcing of z on the live schedule: prompt block, then 1/call |
| prefill     | one forward call over all of z                                   |
| replica     | a storage-isolated second instance of the same construction     |
"""

from __future__ import annotations

import dataclasses

from replaytests import hf_adapter
from replaytests.boundary import Boundary
from replaytests.decoder import DecodeState, live_boundary, suffix_room
from replaytests.protocol import Cursor
from replaytests.runtime import Runtime, check_batch_equal

__all__ = ["build", "incremental", "live", "live_replica", "prefill"]


def _teacher_forced(runtime: Runtime, z: list[int], chunks: list[int], construction: str) -> Boundary:
    state = DecodeState(runtime, [], [], Cursor(), runtime.new_cache(), None,
                        capacity=len(z) + suffix_room(runtime.grammar.caps))
    consumed = 0
    for size in chunks:
        for token in z[consumed: consumed + size]:
            state.push(token)
        state.feed(size, f"{construction} call at position {consumed}")
        consumed += size
    return _checked(state.boundary(construction))


def incremental(runtime: Runtime, z: list[int]) -> Boundary:
    prompt_len = z.index(runtime.grammar.delims.closers[0]) + 1
    return _teacher_forced(runtime, z, [prompt_len] + [1] * (len(z) - prompt_len), "incremental")


def prefill(runtime: Runtime, z: list[int]) -> Boundary:
    return _teacher_forced(runtime, z, [len(z)], "prefill")


def live(runtime: Runtime, prompt_block: list[int]) -> Boundary:
    return _checked(live_boundary(runtime, prompt_block))


def live_replica(runtime: Runtime, boundary: Boundary) -> Boundary:
    """A bit-exact deep copy of the live boundary (live cannot be re-run without re-deciding)."""
    return dataclasses.replace(
        boundary, construction="live_replica",
        cache=hf_adapter.clone_cache(runtime.model, boundary.cache), logits=boundary.logits.clone(),
    )


def build(runtime: Runtime, construction: str, z: list[int]) -> Boundary:
    """A fresh, independent construction of z; `*_replica` names a second one."""
    base = construction.removesuffix("_replica")
    boundary = {"incremental": incremental, "prefill": prefill}[base](runtime, z)
    return dataclasses.replace(boundary, construction=construction)


def _checked(boundary: Boundary) -> Boundary:
    """At the boundary the physical-batch copies must agree on every cache tensor too."""
    for index, (keys, values) in enumerate(boundary.layers):
        check_batch_equal(keys, f"{boundary.construction} boundary cache layer {index} K")
        check_batch_equal(values, f"{boundary.construction} boundary cache layer {index} V")
    return boundary
