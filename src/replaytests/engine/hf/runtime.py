"""The Hugging Face backend (engine.backend): the face the families see, with its capabilities and the
cells it runs; the work is the forward step's (forward.py), the constructions' and the decoder's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from replaytests.backends import CellProblem
from replaytests.engine import backend, turn_splice
from replaytests.engine.boundary import Boundary, Suffix
from replaytests.engine.conversation import TurnState
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import constructions, conversation, inspection, rollout, sweep, weights
from replaytests.engine.hf.declaration import HF
from replaytests.engine.hf.decoder import DecodeState, suffix_of
from replaytests.engine.hf.forward import Step
from replaytests.engine.rollout import Rollout
from replaytests.engine.transplant import transplant as transplanted
from replaytests.inputs.cells import Cell


class Runtime(Step, HF):
    """One model at one cell, with the protocol's grammar and the physical-batch forward: the Hugging
    Face backend, which has every capability but a serving engine's (one forward call with an explicit 4D
    mask, K/V in hand)."""

    inspect = staticmethod(inspection.inspect)  # a model directory before its weights load (backend.ModelFacts)
    check_loadable = staticmethod(hf_adapter.check_tensors)  # its tensors are the ones its architecture needs

    @classmethod
    def cell_problem(cls, cell: Cell) -> CellProblem | None:
        """What keeps this backend from running `cell` as it names it: a format it does not declare, or a library
        that is not installed here."""
        if problem := super().cell_problem(cell):
            return problem
        kv = cell.kv_cache
        if kv.format == "quantized" and (problem := hf_adapter.quantized_cache_problem(kv.library)):
            return CellProblem("kv_cache.library", f"{problem}; the cell is skipped, never run with a native cache",
                               missing_library=True)
        if not cell.weights.native and (problem := weights.problem()):
            return CellProblem("weights.library", f"{problem}; the cell is skipped, never run with native weights",
                               missing_library=True)
        return None

    @classmethod
    def cell_versions(cls, cell: Cell) -> dict[str, str]:
        """The versions of the libraries `cell` runs through (part of its digest)."""
        out = {}
        if cell.kv_cache.format == "quantized":
            out[cell.kv_cache.library] = hf_adapter.quantized_cache_version(cell.kv_cache.library)
        if not cell.weights.native:
            out[weights.LIBRARY] = weights.version()
        return out

    @classmethod
    def describe(cls, contract) -> dict:
        """What a run's environment records of this runtime: transformers' version (part of its platform)."""
        return {"software": {"transformers": hf_adapter.transformers_version()}}

    @classmethod
    def cell_libraries(cls, cell: Cell) -> dict[str, str]:
        """What run.json records of the libraries `cell` runs through: each one's version and, for quantized
        weights, torchao's own full description of its configuration (a function of the cell and the version,
        so not part of the digest)."""
        out = cls.cell_versions(cell)
        if not cell.weights.native:
            out[f"{weights.LIBRARY}.config"] = weights.describe(cell.weights)
        return out

    @functools.cached_property
    def cell_digest(self) -> str:
        """Every record of this runtime carries it: computed once (it reads the libraries' versions)."""
        return backend.cell_digest(type(self), self.flags)

    # The Backend protocol (engine.backend), served by the constructions and the decoder.
    def build(self, construction: str, z: list[int]) -> Boundary:
        return constructions.build(self, construction, z)

    def live(self, prompt_block: list[int], construction: str = "live") -> Boundary:
        return constructions.live(self, prompt_block, construction)

    def suffix(self, boundary: Boundary) -> Suffix:
        return suffix_of(self, boundary)

    def rollout(self, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
        return rollout.live(self, z, length, seed, construction)

    def replay(self, construction: str, z: list[int], response: list[int]) -> Rollout:
        return rollout.replay(self, construction, z, response)

    def session(self, users: list[list[int]], cap: int, closer: int,
                construction: str = "session") -> list[TurnState]:
        return conversation.session(self, users, cap, closer, construction)

    def replayed(self, construction: str, histories: list[list[int]], cap: int, closer: int) -> list[TurnState]:
        return conversation.replayed(self, construction, histories, cap, closer)

    def render(self, template: str, messages: list[dict], generation_prompt: bool) -> str:
        return conversation.render(self, template, messages, generation_prompt)

    def transplant(self, recipient: Boundary, donor: Boundary, layers: Sequence[int] | None = None,
                   parts: Sequence[str] = ("k", "v")) -> Boundary:
        def splice(chosen: list[int], selected: tuple[str, ...]) -> tuple[object, None]:
            return hf_adapter.transplanted_cache(self.model, recipient.cache, donor.cache, chosen, selected), None

        return transplanted(recipient, donor, layers, parts, splice)

    def splice(self, recipient: Boundary, donor: Boundary, end: int) -> Boundary:
        return turn_splice.splice(recipient, donor, end,
                                  lambda n: hf_adapter.spliced_cache(self.model, recipient.cache, donor.cache, n))

    def answer(self, boundary: Boundary, cap: int, closer: int) -> Suffix:
        return conversation.answer(self, boundary, cap, closer)

    def sweep_axes(self, settings: dict) -> tuple[backend.Axis, ...]:
        return sweep.axes(self, settings)

    def sweep(self, axis: backend.Axis, z: list[int], values: Sequence[int], continuation: int):
        return sweep.sweep(self, axis, z, values, continuation)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def probe(self, tokens: list[int]) -> torch.Tensor:
        """The last position's logits of one prefill call over `tokens`."""
        state = DecodeState.empty(self, len(tokens))
        for token in tokens:
            state.push(token)
        state.feed(len(tokens), "probe")
        return state.boundary("probe").logits
