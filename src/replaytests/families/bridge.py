"""Bridge (SPEC §7.3): a fresh live boundary per panel row, and the incremental cache of its tokens.

All layers, the boundary logits and the full suffix must be bit-exact. The panel is chosen from
prefix lengths alone (uniformly spaced order statistics), never from outcomes.
"""

from __future__ import annotations

from replaytests import constructions, ledger
from replaytests.bank import BankRow
from replaytests.boundary import check_same_state, check_storage_isolated
from replaytests.decoder import decode_suffix
from replaytests.errors import FailClosed
from replaytests.families.crossing import arm_record, compare_arms
from replaytests.protocol import PROMPT
from replaytests.runtime import Runtime

FAMILY = "bridge"
ARMS = ("live", "incremental")


def panel(rows: list[BankRow], size: int) -> list[BankRow]:
    """`size` rows at uniformly spaced order statistics of prefix length (ties broken by row id)."""
    ordered = sorted(rows, key=lambda r: (r.prefix_len, r.id))
    if size >= len(ordered):
        return ordered
    if size == 1:
        return [ordered[len(ordered) // 2]]
    return [ordered[round(i * (len(ordered) - 1) / (size - 1))] for i in range(size)]


def run(runtime: Runtime, row: BankRow) -> dict:
    base = {"schema": ledger.SCHEMA, "family": FAMILY, "row": row.id, "precision": runtime.precision,
            "expected_answer": row.expected_answer}
    prompt_block = row.tokens[: row.roles.index(PROMPT + 1)]
    where = f"bridge row {row.id} ({runtime.precision})"
    runtime.activate()
    try:
        live = constructions.live(runtime, prompt_block)
        boundaries = {"live": live, "incremental": constructions.incremental(runtime, live.tokens)}
        check_same_state(list(boundaries.values()), where)
        check_storage_isolated(list(boundaries.values()), where)
        suffixes = {arm: decode_suffix(runtime, boundaries[arm]) for arm in ARMS}
    except FailClosed as exc:
        return base | {"status": "excluded", "prefix_len": None, "reason": f"{type(exc).__name__}: {exc}"}
    arms = {arm: arm_record(boundaries[arm], suffixes[arm], row.expected_answer) for arm in ARMS}
    return base | {"status": "ok", "prefix_len": len(live.tokens), "arms": arms,
                   # At the bank's precision and caps, live generation must re-freeze the same z.
                   "z_matches_bank": live.tokens == row.tokens,
                   "comparisons": compare_arms([ARMS], boundaries, suffixes, arms)}
