"""The trainer's recompute mismatch per architecture (issue 48, "Cells"): the rollout families on the tiny random
models of the architecture matrix (tests/unit/test_architectures.py: its families and their seeded models, MoE
among them), per cell, on --rows seeded synthetic rows (engine.checks.synthetic_z).

    python benchmarks/rollout_architectures.py                  # every family, bf16 and fp32, 4 rows
    python benchmarks/rollout_architectures.py --families llama,mixtral --cells bf16 --rows 2

For each family and cell: the live~prefill pair of both rollout families pooled (outputs/mismatch.run_measures:
tokens bitwise equal, mean abs(delta logp) and the k3 estimate of KL per token with intervals over rows, the
max), and whether the control (live~incremental) held on every row. A family whose physical-batch copies desync
is reported as such (its rows fail closed). Random weights: the numbers say how each architecture's kernels
split one prefill from one token per call, not how a trained model's distribution does.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import load_contract
from replaytests.inputs.options import DEFAULT_CONTRACT, REPO

RESULTS = REPO / "benchmarks" / "results"
MATRIX = REPO / "tests" / "unit" / "test_architectures.py"


def _matrix():
    """The architecture matrix's families and model builder, from its test module (one definition)."""
    spec = importlib.util.spec_from_file_location("architecture_matrix", MATRIX)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(matrix, family: str, cell: str, rows: int, contract) -> dict:
    import numpy as np

    from replaytests.engine import checks
    from replaytests.engine.hf.adapter import load_tokenizer
    from replaytests.engine.protocol import Delimiters
    from replaytests.families.registry import ROLLOUT_FAMILIES
    from replaytests.inputs.bank import BankRow
    from replaytests.inputs.gates import ROLLOUT_RECOMPUTE
    from replaytests.outputs.mismatch import Scored, run_measures

    tokenizer = load_tokenizer(REPO / "fixtures" / "models" / "tiny-qwen2")
    runtime = matrix.rollout_runtime(family, cell, contract, tokenizer, Delimiters.resolve(tokenizer))
    from replaytests.families.registry import FAMILIES

    scored, excluded, control = [], [], True
    for seed in range(rows):
        z = checks.synthetic_z(runtime, seed=seed)
        row = BankRow(f"{family}-{seed}", z, runtime.grammar.parse(z, f"{family} row {seed}"), None)
        for name in ROLLOUT_FAMILIES:
            record = FAMILIES[name].run(runtime, row, contract.settings["rollout"])
            if not record.ok:
                excluded.append(record.reason)
                continue
            control &= bool(record.comparisons["live~incremental"].logprobs_exact)
            a, b = (record.arms[arm] for arm in ROLLOUT_RECOMPUTE.split("~"))
            scored.append(Scored(f"{row.id}/{name}", np.asarray(a.suffix), np.asarray(a.logprobs, dtype=np.float64),
                                 np.asarray(b.logprobs, dtype=np.float32)))
    if not scored:
        return {"excluded": len(excluded), "reason": excluded[0] if excluded else None}
    run = run_measures(scored)
    return {"rows": len(scored), "excluded": len(excluded), "control_exact": control, "tokens": run.tokens,
            "bitwise_equal": run.bitwise_equal.to_json(), "abs_delta_mean": run.abs_delta_mean.to_json(),
            "k3": run.k3.to_json(), "abs_delta_max": run.abs_delta_max}


def _interval(value: dict) -> str:
    return f"{value['estimate']:.3g} [{value['ci_low']:.3g}, {value['ci_high']:.3g}]"


def markdown(result: dict) -> str:
    lines = [f"# the trainer's recompute (live~prefill) per architecture ({result['rows']} synthetic rows x 2 rollout "
             f"families, rollout.length {result['length']}, {result['platform']})", "",
             "| family | moe | cell | rows | bitwise equal (share) | mean abs(d) nats | k3 per token | max abs(d) | "
             "control exact |", "|---|---|---|---|---|---|---|---|---|"]
    for (family, cell), m in result["measured"].items():
        moe = "yes" if family in result["moe"] else ""
        if "tokens" not in m:
            lines.append(f"| {family} | {moe} | {cell} | 0 ({m['excluded']} excluded: {m['reason']}) | | | | | |")
            continue
        lines.append(f"| {family} | {moe} | {cell} | {m['rows']} | {_interval(m['bitwise_equal'])} | "
                     f"{_interval(m['abs_delta_mean'])} | {_interval(m['k3'])} | {m['abs_delta_max']:.3g} | "
                     f"{'yes' if m['control_exact'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=None, help="comma-separated; default: every family of the matrix")
    parser.add_argument("--cells", default="bf16,fp32")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS / "rollout-architectures.json")
    args = parser.parse_args()
    contract = load_contract(DEFAULT_CONTRACT)
    cpu_isa.apply(contract.cpu_isa, f"contract {contract.name}")  # before torch starts, as a run pins it
    from replaytests.files import write_atomic, write_json_atomic

    matrix = _matrix()
    families = args.families.split(",") if args.families else list(matrix.FAMILIES)
    measured = {(family, cell): measure(matrix, family, cell, args.rows, contract)
                for family in families for cell in args.cells.split(",")}
    result = {"schema": "replaytests.benchmarks.rollout-architectures/1", "rows": args.rows,
              "length": contract.settings["rollout"]["length"], "platform": f"{cpu_isa.platform_line()}, "
              f"{contract.cpu_threads} thread(s)",
              "moe": [f for f in families if "experts" in " ".join(matrix.FAMILIES.get(f, {}))],
              "measured": measured}
    rows = [{"family": f, "cell": c, **m} for (f, c), m in measured.items()]
    write_json_atomic(args.out, result | {"measured": rows})
    write_atomic(args.out.with_suffix(".md"), markdown(result))
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
