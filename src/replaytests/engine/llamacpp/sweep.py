"""The edge sweep's points on llama.cpp (families/sweep.py): two axes along the prefix's length, both around the
physical batch size `runtime.llamacpp.chunk` (a context's n_batch = n_ubatch), where a llama.cpp maintainer says
a reused prompt stays bit-exact only in whole physical batches (llama.cpp PR #7745).

- position: the reference is the row's whole prefix in one llama_decode call (one physical batch, n_batch =
  n_ubatch = n_ctx) read at each point: its K/V over the point's positions, the logits of the point's last one
  (an output row of that call); the edge, the point's prefix in calls of `chunk` tokens, the last call ending at
  the point. One call, not one token per call: against one call the edge arm differs only in where its physical
  batches split, so a divergence that sets in past a multiple of the chunk is the split's; against one token per
  call every point would also carry the difference between single-token and batched kernels (with flash
  attention on, 306 of 307 positions differ so) and the chunk's edges would not show under it.
- prefix_hit: the server's prompt cache (`cache_prompt`): an earlier request evaluated the row's whole prefix in
  calls of `chunk`; the point's prefix is requested again on the cache it left, every position but the last kept,
  the last evaluated in one call. The reference is the point's prefix, fresh, in calls of `chunk`: the position
  axis's edge arms of the same row, the same boundaries (each decoded once).

Each arm's states come from one pass, not one per point (a state saved per point; llama.cpp drops the positions
past it, `llama_memory_seq_rm`, as its server does): the one call is read at every point from the last down; the
chunked pass keeps its whole chunks and makes each point's last call on them; the hits are taken from the whole
prefix's cache from the last point down. Each boundary records what llama.cpp counted building it (`served`:
llama_decode calls, the tokens llama.cpp evaluated, the prefix tokens read from a cache, the physical batch size it
took) beside what the construction it names implies (`premise`, each counter exactly: an arm that counted otherwise is
not that construction, and its point is vacuous); gates.point_premise reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from replaytests.engine.backend import Axis
from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.llamacpp.context import DecodeFailed
from replaytests.engine.protocol import Cursor
from replaytests.errors import BoundaryMismatch

if TYPE_CHECKING:
    from replaytests.engine.llamacpp.context import Context
    from replaytests.engine.llamacpp.runtime import Runtime

CHUNK = "runtime.llamacpp.chunk"
N_CTX = "runtime.llamacpp.n_ctx"
POSITION, PREFIX_HIT = "position", "prefix_hit"
REFERENCES, EDGES = ("reference", "reference_replica"), ("edge", "edge_replica")


@dataclass
class Pending:
    """A point's state as an arm's pass left it, before it is made a boundary: llama.cpp's sequence state, the
    logits of the point's last position and what llama.cpp counted building it."""

    state: bytes
    logits: np.ndarray
    served: dict


def axes(runtime: Runtime) -> tuple[Axis, ...]:
    chunk = runtime.settings["chunk"]
    edges = ((CHUNK, chunk),)
    return (Axis(POSITION, "the row's prefix in one call (one physical batch), read at the point",
                 f"the point's prefix in calls of {chunk} tokens (n_batch = n_ubatch = {CHUNK})", edges),
            Axis(PREFIX_HIT, f"the point's prefix, fresh, in calls of {chunk} tokens",
                 f"a prompt-cache hit on the cache the whole prefix left (calls of {chunk}): every position but "
                 "the point's last kept, the last evaluated", edges))


def check_room(runtime: Runtime, values: Sequence[int], continuation: int) -> None:
    """A point whose prefix and continuation do not fit the context is refused before any llama_decode call."""
    n_ctx = runtime.settings["n_ctx"]
    if values and max(values) + continuation > n_ctx:
        raise BoundaryMismatch(f"llamacpp sweep ({runtime.cell}): a point of {max(values)} tokens and its "
                               f"continuation of {continuation} (sweep.continuation) do not fit the context of "
                               f"{n_ctx} tokens ({N_CTX})")


