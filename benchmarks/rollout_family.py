"""The rollout families beside the crossing family, per row, and the family's recompute arm beside a bare forward
call over the same tokens (issue 48, "Speed"): seconds per row, side by side, in one run.

    python benchmarks/rollout_family.py                      # embedded tiny model, 8 rows, bf16 and fp32
    python benchmarks/rollout_family.py --model "$(replaytests models prepare smollm2)" \\
        --bank fixtures/banks/smollm2.jsonl --contract contracts/cpu-smollm2.yaml --rows 4 \\
        --out benchmarks/results/cpu-smollm2-rollout-family.json

Not a timed test. For each cell, on --rows bank rows (spaced by prefix length), in alternating order,
--repeats times, each with a fresh arms cache (no family reuses another's boundaries):
- **crossing**: families.crossing.run (incremental and prefill of z, each with a replica, four suffixes);
- **rollout**, **rollout_sampled**: the family's run (six arms of `rollout.length` tokens, the measures);
- **recompute**: the family's trainer arm alone (Runtime.replay("prefill"): one call over z + response, FP32
  log-softmax, the chosen tokens gathered, the state's checks);
- **bare**: the model called once over z + response as a trainer calls it (model(input_ids), every
  position's logits, no mask, no cache), with the contract's physical batch.
Ratios: each family per row over the crossing's; the recompute over the bare forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import load_contract
from replaytests.inputs.options import DEFAULT_BANK, DEFAULT_CONTRACT, DEFAULT_MODEL, REPO

RESULTS = REPO / "benchmarks" / "results"


def measure(args: argparse.Namespace, contract, cell: str) -> dict:
    import torch

    from replaytests.engine.arms import Arms
    from replaytests.engine.hf.runtime import Runtime
    from replaytests.families.panels import spaced
    from replaytests.families.registry import FAMILIES
    from replaytests.inputs.bank import BankRow

    runtime = Runtime.load(args.model, contract, cell)
    lines = [json.loads(line) for line in args.bank.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = spaced([BankRow(r["id"], r["tokens"], r["roles"], r.get("expected_answer")) for r in lines], args.rows)
    settings = contract.settings["rollout"] | ({"length": args.length} if args.length else {})
    seconds: dict[str, list[float]] = {name: [] for name in ("crossing", "rollout", "rollout_sampled", "recompute",
                                                              "bare")}
    for repeat in range(args.repeats):
        for row in rows:
            response = FAMILIES["rollout"].run(runtime, row, settings).arms["live"].suffix
            ids = torch.tensor([row.tokens + list(response)] * runtime.batch)

            def bare(ids=ids) -> None:
                with torch.inference_mode():
                    runtime.model(input_ids=ids, use_cache=False)

            calls = {"crossing": lambda row=row: FAMILIES["crossing"].run(runtime, row),
                     "rollout": lambda row=row: FAMILIES["rollout"].run(runtime, row, settings),
                     "rollout_sampled": lambda row=row: FAMILIES["rollout_sampled"].run(runtime, row, settings),
                     "recompute": lambda row=row, r=list(response): runtime.replay("prefill", row.tokens, r),
                     "bare": bare}
            order = list(calls) if repeat % 2 == 0 else list(reversed(calls))
            for name in order:
                runtime.arms = Arms()
                started = time.perf_counter()
                calls[name]()
                seconds[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"rows": [r.id for r in rows], "seconds_per_row": median, "samples": seconds,
            "ratio_to_crossing": {name: median[name] / median["crossing"]
                                  for name in ("crossing", "rollout", "rollout_sampled")},
            "recompute_over_bare": median["recompute"] / median["bare"]}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [f"# rollout families beside the crossing, per row ({s['rows']} rows, rollout.length {s['length']}, "
             f"physical batch {s['batch']}, {result['platform']})", "",
             "| cell | crossing s/row | rollout s/row (ratio) | rollout_sampled s/row (ratio) | recompute / bare |",
             "|---|---|---|---|---|"]
    for cell, m in result["cells"].items():
        per, ratio = m["seconds_per_row"], m["ratio_to_crossing"]
        lines.append(f"| {cell} | {per['crossing']:.3f} | {per['rollout']:.3f} ({ratio['rollout']:.2f}) | "
                     f"{per['rollout_sampled']:.3f} ({ratio['rollout_sampled']:.2f}) | "
                     f"{per['recompute']:.4f} / {per['bare']:.4f} = {m['recompute_over_bare']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--bank", type=Path, default=DEFAULT_BANK)
    parser.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT)
    parser.add_argument("--cells", default="bf16,fp32")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--length", type=int, default=None, help="rollout tokens. Default: the contract's")
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu-tiny-qwen2-rollout-family.json")
    args = parser.parse_args()
    contract = load_contract(args.contract)
    cpu_isa.apply(contract.cpu_isa, f"contract {contract.name}")  # before torch starts, as a run pins it
    from replaytests.engine.backend import resolve
    from replaytests.engine.environment import capture_run
    from replaytests.files import write_atomic, write_json_atomic

    result = {"schema": "replaytests.benchmarks.rollout-family/1",
              "cells": {cell: measure(args, contract, cell) for cell in args.cells.split(",")},
              "settings": {"rows": args.rows, "repeats": args.repeats,
                           "length": args.length or contract.settings["rollout"]["length"],
                           "batch": contract.physical_batch, "model": str(args.model), "bank": str(args.bank),
                           "contract": str(args.contract)},
              "platform": f"{cpu_isa.platform_line()}, {contract.cpu_threads} thread(s)",
              "environment": capture_run(contract, resolve("hf"))}
    write_json_atomic(args.out, result)
    write_atomic(args.out.with_suffix(".md"), markdown(result))
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
