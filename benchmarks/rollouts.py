"""`replaytests rollouts check` beside a bare forward over the same tokens (issue 48): response tokens per second.

    python benchmarks/rollouts.py                              # 1,000 rows of 512 response tokens, bf16
    python benchmarks/rollouts.py --rows 8 --length 64 --out /tmp/r.json   # toy sizes

Not a timed test: everything is measured in one process, in one run, and written as JSON (with the
environment) and Markdown under results/. A synthetic dump (prompt and response ids drawn from a generator
seeded with --seed, every log-probability -1) is measured three ways, in alternating order, --repeats times:

- **bare**: the model called as a trainer calls it, `model(input_ids)` over prompt + response, no cache, no
  mask, every position's logits, nothing else (the forward's own speed);
- **recompute**: the command's recompute alone (engine.hf.logprobs.Scorer.recompute: an explicit 4D causal mask,
  explicit positions, FP32 log-softmax, the chosen tokens gathered);
- **check**: the whole command in this process (`rollouts check`: the dump read and checked, the model loaded,
  every row recomputed, the measures with 10,000 bootstrap resamples, the report written).

Each is given in response tokens per second and as a ratio to the bare forward.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import load_contract
from replaytests.inputs.options import DEFAULT_CONTRACT, DEFAULT_MODEL, REPO
from replaytests.inputs.rollouts import SCHEMA

RESULTS = REPO / "benchmarks" / "results"


def synthetic_dump(path: Path, rows: int, prompt: int, length: int, vocab: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as out:
        for index in range(rows):
            ids = rng.integers(0, vocab, size=prompt + length).tolist()
            out.write(json.dumps({"schema": SCHEMA, "id": f"row-{index}", "prompt_ids": ids[:prompt],
                                  "response_ids": ids[prompt:], "logprobs": [-1.0] * length}) + "\n")
    return path


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(args: argparse.Namespace, contract, dump_path: Path) -> dict:
    import torch

    from replaytests.engine.hf.logprobs import Scorer
    from replaytests.inputs.rollouts import read_dump
    from replaytests.outputs.mismatch import Thresholds
    from replaytests.rollouts import check

    dump = read_dump(dump_path)
    scorer = Scorer.load(args.model, contract, args.precision)
    batches = [torch.tensor([list(row.prompt_ids + row.response_ids)]) for row in dump.rows]

    def bare() -> None:
        with torch.inference_mode():
            for ids in batches:
                scorer.model(input_ids=ids, use_cache=False)

    def recompute() -> None:
        check.recompute(scorer, dump)

    def whole(out: Path) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            check.run(check.Request(dump_path, args.model, contract, args.precision, Thresholds(), out))

    seconds = {"bare": [], "recompute": [], "check": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            order = ["bare", "recompute", "check"] if repeat % 2 == 0 else ["check", "recompute", "bare"]
            for name in order:
                call = {"bare": bare, "recompute": recompute,
                        "check": lambda r=repeat: whole(Path(scratch) / f"check-{r}")}[name]
                seconds[name].append(timed(call))
    tokens = dump.tokens
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"tokens": tokens, "seconds": seconds,
            "tokens_per_second": {name: tokens / value for name, value in median.items()},
            "ratio_to_bare": {name: median["bare"] / value for name, value in median.items()}}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# rollouts check beside a bare forward ({s['rows']} rows x {s['length']} response tokens, prompt "
             f"{s['prompt']}, {s['precision']}, {result['platform']})", "",
             "| path | response tokens/s (median of {}) | ratio to bare |".format(s["repeats"]), "|---|---|---|"]
    for name in ("bare", "recompute", "check"):
        lines.append(f"| {name} | {result['tokens_per_second'][name]:,.0f} | {result['ratio_to_bare'][name]:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--length", type=int, default=512, help="response tokens per row")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu-tiny-qwen2-rollouts.json")
    args = parser.parse_args()
    contract = load_contract(args.contract)
    cpu_isa.apply(contract.cpu_isa, f"contract {contract.name}")  # before torch starts, as the command pins it
    from replaytests.engine.backend import resolve
    from replaytests.engine.environment import capture_run
    from replaytests.engine.hf.logprobs import limits
    from replaytests.files import write_atomic, write_json_atomic

    with tempfile.TemporaryDirectory() as scratch:
        dump = synthetic_dump(Path(scratch) / "dump.jsonl", args.rows, args.prompt, args.length,
                              limits(args.model).vocab_size, args.seed)
        result = measure(args, contract, dump)
    result.update(schema="replaytests.benchmarks.rollouts/1", settings={
        "rows": args.rows, "length": args.length, "prompt": args.prompt, "precision": args.precision,
        "repeats": args.repeats, "seed": args.seed, "model": str(args.model), "contract": str(args.contract)},
        platform=f"{cpu_isa.platform_line()}, {contract.cpu_threads} thread(s)",
        environment=capture_run(contract, resolve("hf")))
    write_json_atomic(args.out, result)
    write_atomic(args.out.with_suffix(".md"), markdown(result))
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