def sweep(runtime: Runtime, axis: Axis, z: list[int], values: Sequence[int],
          continuation: int) -> Iterator[tuple[int, dict[str, tuple[Boundary, Suffix]]]]:
    check_room(runtime, values, continuation)
    roles = prefix_roles(runtime, z)
    shared, runtime.swept_chunked = runtime.swept_chunked, None
    if axis.name == POSITION:
        pending = {arm: one_call(runtime, z, values, arm) for arm in REFERENCES}
        pending |= {arm: chunked(runtime, z, values, arm) for arm in EDGES}
        runtime.swept_chunked = (z, {})  # the prefix_hit axis's references, as they are made
    elif axis.name == PREFIX_HIT:
        pending = {arm: hits(runtime, z, values, arm) for arm in EDGES}
        if not (shared and shared[0] == z and all(value in shared[1] for value in values)):
            shared = None  # the position axis did not sweep this row just before: its own chunked arms
            pending |= {arm: chunked(runtime, z, values, arm) for arm in REFERENCES}
    else:
        raise ValueError(f"llamacpp sweeps no axis {axis.name!r}")
    for value in values:
        built = {arm: boundary(runtime, arm, z[:value], roles[:value], pending[arm].pop(value)) for arm in pending}
        if axis.name == POSITION:
            runtime.swept_chunked[1][value] = {ref: dataclasses.replace(built[edge], construction=ref)
                                               for ref, edge in zip(REFERENCES, EDGES, strict=True)}
        elif shared:
            built |= shared[1].pop(value)
        yield value, {arm: (b, continued(runtime, b, continuation)) for arm, b in built.items()}


def prefix_roles(runtime: Runtime, z: list[int]) -> list[int]:
    """The roles of z's tokens by the grammar, any prefix of a row (parse_prefix's, without its end check)."""
    cursor, roles = Cursor(), []
    for token in z:
        roles.append(cursor.role_of_next())
        cursor.advance(token, runtime.grammar)
    return roles


class _Counter:
    """llama.cpp's count of the calls and tokens a stretch of an arm's pass made (its perf counters; the calls,
    the context's own count of llama_decode calls)."""

    def __init__(self, context: Context) -> None:
        self.context, self.calls, self.evaluated = context, context.calls, context.evaluated()

    def counted(self) -> tuple[int, int]:
        return self.context.calls - self.calls, self.context.evaluated() - self.evaluated


def exactly(**counts: int) -> dict[str, list[int]]:
    """What a construction implies of each counter, as the premise's bounds (docs/ledger.md): exactly that count."""
    return {name: [count, count] for name, count in counts.items()}


def one_call(runtime: Runtime, z: list[int], values: Sequence[int], arm: str) -> dict[int, Pending]:
    """The whole prefix in one llama_decode call, its logits output at each point's last position; each point's
    state is that call's K/V over the point's positions (the positions past it dropped, from the last point down)."""
    points = sorted(values)
    with runtime.arm_context(arm) as context:
        counter = _Counter(context)
        rows = dict(zip(points, runtime.feed_every(context, z, f"{arm} call over {len(z)} tokens",
                                                   [value - 1 for value in points]).numpy(), strict=True))
        calls, evaluated = counter.counted()
        served = {"prefill_steps": calls, "evaluated": evaluated, "cached_tokens": 0, "n_ubatch": context.n_ubatch(),
                  "premise": exactly(prefill_steps=1, evaluated=len(z), cached_tokens=0)}
        out = {}
        for value in reversed(points):
            context.truncate(value)
            out[value] = Pending(context.save(), rows[value], served)
    return out


