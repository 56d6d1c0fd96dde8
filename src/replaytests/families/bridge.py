"""Bridge (SPEC §7.3): a fresh live boundary per panel row, and the incremental cache of its tokens.

All layers, the boundary logits and the full suffix must be bit-exact. The panel is chosen from
prefix lengths alone (uniformly spaced order statistics), never from outcomes.
"""

from __future__ import annotations

from replaytests.engine import constructions
from replaytests.engine.runtime import Runtime
from replaytests.families.crossing import evaluate
from replaytests.inputs.bank import BankRow

FAMILY = "bridge"
ARMS = ("live", "incremental")
PAIRS = (("live", "incremental"),)
HEADLINE = ("live~incremental",)
REPLICAS = ()


def panel(rows: list[BankRow], size: int) -> list[BankRow]:
    """`size` rows at uniformly spaced order statistics of prefix length (ties broken by row id)."""
    ordered = sorted(rows, key=lambda r: (r.prefix_len, r.id))
    if size >= len(ordered):
        return ordered
    if size == 1:
        return [ordered[len(ordered) // 2]]
    return [ordered[round(i * (len(ordered) - 1) / (size - 1))] for i in range(size)]


def run(runtime: Runtime, row: BankRow) -> dict:
    def build():
        live = constructions.live(runtime, constructions.prompt_of(row.tokens, runtime))
        yield live
        yield constructions.incremental(runtime, live.tokens)

    return evaluate(runtime, row, FAMILY, ARMS, PAIRS, build)
