"""A second backend, to prove the seam (engine.backend): the Hugging Face model seen the way a serving
engine shows it — top-k logprobs at the boundary, no K/V tensors, no state copy, no batch-size control.

It runs every family whose requirements it meets (the crossing, the live matrix) and is refused the
rest with the capability it lacks. Its boundaries carry the top-k logprobs in place of logits (every
other entry at float32's lowest value) and keep the Hugging Face boundary out of sight, to decode from.

It is added the way a fourth runtime is: this module, and one registry line, the entry point beside it
(replaytests_fourth_backend-0.dist-info/entry_points.txt), seen where this folder is on the path. Its
Declaration gives it a contract section (`runtime.logprobs-only.top_k`), a platform field and a report line;
tests/unit/test_backend_registry.py proves that no other file of the suite names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from replaytests.backends import Declaration
from replaytests.engine.backend import Unsupported
from replaytests.engine.boundary import Boundary, Suffix
from replaytests.inputs.schema import Value

if TYPE_CHECKING:
    from replaytests.engine.hf.runtime import Runtime


class LogprobsOnly(Declaration):
    name = "logprobs-only"
    title = "a logprobs-only engine"
    docs = "tests/unit/backends/logprobs_only.py"
    capabilities = frozenset({"role_visibility", "structural_mask", "physical_batch"})
    settings_schema: ClassVar[dict] = {"top_k": Value(int, default=5, low=1, high=64)}  # logprobs per boundary
    platform: ClassVar[dict] = {"cpu": ("runtime.logprobs-only",)}
    report_settings = "runtime.logprobs-only"

    def __init__(self, inner: Runtime, top_k: int) -> None:
        self.inner, self.cell, self.grammar, self.top_k = inner, inner.cell, inner.grammar, top_k
        self.cell_digest = inner.cell_digest

    # A declaration's module is imported while the contract's schema is built: what loads a model is imported
    # where it is used (replaytests.backends).
    @classmethod
    def inspect(cls, path: Path, contract, option: str):
        from replaytests.engine.hf import inspection

        return inspection.inspect(path, contract, option)  # it serves a Hugging Face directory

    @classmethod
    def describe(cls, contract) -> dict:
        return {"runtime": {cls.name: contract.runtime(cls.name)}}

    @classmethod
    def load(cls, model_dir: Path, contract, cell: str, device: str | None = None) -> LogprobsOnly:
        from replaytests.engine.hf.runtime import Runtime

        return cls(Runtime.load(model_dir, contract, cell, device), contract.runtime(cls.name)["top_k"])

    def activate(self) -> None:
        self.inner.activate()

    def _shown(self, boundary: Boundary) -> Boundary:
        """What an engine returns at the boundary: the top-k logprobs, no cache."""
        logprobs = boundary.logits.float().log_softmax(-1)
        top = logprobs.topk(self.top_k)
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
