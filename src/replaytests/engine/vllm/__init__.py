"""The vLLM backend (engine.backend): a serving engine under test, one request per construction.

Everything that imports vllm lives here; the rest of the suite sees a Backend whose boundaries carry
top-k logits in place of K/V (docs/vllm.md).
"""
