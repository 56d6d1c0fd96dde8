"""Freezing a bank: live-generate each problem to the merge boundary at BF16 (physical batch 2).

The manifest records the platform the boundaries were generated on (platforms.PLATFORM): the
bank's live re-freeze is a check only on that platform. The caller pins the contract's CPU
instruction set first (cpu_isa.apply).
"""

from __future__ import annotations

from pathlib import Path

from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import constructions, environment
from replaytests.engine.hf.runtime import Runtime
from replaytests.engine.protocol import prompt_block
from replaytests.errors import BankError
from replaytests.inputs import platforms
from replaytests.inputs.bank import BankRow, read_problems, write_bank
from replaytests.inputs.cells import BANK_CELL
from replaytests.inputs.contract import load_contract


def freeze(model_dir: Path, problems_path: Path, contract_path: Path, out: Path) -> list[BankRow]:
    contract = load_contract(contract_path)
    problems = read_problems(problems_path)
    runtime = Runtime.load(model_dir, contract, BANK_CELL)
    caps = contract.caps
    longest = hf_adapter.max_positions(runtime.model) - 3 * (caps.branch + 2) - 1 - caps.suffix_room()
    rows = []
    for problem in problems:
        content = runtime.tokenizer.encode(problem.prompt, add_special_tokens=False)
        block = prompt_block(runtime.grammar.delims, content)
        bad = [t for t in content if t in runtime.grammar.delims.all_ids]
        if bad:
            raise BankError(f"{problems_path} (problem {problem.id}): field 'prompt' encodes to delimiter "
                            f"tokens {bad[:5]}")
        if len(block) > longest:
            raise BankError(f"{problems_path} (problem {problem.id}): field 'prompt' is {len(block)} tokens "
                            f"with its delimiters; at most {longest} fit the model's positions with these caps")
        boundary = constructions.live(runtime, block)
        rows.append(BankRow(problem.id, boundary.tokens, boundary.roles, problem.expected_answer))
    platform = platforms.platform_of(environment.capture(contract, str(runtime.device), runtime.model))
    write_bank(out, rows, model_dir, runtime.grammar, contract, BANK_CELL, platform)
    return rows
