"""What the vLLM backend declares of itself (replaytests.backends): its capabilities, its own fp8 K/V cache
formats (kv_cache_dtype), its contract settings `runtime.vllm` and their rules, its platform fields and the
settings its report section prints (docs/vllm.md). No torch, no vllm here."""

from __future__ import annotations

from typing import ClassVar

from replaytests.backends import Declaration
from replaytests.inputs.schema import MAX_BATCH, MAX_COUNT, MAX_DEVICES, Value, pin


class VLLM(Declaration):
    name = "vllm"
    title = "vLLM"
    docs = "docs/vllm.md"
    runtime = "replaytests.engine.vllm.runtime:Runtime"
    capabilities = frozenset({"structural_mask", "prefix_cache", "chunked_prefill", "rollout_logprobs",
                              "conversation", "edge_sweep"})
    kv_formats = ("fp8", "fp8_e4m3", "fp8_e5m2")  # its kv_cache_dtype
    settings_schema: ClassVar[dict] = {
        "version": pin(),
        "attention_backend": pin(),
        "block_size": Value(int, default=32, low=1, high=MAX_COUNT),
        "enforce_eager": Value(bool, default=True),
        # false: an engine without a prefix cache, every prefix hit and conversation session hit vacuous (a control)
        "prefix_caching": Value(bool, default=True),
        "chunk_budget": Value(int, default=32, low=1, high=MAX_COUNT),
        "max_num_seqs": Value(int, default=4, low=1, high=MAX_BATCH),
        "kv_cache_gib": Value(int, default=1, low=1, high=MAX_DEVICES),
        "logprobs": Value(int, default=8, low=2, high=20),
    }
    # vLLM tokenizes through transformers: its version is part of the platform too
    platform: ClassVar[dict[str, tuple[str, ...]]] = {
        kind: ("software.transformers", "software.vllm", "runtime.vllm") for kind in ("cpu", "cuda")}
    report_settings = "runtime.vllm"

    @classmethod
    def check_settings(cls, settings: dict, error) -> None:
        if settings["chunk_budget"] < settings["max_num_seqs"]:
            raise error("chunk_budget", f"expected at least max_num_seqs ({settings['max_num_seqs']}): vLLM refuses a "
                                        f"smaller token budget, got {settings['chunk_budget']}")
