"""Bridge: a live boundary per panel row (the live matrix's live arm), and the incremental cache of its
tokens (the crossing's incremental arm where the live z is the bank row's).

All layers, the boundary logits and the full suffix must be bit-exact.
"""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.engine.protocol import prompt_of
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import evaluate
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record


def run(runtime: Backend, row: BankRow) -> Record:
    def build():
        live = runtime.live(prompt_of(row.tokens, runtime.grammar.delims))
        yield live
        yield runtime.build("incremental", live.tokens)

    return evaluate(runtime, row, FAMILIES["bridge"], build)
