"""`replaytests selftest`: the inputs validated as a run validates them, the shortest bank row, every trial,
the matrix printed and written, the exit code.

Imported by the CLI after the contract's CPU instruction set is pinned (cli._pin): the trials import torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from replaytests.engine import backend
from replaytests.errors import ConfigError
from replaytests.inputs import cpu_isa
from replaytests.inputs.bank import BankRow, read_bank
from replaytests.inputs.cells import BANK_CELL
from replaytests.inputs.contract import Contract
from replaytests.inputs.integrity import verify_inputs
from replaytests.inputs.options import DEFAULT_REPORT_DIR
from replaytests.outputs import rundir
from replaytests.selftest import matrix
from replaytests.selftest.trials import Bench, run_all

BACKEND = "hf"  # the faults reach K/V tensors, masks and positions: a backend with every non-serving capability


def shortest_row(rows: list[BankRow]) -> BankRow:
    """The row the trials run on: the shortest prefix (the first such id), so the selftest stays short."""
    return min(rows, key=lambda row: (row.prefix_len, row.id))


def bench(contract: Contract, model: Path, bank: Path, device: str | None = None) -> Bench:
    """The model, bank and contract checked as a run checks them before any model work, and one runtime
    in the bank's cell."""
    runtime_class = backend.resolve(BACKEND)
    facts = runtime_class.inspect(model, contract, "--model")
    rows = read_bank(bank, facts.grammar, facts.max_positions, contract.caps.suffix_room())
    if not rows:
        raise ConfigError(f"--bank {bank}: holds no row")
    row = shortest_row(rows)
    backend.check_window(facts, row.prefix_len + contract.caps.suffix_room())
    verify_inputs(bank, model, list(facts.grammar.delims.all_ids))
    return Bench(contract, runtime_class.load(model, contract, BANK_CELL, device), row)


def output(out: Path | None, inputs: dict[str, Path]) -> Callable[[], Path]:
    """Where the matrix goes (rundir.output_dir: `out`, or a new directory in the report root reports/)."""
    return rundir.output_dir(out, DEFAULT_REPORT_DIR, inputs, "selftest")


def run(contract: Contract, model: Path, bank: Path, out: Path | None, device: str | None = None) -> int:
    """Every trial on the shortest row; print the matrix, write it into `out`, one line per failing cell."""
    started = time.perf_counter()
    directory = output(out, {"model": model, "bank": bank, "contract": contract.path})
    shared = bench(contract, model, bank, device)
    cells = run_all(shared)
    meta = {"model": str(model), "bank": str(bank), "contract": f"{contract.name} ({contract.path})",
            "row": f"{shared.row.id} ({shared.row.prefix_len} tokens)", "precision": BANK_CELL,
            "platform": cpu_isa.platform_line(),
            "seconds": round(time.perf_counter() - started, 1)}
    print(f"selftest: {meta['model']} under contract {meta['contract']}, row {meta['row']}, {BANK_CELL}, on "
          f"{meta['platform']}")
    print(matrix.table(cells))
    for path in matrix.write(directory(), cells, meta):
        print(f"wrote {path}")
    lines = matrix.failures(cells)
    print("\n".join(lines) if lines else "verdict: PASS (every fault run was detected, every control passed)")
    return matrix.exit_code(cells)
