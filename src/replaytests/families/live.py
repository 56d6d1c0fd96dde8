"""Live matrix: generate each problem live to the boundary, then replay its z by prefill.

Four arms per row and cell: live, a second independent live generation (live replica), prefill
of the live z, and a second prefill. Every arm is continued by the shared suffix decoder.
"""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.engine.protocol import prompt_of
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import evaluate
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record


def run(runtime: Backend, row: BankRow) -> Record:
    prompt_block = prompt_of(row.tokens, runtime.grammar.delims)

    def build():
        live = runtime.live(prompt_block)
        yield live
        yield runtime.live(prompt_block, "live_replica")
        yield runtime.build("prefill", live.tokens)
        yield runtime.build("prefill_replica", live.tokens)

    return evaluate(runtime, row, FAMILIES["live"], build)
