"""The forward step of the Hugging Face backend: one model at one cell, and the
physical-batch forward call the constructions, the decoder, the checks and the benchmarks all make.

Every forward call carries `batch` identical copies of the row (2 by default) with an explicit 4D
visibility mask and explicit flat positions; after each call the copies' logits must be bitwise
equal, or the run fails closed (docs/protocol.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from replaytests.engine import stop
from replaytests.engine.arms import Arms
from replaytests.engine.boundary import Boundary, as_int, bitwise_equal
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import weights
from replaytests.engine.numerics import apply_numeric_flags
from replaytests.engine.protocol import Delimiters, Grammar
from replaytests.errors import ConfigError, PhysicalBatchDesync
from replaytests.inputs.cells import Cell
from replaytests.inputs.contract import Contract


def load_cell(model_dir: Path, contract: Contract, cell: str,
              device: str | None = None) -> tuple[Cell, str, object]:
    """The model at one of the contract's cells, on `device` (default: the contract's), with the cell's numeric
    settings applied and read back: (the cell, the device, the model)."""
    flags = contract.cell(cell)
    device = device or contract.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{contract.path}: environment.device is {device!r} but CUDA is not available here")
    if contract.cache == "offloaded" and not device.startswith("cuda"):
        raise ConfigError(f"{contract.path}: environment.cache offloaded keeps layers on the CPU between uses "
                          f"of a CUDA device; the device here is {device!r}")
    if not flags.kv_cache.native and contract.cache != "dynamic":
        raise ConfigError(f"{contract.path}: cells.{cell}.kv_cache: a quantized K/V cache replaces the "
                          f"cache class; environment.cache must be dynamic, got {contract.cache!r}")
    apply_numeric_flags(flags, contract.cpu_threads)
    model = hf_adapter.load_model(model_dir, flags.dtype, device, contract.attention)
    if not flags.weights.native:
        weights.quantize(model, flags.weights, f"{model_dir} (cell {cell})")
    return flags, device, model


@dataclass
class Step:
    """One model at one cell, with the protocol's grammar and the physical-batch forward call, and the
    boundaries built with it (`arms`, shared by every family)."""

    cell: str
    flags: Cell
    threads: int
    model: object
    tokenizer: object
    grammar: Grammar
    device: torch.device
    batch: int = 2
    cache: str = "dynamic"  # the K/V cache class (blocks.CACHES)
    visibility: str = "roles"  # the contract's protocol.visibility (protocol.VISIBILITIES)

    @classmethod
    def load(cls, model_dir: Path, contract: Contract, cell: str, device: str | None = None,
             batch: int | None = None) -> Step:
        flags, device, model = load_cell(model_dir, contract, cell, device)
        tokenizer = hf_adapter.load_tokenizer(model_dir)
        delims = Delimiters.resolve(tokenizer, contract.delimiters)
        grammar = Grammar(delims, contract.caps, hf_adapter.vocab_size(model), len(tokenizer),
                          contract.banned_tokens, device)
        return cls(cell, flags, contract.cpu_threads, model, tokenizer, grammar,
                   torch.device(device), batch or contract.physical_batch, contract.cache, contract.visibility)

    def __post_init__(self) -> None:
        self._forward = hf_adapter.Forward(self.model, self.cache, self.flags.kv_cache)
        self._positions: torch.Tensor | None = None  # [batch, n] of 0, 1, 2, ...: each call's positions are a view
        self.arms = Arms()  # the boundaries (and suffixes) built with this runtime, shared by every family

    def activate(self) -> None:
        """Re-apply this cell's flags (another cell's runtime may have changed them)."""
        apply_numeric_flags(self.flags, self.threads)

    def new_cache(self):
        """An empty cache of the contract's class (environment.cache)."""
        return self._forward.new_cache()

    def with_batch(self, batch: int) -> Step:
        """The same model with another physical batch (its own arms: a boundary depends on the batch)."""
        return replace(self, batch=batch)

    def first_copy(self, boundary: Boundary) -> Boundary:
        """The first copy of a physical batch as a storage-isolated singleton boundary."""
        return replace(boundary, cache=hf_adapter.first_copy(self.model, boundary.cache))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, start: int, cache, keep: int = 1) -> torch.Tensor:
        """Process the tokens `ids` [batch, q] at positions start.. under the 4D `mask` [batch, 1, q, k]
        (protocol.Visibility), every copy the same row. Returns the last position's logits of every copy,
        [batch, vocab] (`keep` 0: every position's, [batch, q, vocab]), unchecked: the caller compares the
        copies (check_batch_equal, or copies_differ where a host sync is not wanted) before it reads them, as
        DecodeState does for every call."""
        stop.check()
        end = start + ids.shape[1]
        if self._positions is None or self._positions.shape[1] < end:
            length = max(end, hf_adapter.max_positions(self.model))
            self._positions = torch.arange(length, device=self.device).expand(self.batch, -1)
        with torch.inference_mode():
            if keep != 1:
                return self._forward.logits(ids, mask, self._positions[:, start:end], cache, keep)
            return self._forward(ids, mask, self._positions[:, start:end], cache)


def copies_differ(tensor: torch.Tensor) -> torch.Tensor:
    """Whether any copy along dim 1 (dim 0: calls) differs from its neighbour bitwise, as a 0-d bool
    tensor on the tensor's device (wrapping integer a - b is 0 exactly when a == b)."""
    return as_int(tensor).diff(dim=1).any()


def check_batch_equal(tensor: torch.Tensor, where: str) -> None:
    """Fail closed unless every copy along dim 0 equals copy 0 bitwise."""
    for copy in range(1, tensor.shape[0]):
        if not bitwise_equal(tensor[copy], tensor[0]):
            diff = (tensor[copy].double() - tensor[0].double()).abs().max().item()
            raise PhysicalBatchDesync(
                f"physical-batch desync at {where}: copy {copy} differs from copy 0, max |diff| {diff:.6g}"
            )
