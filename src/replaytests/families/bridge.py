"""Bridge: a fresh live boundary per panel row, and the incremental cache of its tokens.

All layers, the boundary logits and the full suffix must be bit-exact.
"""

from __future__ import annotations

from replaytests.engine import constructions
from replaytests.engine.runtime import Runtime
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import evaluate
from replaytests.inputs.bank import BankRow


def run(runtime: Runtime, row: BankRow) -> dict:
    def build():
        live = constructions.live(runtime, constructions.prompt_of(row.tokens, runtime))
        yield live
        yield constructions.incremental(runtime, live.tokens)

    return evaluate(runtime, row, FAMILIES["bridge"], build)
