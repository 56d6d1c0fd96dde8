"""Freezing a bank: live-generate each problem to the merge boundary on any backend (`replaytests
freeze`; the bank's cell is BF16 on transformers, physical batch 2, or any cell the backend runs).

The caller pins the contract's CPU instruction set first (cpu_isa.apply) and writes the bank with the
platform the boundaries were generated on (inputs.bank.write_bank): the bank's live re-freeze is a
check only on that platform.
"""

from __future__ import annotations

from pathlib import Path

from replaytests.engine.backend import Backend
from replaytests.engine.protocol import prompt_block
from replaytests.errors import BankError
from replaytests.inputs.bank import BankRow, Problem


def live_boundaries(runtime: Backend, problems: list[Problem], max_positions: int, where: Path) -> list[BankRow]:
    """Each problem's prompt in the model's own tokenizer, as a prompt block, greedy to <|merge|>."""
    caps = runtime.grammar.caps
    longest = max_positions - 3 * (caps.branch + 2) - 1 - caps.suffix_room()
    rows = []
    for problem in problems:
        content = runtime.encode(problem.prompt)
        block = prompt_block(runtime.grammar.delims, content)
        bad = [t for t in content if t in runtime.grammar.delims.all_ids]
        if bad:
            raise BankError(f"{where} (problem {problem.id}): field 'prompt' encodes to delimiter tokens {bad[:5]}")
        if len(block) > longest:
            raise BankError(f"{where} (problem {problem.id}): field 'prompt' is {len(block)} tokens with its "
                            f"delimiters; at most {longest} fit the model's positions with these caps")
        boundary = runtime.live(block)
        rows.append(BankRow(problem.id, boundary.tokens, boundary.roles, problem.expected_answer))
    return rows
