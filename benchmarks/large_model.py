"""Inputs of the GPU check's larger model (benchmarks/gpu_check.sh): a randomly initialised Qwen2 built
from a seed, problems whose prompts make 1k-4k-token prefixes, and a contract extending h200.yaml.

    python benchmarks/large_model.py model --out DIR            # ~270M parameters, bf16 safetensors
    python benchmarks/large_model.py problems --out P.jsonl --count 8 --min-bytes 900 --max-bytes 3900
    python benchmarks/large_model.py contract --out C.yaml [--bank BANK.jsonl] [--device cpu]

The tokenizer is the embedded tiny model's (byte-level plus the 12 delimiters), so a prompt of N ASCII
bytes is N tokens and the delimiters resolve as in the suite's fixtures.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import torch
import yaml

from replaytests.files import write_atomic, write_jsonl_atomic
from replaytests.inputs.bank import read_manifest
from replaytests.inputs.options import DEFAULT_MODEL, REPO

H200 = REPO / "contracts" / "h200.yaml"
WORDS = ("carry", "column", "digit", "total", "sum", "check", "add", "number", "first", "second", "then", "write")


def build_model(out: Path, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                max_positions: int, seed: int) -> int:
    """A Qwen2 with the tiny model's vocabulary and special ids, initialised from `seed` on the CPU (so
    every machine builds the same weights), saved in bf16 beside the tiny model's tokenizer files.
    Returns the parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tiny = json.loads((DEFAULT_MODEL / "config.json").read_text(encoding="utf-8"))
    config = Qwen2Config(
        vocab_size=tiny["vocab_size"], hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tiny["bos_token_id"], eos_token_id=tiny["eos_token_id"], pad_token_id=tiny["pad_token_id"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for tokenizer_file in sorted(DEFAULT_MODEL.glob("tokenizer*.json")):
        shutil.copy(tokenizer_file, out / tokenizer_file.name)
    return sum(p.numel() for p in model.parameters())


def prompt(rng: random.Random, size: int) -> tuple[str, str]:
    """An ASCII prompt of exactly `size` bytes ending in an addition question, and its answer."""
    a, b = rng.randrange(100, 1000), rng.randrange(100, 1000)
    question = f" What is {a} + {b}?"
    words = []
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(WORDS))
    filler = " ".join(words)[: size - len(question)]
    return filler + question, str(a + b)


def write_problems(out: Path, count: int, min_bytes: int, max_bytes: int, seed: int) -> list[int]:
    """`count` problems with prompt sizes evenly spaced from min_bytes to max_bytes; returns the sizes."""
    rng = random.Random(seed)
    sizes = [min_bytes + round(i * (max_bytes - min_bytes) / max(count - 1, 1)) for i in range(count)]
    problems = []
    for index, size in enumerate(sizes):
        text, answer = prompt(rng, size)
        problems.append({"id": f"large-{index:03d}", "prompt": text, "expected_answer": answer})
    write_jsonl_atomic(out, problems)
    return sizes


def write_contract(out: Path, bank: Path | None, device: str | None) -> dict:
    """h200.yaml with the bank expectations of this model's bank (unpinned until it is frozen); on
    another device (the CPU smoke run) the hardware pins are lifted."""
    contract = {
        "extends": str(H200.resolve()),
        "name": "h200-large-random",
        "description": "A randomly initialised larger Qwen2 (benchmarks/large_model.py) on one NVIDIA H200.",
        "bank": {"rows": None, "prefix_len": {"min": None, "max": None}},
    }
    if bank is not None:
        manifest = read_manifest(bank)
        contract["bank"] = {"rows": manifest["rows"], "prefix_len": manifest["prefix_len"]}
    if device is not None:
        contract["environment"] = {"device": device}
        contract["hardware"] = {"device_kind": device.split(":")[0], "gpu_name": None, "compute_capability": None}
    header = "# Written by benchmarks/large_model.py for the GPU check; see benchmarks/README.md.\n"
    write_atomic(out, header + yaml.safe_dump(contract, sort_keys=False))
    return contract


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="benchmarks/large_model.py", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    model = sub.add_parser("model", help="build and save the seeded model")
    model.add_argument("--out", type=Path, required=True)
    for name, default in (("hidden", 1024), ("layers", 24), ("heads", 16), ("kv-heads", 4),
                          ("intermediate", 2816), ("max-positions", 8192)):
        model.add_argument(f"--{name}", type=_positive, default=default, help="Default: %(default)s")
    model.add_argument("--seed", type=int, default=20260801, help="Default: %(default)s")
    problems = sub.add_parser("problems", help="write problems with long prompts")
    problems.add_argument("--out", type=Path, required=True)
    problems.add_argument("--count", type=_positive, default=8, help="Default: %(default)s")
    problems.add_argument("--min-bytes", type=_positive, default=900, help="Default: %(default)s")
    problems.add_argument("--max-bytes", type=_positive, default=3900, help="Default: %(default)s")
    problems.add_argument("--seed", type=int, default=0, help="Default: %(default)s")
    contract = sub.add_parser("contract", help="write the contract (extends contracts/h200.yaml)")
    contract.add_argument("--out", type=Path, required=True)
    contract.add_argument("--bank", type=Path, default=None, help="a frozen bank whose manifest gives rows and lengths")
    contract.add_argument("--device", default=None, help="run on this device instead (e.g. cpu for the smoke run)")
    return top


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command == "model":
        if args.hidden % args.heads or args.heads % args.kv_heads:
            p.error(f"--hidden must be a multiple of --heads and --heads of --kv-heads, got {args.hidden}, "
                    f"{args.heads} and {args.kv_heads}")
        count = build_model(args.out, args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                            args.max_positions, args.seed)
        print(f"wrote {args.out}: Qwen2, {count:,} parameters, seed {args.seed}")
    elif args.command == "problems":
        if args.min_bytes > args.max_bytes or args.min_bytes < 20:
            p.error(f"expected 20 <= --min-bytes <= --max-bytes, got {args.min_bytes} and {args.max_bytes}")
        sizes = write_problems(args.out, args.count, args.min_bytes, args.max_bytes, args.seed)
        print(f"wrote {args.out}: {len(sizes)} problems, prompts of {sizes[0]}-{sizes[-1]} bytes")
    else:
        contract = write_contract(args.out, args.bank, args.device)
        print(f"wrote {args.out}: bank expectations {contract['bank']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
