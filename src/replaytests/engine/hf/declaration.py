"""What the Hugging Face transformers backend declares of itself (replaytests.backends): its capabilities, the K/V
and weight formats it runs beside native (a cache quantized through a library, weights quantized at load), and the
transformers version its runs' platform records. No torch, no transformers here."""

from __future__ import annotations

from typing import ClassVar

from replaytests.backends import Declaration

# Every capability but a serving engine's (engine.backend.CAPABILITIES - SERVING).
CAPABILITIES = frozenset({"kv_tensors", "state_copy", "role_visibility", "structural_mask", "physical_batch",
                          "batch_size", "full_logits", "rollout_logprobs", "conversation", "position_splice",
                          "edge_sweep"})


class HF(Declaration):
    name = "hf"
    title = "Hugging Face transformers"
    docs = "docs/protocol.md"
    runtime = "replaytests.engine.hf.runtime:Runtime"
    capabilities = CAPABILITIES
    kv_formats = ("quantized",)  # transformers' QuantizedCache through a library (inputs/cells.KV_LIBRARIES)
    weight_formats = ("int8", "int4")  # weight-only, through a library at load (inputs/cells.WEIGHT_LIBRARIES)
    platform: ClassVar[dict[str, tuple[str, ...]]] = {kind: ("software.transformers",) for kind in ("cpu", "cuda")}