def chunked(runtime: Runtime, z: list[int], values: Sequence[int], arm: str) -> dict[int, Pending]:
    """Each point's prefix in calls of the context's n_batch (runtime.llamacpp.chunk) from one pass: the whole
    chunks before the point's last call kept, the last call made on them, then dropped again."""
    chunk = runtime.settings["chunk"]
    context = runtime._context(runtime.settings["chunk"])
    try:
        size, done, before, out = context.n_batch, 0, (0, 0), {}
        for value in sorted(values):
            start = (value - 1) // size * size  # where the point's last call begins
            if start > done:
                counter = _Counter(context)
                runtime.feed(context, z[done:start], f"{arm} calls over tokens {done}..{start - 1}")
                before = tuple(a + b for a, b in zip(before, counter.counted(), strict=True))
                done = start
            counter = _Counter(context)
            logits = runtime.feed(context, z[start:value], f"{arm} call over tokens {start}..{value - 1}")
            calls, evaluated = (a + b for a, b in zip(before, counter.counted(), strict=True))
            out[value] = Pending(context.save(), logits.numpy(), {
                "prefill_steps": calls, "evaluated": evaluated, "cached_tokens": value - evaluated,
                "n_ubatch": context.n_ubatch(),
                "premise": exactly(prefill_steps=-(-value // chunk), evaluated=value, cached_tokens=0)})
            if value - start == size:  # a whole chunk: the pass's own next call, kept
                before, done = (calls, evaluated), value
            else:
                context.truncate(start)
    finally:
        context.close()
    return out


def hits(runtime: Runtime, z: list[int], values: Sequence[int], arm: str) -> dict[int, Pending]:
    """An earlier request's whole prefix in calls of the chunk, then each point's prefix requested on its cache,
    from the last point down: every position but the point's last kept, the last evaluated in one call."""
    context = runtime._context(runtime.settings["chunk"])
    try:
        runtime.feed(context, z, f"{arm} earlier request over {len(z)} tokens")
        out = {}
        for value in sorted(values, reverse=True):
            context.truncate(value - 1)
            counter = _Counter(context)
            logits = runtime.feed(context, z[value - 1:value], f"{arm} hit at token {value - 1}")
            calls, evaluated = counter.counted()
            out[value] = Pending(context.save(), logits.numpy(), {
                "prefill_steps": calls, "evaluated": evaluated, "cached_tokens": value - evaluated,
                "n_ubatch": context.n_ubatch(),
                "premise": exactly(prefill_steps=1, evaluated=1, cached_tokens=value - 1)})
    finally:
        context.close()
    return out


def boundary(runtime: Runtime, arm: str, tokens: list[int], roles: list[int], pending: Pending) -> Boundary:
    """A point's state as a boundary; one whose state holds another number of cells than the point's tokens
    (llama.cpp counting a reuse of a cache that is not there) fails closed."""
    from replaytests.engine.llamacpp.runtime import Saved

    where = f"llamacpp sweep {arm} ({runtime.cell}) at {len(tokens)} tokens"
    served = pending.served
    saved = Saved(pending.state, len(tokens), served["evaluated"], prefill_steps=served["prefill_steps"],
                  served=served)
    cache = runtime._cache(saved.state, where)
    if cache.get_seq_length() != len(tokens):
        raise BoundaryMismatch(f"{where}: the sequence state holds {cache.get_seq_length()} cells: the cache it "
                               "read from is not there")
    return Boundary(arm, list(tokens), list(roles), cache, torch.from_numpy(pending.logits), saved)


def continued(runtime: Runtime, boundary: Boundary, count: int) -> Suffix:
    """Up to `count` greedy tokens under the structural mask from the boundary's state (loaded into the runtime's
    context), fewer where the grammar closes the answer first; decoded once per boundary."""
    saved = boundary.state
    if saved.suffix is not None:
        return saved.suffix
    context, cursor = runtime.context, Cursor()
    for token in boundary.tokens:
        cursor.advance(token, runtime.grammar)
    try:
        context.load(saved.state, saved.length)
    except DecodeFailed as exc:
        raise BoundaryMismatch(f"llamacpp sweep continuation of {boundary.construction}: {exc}") from None
    logits, tokens, margins, top1 = boundary.logits, [], [], []
    while True:
        token, best, margin, _ = runtime._choose(logits, cursor)
        cursor.advance(token, runtime.grammar)
        tokens.append(token)
        margins.append(margin)
        top1.append(best)
        if cursor.done or len(tokens) == count:
            break
        logits = runtime.feed(context, [token], f"continuation token {len(tokens) - 1} of {boundary.construction}")
    saved.suffix = Suffix(tokens, margins, runtime.decode(tokens), top1)
    return saved.suffix
