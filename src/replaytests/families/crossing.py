"""Fixed-prefix crossing: one frozen z per row, incremental x prefill, each with a replica.

Run once per cell; every cell consumes the same integer tokens, roles, positions and padding.
"""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import evaluate
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record

FAMILY = FAMILIES["crossing"]


def run(runtime: Backend, row: BankRow) -> Record:
    """The ledger record of one row at the runtime's cell."""
    return evaluate(runtime, row, FAMILY,
                    lambda: (runtime.build(arm, row.tokens) for arm in FAMILY.arms))
