"""The serving family's premise read from the ledger (families/serving.py): what the engine itself counted
for each comparison. A prefix hit is evidence only where it reused a block the live request wrote while
decoding, a chunked prefill only where the scheduler split it, a fresh prefill only where it read nothing
from the prefix cache. Reads records only (no engine), so the report and the summary share it.
"""

from __future__ import annotations

import statistics

from replaytests.families.registry import SERVING
from replaytests.outputs.records import Record, Served
from replaytests.outputs.stats import proportion

FAMILY = SERVING
FRESH = ("live_replica", "prefill", "prefill_replica", "chunked", "batched")  # requests on an emptied cache


def _counts(values: list[int]) -> dict:
    """n, median, min and max of a list of token or step counts (null where it is empty)."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def _served(record: Record, arm: str) -> Served:
    return record.arms[arm].served


def premise(records: list[Record]) -> dict:
    """Per cell, over the ok serving records: hits that reused a live-decoded block (Wilson), the
    tokens each hit read from the cache and those past the prompt block's full blocks (the live-decoded
    part), chunked prefills the scheduler split and their step counts, and fresh requests that read the
    cache (none, where the reset took)."""
    out = {}
    for cell in sorted({r.precision for r in records if r.family == FAMILY}):
        ok = [r for r in records if r.family == FAMILY and r.precision == cell and r.ok]
        hits = [r.prefix_hit for r in ok]
        steps = [_served(r, "chunked").prefill_steps for r in ok]
        out[cell] = {
            "rows": len(ok),
            "hit_covers_decode": proportion(hits, lambda h: h.covers_decode),
            "hit_cached_tokens": _counts([h.cached_tokens for h in hits]),
            "hit_past_prompt_block": _counts([h.cached_tokens - h.prompt_block_tokens for h in hits]),
            "chunked_split": proportion(steps, lambda n: (n or 0) >= 2),
            "chunked_steps": _counts([n for n in steps if n is not None]),
            "fresh_read_cache": sorted(r.row for r in ok if any(_served(r, arm).cached_tokens
                                                                for arm in FRESH if arm in r.arms)),
        }
    return out
