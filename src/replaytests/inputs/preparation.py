"""Model preparation (docs/models.md): what `replaytests models prepare` runs to write a Hugging Face
directory, a GGUF checkpoint dequantized or a short continued-training run. It writes checkpoints and
tests nothing; the runtime under test loads what it wrote through its backend (engine/hf).
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import torch

from replaytests.errors import ConfigError


@contextlib.contextmanager
def quiet():
    """transformers' own warnings and progress bars stay out of the output (a bad input is one line of
    ours, naming the file and field). The one copy, used by the HF backend's loader too."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights: 100%" on stderr, around an error line of ours
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def convert_gguf(directory: Path, gguf_name: str, out: Path) -> None:
    """A GGUF checkpoint dequantized by transformers' own GGUF loader and written to `out` as a Hugging
    Face directory: bf16 safetensors, config and tokenizer (needs the `gguf` and `accelerate` packages)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_name, dtype=torch.bfloat16,
                                                     local_files_only=True)
        # The weights are already dequantized; save_pretrained refuses while the GGUF marker stays.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))


def continue_training(src: Path, out: Path, texts: list[str], *, block: int, batch: int, steps: int,
                      lr: float, seed: int) -> list[float]:
    """A short continued-training run: `texts` tokenized and packed into `block`-token sequences, `steps`
    AdamW steps of `batch` sequences each in FP32 (data order seeded), weights written back as bf16 with
    the source's tensor names. Returns the loss of each step."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # one reduction order: the bytes depend on the seed and the kernels alone
    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True, trust_remote_code=False)
        # SDPA attention, as the runtime under test loads it (engine/hf/adapter.py): the bytes depend on it.
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, attn_implementation="sdpa",
                                                     local_files_only=True, trust_remote_code=False,
                                                     use_safetensors=True)
    model.train()
    stream = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
    blocks = [stream[i:i + block] for i in range(0, len(stream) - block + 1, block)]
    if len(blocks) < batch:
        raise ConfigError(f"continued training: {len(stream)} tokens make {len(blocks)} blocks of {block}, "
                          f"fewer than one batch of {batch}")
    order = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        ids = torch.tensor(order.sample(blocks, batch))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    weights = sorted(src.glob("*.safetensors"))
    params = dict(model.named_parameters())
    for path in weights:
        with safe_open(str(path), "pt") as handle:
            names = sorted(handle.keys())
        save_file({name: params[name].detach().to(torch.bfloat16).contiguous() for name in names},
                  str(out / path.name), metadata={"format": "pt"})
    return losses


# The projections a LoRA adapter of ours adapts, in every layer (fixtures/make_protocol_adapter.py).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def merge_lora(src: Path, adapter: Path, out: Path) -> None:
    """`src`'s weights with a LoRA adapter merged in, written to `out` with the source's tensor names.

    Each adapted weight becomes bf16(W + scale * sum_k B[:, k] A[k, :]), the sum taken rank by rank in
    float64 with elementwise operations only (each correctly rounded, no matrix kernel, no fused
    multiply-add), then rounded once to bf16: the bytes depend on the two files alone, not on the CPU.
    An adapter may also carry whole rows of a weight (`STEM.rows` at the indices `STEM.row_ids`, e.g.
    the delimiters' trained rows of a tied embedding): they replace the source's rows as they are.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(adapter), "pt") as handle:
        meta = handle.metadata() or {}
        lora = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    try:
        scale = float(meta["alpha"]) / int(meta["rank"])
    except (KeyError, ValueError):
        raise ConfigError(f"{adapter}: metadata 'alpha' and 'rank' expected (a LoRA adapter written by "
                          "fixtures/make_protocol_adapter.py)") from None
    for path in sorted(src.glob("*.safetensors")):
        merged, used = {}, set()
        with safe_open(str(path), "pt") as handle:
            for name in sorted(handle.keys()):
                weight = handle.get_tensor(name)
                stem = name.removesuffix(".weight")
                if f"{stem}.lora_A" in lora:
                    a, b = lora[f"{stem}.lora_A"].double(), lora[f"{stem}.lora_B"].double()
                    if b.shape[0] != weight.shape[0] or a.shape[1] != weight.shape[1]:
                        raise ConfigError(f"{adapter}: tensors {stem}.lora_A/B are {tuple(a.shape)} and "
                                          f"{tuple(b.shape)}, not a low-rank form of {name} {tuple(weight.shape)}")
                    total = weight.double()
                    for k in range(a.shape[0]):
                        total = total + (b[:, k:k + 1] * scale) * a[k:k + 1, :]
                    weight = total.to(weight.dtype)
                    used.add(stem)
                if f"{stem}.rows" in lora:
                    weight = _replace_rows(adapter, name, weight, lora[f"{stem}.rows"], lora.get(f"{stem}.row_ids"))
                    used.add(stem)
                merged[name] = weight.contiguous()
        save_file(merged, str(out / path.name), metadata={"format": "pt"})
    unused = sorted({name.rsplit(".", 1)[0] for name in lora} - used)
    if unused:
        raise ConfigError(f"{adapter}: tensors {unused[:3]} adapt no weight of {src}")


def _replace_rows(adapter: Path, name: str, weight, rows, ids):
    """`weight` with its rows at `ids` replaced by `rows`, once they are checked to fit."""
    import torch

    stem = name.removesuffix(".weight")
    fits = (ids is not None and ids.dtype == torch.int64 and ids.dim() == 1 and rows.dtype == weight.dtype
            and rows.shape == (ids.numel(), *weight.shape[1:]) and ids.unique().numel() == ids.numel()
            and (ids.numel() == 0 or (ids.min() >= 0 and ids.max() < weight.shape[0])))
    if not fits:
        got = "absent" if ids is None else f"{ids.dtype} {tuple(ids.shape)}"
        raise ConfigError(f"{adapter}: {stem}.rows ({rows.dtype} {tuple(rows.shape)}) and {stem}.row_ids ({got}) "
                          f"are not distinct rows of {name} ({weight.dtype} {tuple(weight.shape)})")
    weight = weight.clone()
    weight[ids] = rows
    return weight
