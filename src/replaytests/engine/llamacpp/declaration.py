"""What the llama.cpp backend declares of itself (replaytests.backends): its capabilities, its own K/V cache
types (type_k/type_v), its contract settings `runtime.llamacpp` and their rules, and its platform fields: the
llama-cpp-python version and the build (docs/llamacpp.md). It records no transformers version: it never runs
transformers. No torch, no llama_cpp here."""

from __future__ import annotations

from typing import ClassVar

from replaytests.backends import Declaration
from replaytests.engine.llamacpp import build
from replaytests.inputs.schema import MAX_COUNT, Value, pin


class LlamaCpp(Declaration):
    name = "llamacpp"
    title = "llama.cpp"
    docs = "docs/llamacpp.md"
    runtime = "replaytests.engine.llamacpp.runtime:Runtime"
    capabilities = frozenset({"structural_mask", "full_logits", "kv_tensors", "state_copy", "prefix_cache",
                              "chunked_prefill", "rollout_logprobs", "conversation", "edge_sweep"})
    kv_formats = ("f16", "q8_0")  # its type_k/type_v (native: f32)
    settings_schema: ClassVar[dict] = {
        "version": pin(),
        "n_ctx": Value(int, default=1024, low=16, high=MAX_COUNT),
        "chunk": Value(int, default=64, low=1, high=MAX_COUNT),
        "flash_attention": Value(bool, default=False),
    }
    platform: ClassVar[dict[str, tuple[str, ...]]] = {"cpu": ("software.llama_cpp", "runtime.llamacpp")}
    # Runs before it declared its platform recorded the transformers version of the suite's venv.
    retired_platform = ("software.transformers",)
    report_settings = "runtime.llamacpp"

    @classmethod
    def build_of(cls, platform: dict | None) -> tuple:
        """(build_isa, build_cpu) of the build a recorded platform ran on (docs/llamacpp.md "Two builds")."""
        return build.of_platform(platform)

    @classmethod
    def build_here(cls) -> tuple:
        return build.here()

    @classmethod
    def check_settings(cls, settings: dict, error) -> None:
        if settings["chunk"] > settings["n_ctx"]:
            raise error("chunk", f"expected at most n_ctx ({settings['n_ctx']}): llama.cpp clamps a context's "
                                 "n_batch to its n_ctx, so calls of the chunk would be calls of n_ctx, got "
                                 f"{settings['chunk']}")
