"""The model runtime: numeric flags, one model per precision, and the physical-batch forward call.

Every forward call carries `batch` identical copies of the row (2 by default) with an explicit 4D
visibility mask and explicit flat positions; after each call the copies' logits must be bitwise
equal, or the run fails closed (SPEC §2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from replaytests import hf_adapter
from replaytests.contract import Contract, PrecisionFlags
from replaytests.errors import ConfigError, PhysicalBatchDesync
from replaytests.protocol import Delimiters, Grammar, visibility_rows


def apply_numeric_flags(flags: PrecisionFlags, threads: int) -> None:
    """Apply the contract's numeric settings, then read them back: a flag that did not take is an error."""
    torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = flags.tf32_matmul
    torch.backends.cudnn.allow_tf32 = flags.cudnn_tf32
    torch.set_float32_matmul_precision(flags.float32_matmul_precision)
    if flags.bf16_reduced_precision_reduction is not None:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flags.bf16_reduced_precision_reduction
    readback = {
        "cpu_threads": (torch.get_num_threads(), threads),
        "tf32_matmul": (torch.backends.cuda.matmul.allow_tf32, flags.tf32_matmul),
        "cudnn_tf32": (torch.backends.cudnn.allow_tf32, flags.cudnn_tf32),
        "float32_matmul_precision": (torch.get_float32_matmul_precision(), flags.float32_matmul_precision),
    }
    for name, (actual, wanted) in readback.items():
        if actual != wanted:
            raise ConfigError(f"numeric flag {name}: set {wanted!r} but it reads back {actual!r}")


@dataclass
class Runtime:
    """One model at one precision, with the protocol's grammar and the physical-batch forward."""

    precision: str
    flags: PrecisionFlags
    threads: int
    model: object
    tokenizer: object
    grammar: Grammar
    device: torch.device
    batch: int = 2

    @classmethod
    def load(cls, model_dir: Path, contract: Contract, precision: str, device: str | None = None,
             batch: int | None = None) -> Runtime:
        if precision not in contract.precisions:
            raise ConfigError(
                f"{contract.path}: precision {precision!r} is not in the contract's precisions "
                f"({', '.join(contract.precisions)})"
            )
        flags = contract.precisions[precision]
        device = device or contract.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"{contract.path}: environment.device is {device!r} but CUDA is not available here")
        apply_numeric_flags(flags, contract.cpu_threads)
        tokenizer = hf_adapter.load_tokenizer(model_dir)
        model = hf_adapter.load_model(model_dir, flags.dtype, device, contract.attention)
        delims = Delimiters.resolve(tokenizer, contract.delimiters)
        grammar = Grammar(delims, contract.caps, hf_adapter.vocab_size(model), len(tokenizer),
                          contract.banned_tokens, device)
        return cls(precision, flags, contract.cpu_threads, model, tokenizer, grammar,
                   torch.device(device), batch or contract.physical_batch)

    def __post_init__(self) -> None:
        self._forward = hf_adapter.Forward(self.model)

    def activate(self) -> None:
        """Re-apply this precision's flags (another precision's runtime may have changed them)."""
        apply_numeric_flags(self.flags, self.threads)

    def new_cache(self):
        return self._forward.new_cache()

    def forward(self, tokens: list[int], roles: torch.Tensor, start: int, cache, step: str) -> torch.Tensor:
        """Process `tokens` at positions start.. (roles holds every role up to and including them).

        Returns the logits of the last position for the logical row, after checking that every
        copy in the physical batch produced bitwise-equal logits.
        """
        end = start + len(tokens)
        mask = visibility_rows(roles[start:end], roles[:end], start)
        mask = mask[None, None].expand(self.batch, 1, len(tokens), end)
        ids = torch.tensor(tokens, device=self.device).expand(self.batch, -1)
        positions = torch.arange(start, end, device=self.device).expand(self.batch, -1)
        with torch.inference_mode():
            logits = self._forward(ids, mask, positions, cache)
        check_batch_equal(logits, f"{step} (logits)")
        return logits[0]


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: -0.0 differs from +0.0, and a NaN equals the same NaN bits.
    (torch.equal compares values, which is not what the protocol demands.)"""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    as_int = _SAME_WIDTH_INT[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def check_batch_equal(tensor: torch.Tensor, where: str) -> None:
    """Fail closed unless every copy along dim 0 equals copy 0 bitwise."""
    for copy in range(1, tensor.shape[0]):
        if not bitwise_equal(tensor[copy], tensor[0]):
            diff = (tensor[copy].double() - tensor[0].double()).abs().max().item()
            raise PhysicalBatchDesync(
                f"physical-batch desync at {where}: copy {copy} differs from copy 0, max |diff| {diff:.6g}"
            )
