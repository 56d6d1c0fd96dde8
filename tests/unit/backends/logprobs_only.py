"""A second backend, to prove the seam (engine.backend): the Hugging Face model seen the way a serving
engine shows it — top-k logprobs at the boundary, no K/V tensors, no state copy, no batch-size control.

It runs every family whose requirements it meets (the crossing, the live matrix) and is refused the
rest with the capability it lacks. Its boundaries carry the top-k logprobs in place of logits (every
other entry at float32's lowest value) and keep the Hugging Face boundary out of sight, to decode from.
Selected with `--backend logprobs_only:LogprobsOnly` with this folder on PYTHONPATH.
"""

from __future__ import annotations

from pathlib import Path

import torch

from replaytests.engine.backend import Unsupported
from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.hf.runtime import Runtime

TOP_K = 5


class LogprobsOnly:
    name = "logprobs-only"
    capabilities = frozenset({"role_visibility", "structural_mask", "physical_batch"})

    def __init__(self, inner: Runtime) -> None:
        self.inner, self.precision, self.grammar = inner, inner.precision, inner.grammar
        self.cell_digest = inner.cell_digest

    @classmethod
    def load(cls, model_dir: Path, contract, precision: str, device: str | None = None) -> LogprobsOnly:
        return cls(Runtime.load(model_dir, contract, precision, device))

    def activate(self) -> None:
        self.inner.activate()

    def _shown(self, boundary: Boundary) -> Boundary:
        """What an engine returns at the boundary: the top-k logprobs, no cache."""
        logprobs = boundary.logits.float().log_softmax(-1)
        top = logprobs.topk(TOP_K)
        shown = torch.full_like(logprobs, torch.finfo(torch.float32).min).scatter(0, top.indices, top.values)
        return Boundary(boundary.construction, list(boundary.tokens), list(boundary.roles), None, shown,
                        state=boundary)

    def build(self, construction: str, z: list[int]) -> Boundary:
        return self._shown(self.inner.build(construction, z))

    def live(self, prompt_block: list[int], construction: str = "live") -> Boundary:
        return self._shown(self.inner.live(prompt_block, construction))

    def suffix(self, boundary: Boundary) -> Suffix:
        return self.inner.suffix(boundary.state)

    def transplant(self, recipient, donor, layers=None, parts=("k", "v")) -> Boundary:
        raise Unsupported(f"backend {self.name} has no K/V to transplant")

    def with_batch(self, batch: int) -> LogprobsOnly:
        raise Unsupported(f"backend {self.name} does not choose its batch")

    def first_copy(self, boundary: Boundary) -> Boundary:
        raise Unsupported(f"backend {self.name} has no K/V to copy")
