"""The boundary state (docs/protocol.md §3): everything a construction hands to the shared suffix decoder.

The boundary is the state after the single <|merge|> token was processed and before the first
merge-content token is chosen. Constructions that claim to reach the same boundary must agree on
tokens, roles, positions, padding (none) and cache metadata, and must never share storage.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import torch

from replaytests.errors import BoundaryMismatch, NonFinite, StorageAliasing, short

KV = tuple[torch.Tensor, torch.Tensor]
LAYER_DIGEST = 16  # hex digits kept of each layer's K and V sha256 (64 bits: a change detector, not a seal)


def cache_layers(cache) -> list[KV]:
    """Every layer's (K, V), each [batch, kv_heads, seq, head_dim], over the positions filled so far (a
    static cache's buffers hold its whole capacity)."""
    length = cache_seq_length(cache)
    return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers]


def cache_seq_length(cache) -> int:
    return int(cache.get_seq_length())


@dataclass
class Boundary:
    construction: str
    tokens: list[int]
    roles: list[int]
    # The K/V cache, None where the backend exposes no K/V tensors. It has transformers' Cache interface
    # (`layers[i].keys` and `.values`, `get_seq_length()`), which another backend's K/V can wrap.
    cache: object | None
    logits: torch.Tensor  # [vocab], the logical row of the call that consumed <|merge|> (or its top-k logprobs)
    state: object = None  # what a backend without K/V keeps to continue from here (opaque to the families)

    @property
    def layers(self) -> list[KV]:
        """Every layer's (K, V); empty where the backend exposes no K/V tensors."""
        return [] if self.cache is None else cache_layers(self.cache)

    @property
    def has_kv(self) -> bool:
        return self.cache is not None

    def metadata(self) -> dict:
        """Everything about the state that two constructions must share, except the values."""
        layers = self.layers
        return {
            "tokens": self.tokens,
            "roles": self.roles,
            "positions": [0, len(self.tokens) - 1],
            "padding": 0,
            "cache_seq_length": cache_seq_length(self.cache) if layers else None,
            "layers": len(layers),
            "tensors": [
                (tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))
                for kv in layers for t in kv
            ],
            "logits": (tuple(self.logits.shape), str(self.logits.dtype)),
            "device": str(layers[0][0].device if layers else self.logits.device),
        }

    def stored(self) -> list[torch.Tensor]:
        """What a quantized cache stores (codes, scales, zero points, the unquantized residual), where it
        differs from what attention reads (`layers`); empty for any other cache."""
        stored = getattr(self.cache, "stored_tensors", None)
        return stored() if stored else []

    def storages(self) -> set[int]:
        ptrs = {t.untyped_storage().data_ptr() for kv in self.layers for t in kv}
        ptrs |= {t.untyped_storage().data_ptr() for t in self.stored() if t.numel()}
        return ptrs | {self.logits.untyped_storage().data_ptr()}

    def stored_digest(self) -> str | None:
        """sha256 over what a quantized cache stores (stored()); None for any other cache."""
        stored = self.stored()
        if not stored:
            return None
        digest = hashlib.sha256()
        for tensor in stored:
            digest.update(_tensor_bytes(tensor))
        return digest.hexdigest()

    def tensor_name(self, ptr: int) -> str:
        """Which tensor of this boundary lives in the storage at `ptr`, e.g. `layer 2 V`."""
        for index, kv in enumerate(self.layers):
            for part, tensor in zip("KV", kv, strict=True):
                if tensor.untyped_storage().data_ptr() == ptr:
                    return f"layer {index} {part}"
        return "logits"

    def cache_digest(self) -> str | None:
        """sha256 over every layer's K and V bytes; None where the backend exposes no K/V."""
        return self.fingerprint()[0]

    def fingerprint(self) -> tuple[str | None, dict[str, list[str]] | None]:
        """The cache digest and each layer's K and V digests (`{"k": [...], "v": [...]}`, the first
        LAYER_DIGEST hex digits of the sha256 of that tensor's dtype, shape and bytes), in one pass over
        the bytes; (None, None) where the backend exposes no K/V."""
        if not self.has_kv:
            return None, None
        digest, per_layer = hashlib.sha256(), {"k": [], "v": []}
        for keys, values in self.layers:
            for part, tensor in (("k", keys), ("v", values)):
                raw = _tensor_bytes(tensor)
                digest.update(raw)
                per_layer[part].append(hashlib.sha256(raw).hexdigest()[:LAYER_DIGEST])
        return digest.hexdigest(), per_layer

    def logits_digest(self) -> str:
        return hashlib.sha256(_tensor_bytes(self.logits)).hexdigest()


