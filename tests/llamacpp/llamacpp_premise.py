"""The premise of a cross-runtime rollout row (docs/llamacpp.md, "Rollouts"): the transformers model that
recomputes a llama.cpp rollout has the GGUF's token ids and the GGUF's weights.

- token ids: every id of the Hugging Face tokenizer is the GGUF vocabulary's token of that id (the text each
  stores, GPT-2's byte-level form); ids past the tokenizer are the GGUF's padding rows;
- weights: every GGUF tensor, dequantized to float32 by gguf-py (the converter's own copy), holds the same
  multiset of values as one tensor of the Hugging Face checkpoint (sorted values: a LLaMA converter permutes
  the Q and K rows, and transformers' GGUF loader permutes them back).

`python tests/llamacpp/llamacpp_premise.py GGUF OUT` writes OUT, the GGUF dequantized to float32 by transformers'
GGUF loader (a quantized GGUF's exact values: `models prepare smollm2` keeps bf16, which rounds them), and checks
both premises on it; it prints what it found and exits 1 where either fails. Tests and the committed baseline
use it (fixtures/ledgers/README.md, "llamacpp-smollm2-rollout").
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

CONVERTER = Path(sys.prefix) / "llamacpp-converter" / "gguf-py"  # tools/install-llamacpp.sh keeps it there


def _gguf_py():
    sys.path.insert(0, str(CONVERTER))
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    finally:
        sys.path.pop(0)
    return GGUFReader, dequantize


def vocab_mismatches(gguf: Path, model_dir: Path) -> tuple[int, list[tuple[int, str, str]]]:
    """The tokenizer's size and the ids whose token differs from the GGUF's (id, GGUF text, tokenizer text)."""
    from transformers import AutoTokenizer

    from replaytests.engine.llamacpp.context import Model

    model = Model(gguf, vocab_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        ids = list(range(len(tokenizer)))
        theirs = tokenizer.convert_ids_to_tokens(ids)
        ours = [model.llama_cpp.llama_vocab_get_text(model.vocab, i).decode("utf-8", "surrogateescape") for i in ids]
    finally:
        model.close()
    return len(ids), [(i, a, b) for i, a, b in zip(ids, ours, theirs, strict=True) if a != b]


def _values(array: np.ndarray) -> str:
    return hashlib.sha256(np.sort(np.asarray(array, dtype=np.float32).ravel()).tobytes()).hexdigest()


def weight_mismatches(gguf: Path, model_dir: Path) -> tuple[int, list[str]]:
    """The GGUF's tensor count and the tensors whose float32 values no checkpoint tensor holds."""
    from safetensors.torch import load_file

    reader, dequantize = _gguf_py()
    stored = {_values(t.float().numpy()) for t in load_file(model_dir / "model.safetensors").values()}
    tensors = reader(gguf).tensors
    return len(tensors), [t.name for t in tensors if _values(dequantize(t.data, t.tensor_type)) not in stored]


def dequantized(gguf: Path, out: Path) -> Path:
    """The GGUF as a Hugging Face directory at float32 (its exact dequantized values), tokenizer included."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model.hf_quantizer = None  # already dequantized: save_pretrained refuses while the GGUF marker stays
    model.config.__dict__.pop("quantization_config", None)  # (as inputs/preparation.convert_gguf)
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    model.save_pretrained(work)
    tokenizer.save_pretrained(work)
    work.rename(out)
    return out


def main(argv: list[str]) -> int:
    gguf, out = Path(argv[0]), Path(argv[1])
    if not out.exists():
        dequantized(gguf, out)
    size, tokens = vocab_mismatches(gguf, out)
    count, weights = weight_mismatches(gguf, out)
    print(f"{out}: token ids: {size - len(tokens)}/{size} the GGUF's; weights: {count - len(weights)}/{count} "
          f"GGUF tensors' float32 values held by the checkpoint")
    for line in [*(f"  id {i}: GGUF {a!r}, tokenizer {b!r}" for i, a, b in tokens[:5]), *weights[:5]]:
        print(line)
    return 1 if tokens or weights else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
