"""Arms built once per process: each (construction, tokens) boundary of one runtime, and its suffix.

Several families start from the same construction of the same tokens: the crossing's incremental and
prefill are the batch family's pair arms and the transplant's own arms; the live matrix's live arm is
the bridge's; the bridge's incremental of a live z equal to the bank row's is the crossing's. Each is
built and decoded once and handed to every family that needs it (constructions are deterministic, and
the replica families check exactly that: a replica is its own construction, `*_replica`, never a
shared one). Nothing mutates a shared arm: the suffix decoder and the transplant work on copies.

The arms held are bounded in bytes (least recently used first out): past the budget an arm is built
again when asked for, which costs time, never a different result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replaytests.engine.boundary import Boundary

if TYPE_CHECKING:
    from replaytests.engine.boundary import Suffix

BUDGET_BYTES = 512 * 2**20  # K/V and logits held per runtime (the embedded default's BF16 crossing: about 200 MiB)


@dataclass
class _Arm:
    boundary: Boundary
    nbytes: int
    suffix: Suffix | None = None


class Arms:
    def __init__(self, budget: int = BUDGET_BYTES) -> None:
        self.budget, self.held = budget, 0
        self.built = self.reused = 0  # boundaries built here, and handed out again
        self._arms: OrderedDict[tuple, _Arm] = OrderedDict()
        self._by_cache: dict[int, tuple] = {}  # id of a held boundary's cache -> its key

    def boundary(self, construction: str, tokens: list[int], build: Callable[[], Boundary]) -> Boundary:
        """The boundary of `construction` from `tokens` (z, or a prompt block for live ones), built once."""
        key = (construction, tuple(tokens))
        arm = self._arms.get(key)
        if arm is not None:
            self._arms.move_to_end(key)
            self.reused += 1
            return arm.boundary
        boundary = build()
        self.built += 1
        nbytes = sum(t.nbytes for kv in boundary.layers for t in kv) + boundary.logits.nbytes
        if nbytes <= self.budget:
            self._arms[key], self._by_cache[id(boundary.cache)] = _Arm(boundary, nbytes), key
            self.held += nbytes
            while self.held > self.budget:
                _, old = self._arms.popitem(last=False)
                del self._by_cache[id(old.boundary.cache)]
                self.held -= old.nbytes
        return boundary

    def suffix(self, boundary: Boundary, decode: Callable[[Boundary], Suffix]) -> Suffix:
        """The suffix decoded from `boundary`, once for a held boundary (a boundary not held here, such
        as a transplanted one, is decoded each time)."""
        key = self._by_cache.get(id(boundary.cache))
        if key is None:
            return decode(boundary)
        arm = self._arms[key]
        if arm.suffix is None:
            arm.suffix = decode(boundary)
        return arm.suffix
