"""The cache constructions (docs/protocol.md §3): how each arm reaches the boundary.

| live        | ordinary greedy generation (decoder.live_boundary)              |
| incremental | teacher forcing of z on the live schedule: prompt block, then 1/call |
| prefill     | one forward call over all of z                                   |
| replica     | a second, independent execution of the same construction        |
"""

from __future__ import annotations

import dataclasses

from replaytests.engine.boundary import Boundary
from replaytests.engine.hf.decoder import DecodeState, live_boundary
from replaytests.engine.hf.forward import Step, check_batch_equal
from replaytests.engine.protocol import prompt_of

__all__ = ["build", "incremental", "live", "prefill"]


def _teacher_forced(runtime: Step, z: list[int], chunks: list[int], construction: str) -> Boundary:
    state = DecodeState.empty(runtime, len(z) + runtime.grammar.caps.suffix_room())
    consumed = 0
    for size in chunks:
        for token in z[consumed: consumed + size]:
            state.push(token)
        state.feed(size, f"{construction} call at position {consumed}")
        consumed += size
    return _checked(state.boundary(construction))


def incremental(runtime: Step, z: list[int]) -> Boundary:
    prompt_len = len(prompt_of(z, runtime.grammar.delims))
    return _teacher_forced(runtime, z, [prompt_len] + [1] * (len(z) - prompt_len), "incremental")


def prefill(runtime: Step, z: list[int]) -> Boundary:
    return _teacher_forced(runtime, z, [len(z)], "prefill")


def live(runtime: Step, prompt_block: list[int], construction: str = "live") -> Boundary:
    """Ordinary greedy generation from the prompt block; `live_replica` names a second generation.
    Built once per runtime (engine.arms)."""
    return runtime.arms.boundary(construction, prompt_block, lambda: dataclasses.replace(
        _checked(live_boundary(runtime, prompt_block)), construction=construction))


def build(runtime: Step, construction: str, z: list[int]) -> Boundary:
    """A construction of z; `*_replica` names a second, independent one. Built once per runtime
    (engine.arms): every family asking for the same construction of the same z gets the same arm."""
    base = construction.removesuffix("_replica")
    return runtime.arms.boundary(construction, z, lambda: dataclasses.replace(
        {"incremental": incremental, "prefill": prefill}[base](runtime, z), construction=construction))


def _checked(boundary: Boundary) -> Boundary:
    """At the boundary the physical-batch copies must agree on every cache tensor too."""
    for index, (keys, values) in enumerate(boundary.layers):
        check_batch_equal(keys, f"{boundary.construction} boundary cache layer {index} K")
        check_batch_equal(values, f"{boundary.construction} boundary cache layer {index} V")
    return boundary