@dataclass(frozen=True)
class Suffix:
    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 masked logit at each choice
    answer: str
    top1: list[float] = ()  # the top-1 masked logit at each choice (what a margin is measured against)


def steps_digest(steps) -> str:
    """sha256 of every suffix step's top-k (id, logit) rows, each logit by its exact bits (float.hex): what
    a serving arm records, so that two arms' steps are compared bit for bit."""
    return hashlib.sha256(json.dumps([[[t, float(v).hex()] for t, v in step] for step in steps]).encode()).hexdigest()


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: -0.0 differs from +0.0, and a NaN equals the same NaN bits.
    (torch.equal compares values, which is not what the protocol demands.)"""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(as_int(a), as_int(b))


def as_int(tensor: torch.Tensor) -> torch.Tensor:
    """The same bits as an integer tensor (floats compare bit for bit through it)."""
    return tensor.contiguous().view(_SAME_WIDTH_INT[tensor.element_size()]) if tensor.is_floating_point() else tensor


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    header = f"{tensor.dtype}:{tuple(tensor.shape)};".encode()
    raw = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
    return header + raw


def check_finite(boundary: Boundary, where: str) -> None:
    """Fail closed, naming the tensor, where a boundary's K/V or logits hold a NaN or an infinity."""
    tensors = [(f"layer {index} {part}", tensor) for index, kv in enumerate(boundary.layers)
               for part, tensor in zip("KV", kv, strict=True)] + [("logits", boundary.logits)]
    if not bool(torch.stack([torch.isfinite(t).all() for _, t in tensors]).all()):  # one host sync
        name, tensor = next((n, t) for n, t in tensors if not bool(torch.isfinite(t).all()))
        raise NonFinite(f"{where}: {boundary.construction} boundary {name} holds {int(torch.isnan(tensor).sum())} "
                        f"NaN and {int(torch.isinf(tensor).sum())} infinite values of {tensor.numel()}")


def check_same_state(arms: list[Boundary], where: str) -> None:
    """Fail closed unless every arm reached the same boundary up to the K/V and logit values, all finite."""
    for arm in arms:
        check_finite(arm, where)
    reference = arms[0].metadata()
    for arm in arms[1:]:
        other = arm.metadata()
        for field, value in reference.items():
            if other[field] != value:
                raise BoundaryMismatch(
                    f"{where}: boundary field {field!r} differs between {arms[0].construction} "
                    f"and {arm.construction}: {_difference(value, other[field])}"
                )


def _difference(a: object, b: object) -> str:
    """Both values, or for two lists the first index where they differ and the values there."""
    if isinstance(a, list) and isinstance(b, list):
        index = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        at = [v[index] if index < len(v) else "(end)" for v in (a, b)]
        return f"first at index {index}: {short(at[0])} vs {short(at[1])} (lengths {len(a)} and {len(b)})"
    return f"{short(a)} vs {short(b)}"


def check_storage_isolated(arms: list[Boundary], where: str) -> None:
    seen: dict[int, str] = {}
    for arm in arms:
        for ptr in arm.storages():
            if ptr in seen and seen[ptr][0] != arm.construction:
                raise StorageAliasing(f"{where}: {arm.construction} shares tensor storage with {seen[ptr][0]} "
                                      f"(data_ptr {ptr:#x}: {arm.construction} {arm.tensor_name(ptr)}, "
                                      f"{seen[ptr][0]} {seen[ptr][1]})")
            seen[ptr] = (arm.construction, arm.tensor_name(ptr))
