"""The conversation family in a run's report (docs/report.md, "Conversations"): per cell, turn index and pair, the
rates of a turn's assistant turns that differ, with their Wilson intervals; the re-rendered histories whose ids
differ from the generated ones, with why; every turn's replicas; and whether divergence accumulates (each
conversation's first turn against its last, paired).

A conversation record (families/conversation.py) holds every turn k, each with its own arms and comparisons; its
top-level `arms` and `comparisons` are the last turn's. Here every turn is read: a rate at turn k counts the ok
records that reached turn k. Computed once into report.json; report.md, report.html, summary.md, compare and
tools/readme_tables.py read the same functions.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from replaytests.families.registry import CONVERSATION, FAMILIES
from replaytests.inputs.gates import REPLICA_SUFFIX, bit_exact
from replaytests.outputs.records import Comparison, Record
from replaytests.outputs.shapes import DIVERGENCES, FLAGS
from replaytests.outputs.stats import LEVEL, mcnemar_exact, paired_bootstrap, wilson

FAMILY = FAMILIES[CONVERSATION]
ALPHA = round(1 - LEVEL, 12)  # the significance the accumulation test is read at
# report name: (comparison field, whether the count is of the turns where the field is false), as shapes.FLAGS
MEASURES = {**{name: FLAGS[name] for name in DIVERGENCES},
            "cache_differs": ("cache_exact", True), "logits_differ": ("logits_exact", True)}
HEADLINE = FAMILY.headline  # session~replay (a server's cache against the turn sent again), session~rerendered
ACCUMULATES = "suffix_divergence"  # what the accumulation test reads


def pair_order(pairs) -> list[str]:
    """The headline pairs first, then the family's other pairs as the registry orders them, the replicas last."""
    registry = [f"{a}~{b}" for a, b in FAMILY.pairs]
    rank = {pair: (pair.endswith(REPLICA_SUFFIX), pair not in HEADLINE, registry.index(pair) if pair in registry
                   else len(registry)) for pair in pairs}
    return sorted(pairs, key=lambda p: (*rank[p], p))


def turns_of(record: Record) -> tuple:
    """An ok conversation record's turns (a record written without them: none)."""
    return record.turns or ()


def diverges(comparison: Comparison, name: str = ACCUMULATES) -> bool:
    """Whether a comparison counts under the measure `name` (MEASURES)."""
    field, negate = MEASURES[name]
    return getattr(comparison, field) != negate


def _measured(comps: list[Comparison], name: str) -> bool:
    """A measure is reported only where every comparison measured it (a runtime without K/V records null)."""
    return bool(comps) and all(getattr(c, MEASURES[name][0]) is not None for c in comps)


def _pair(comps: list[Comparison]) -> dict:
    out: dict = {"rows": len(comps)}
    out |= {name: wilson(sum(diverges(c, name) for c in comps), len(comps))
            for name in MEASURES if _measured(comps, name)}
    return out


def reason_kind(reason: str | None) -> str:
    """A re-rendering's reason as the tally counts it: its words before the first colon (`lossy decode`,
    `retokenized`, `template`)."""
    return "not given" if not reason else reason.split(":", 1)[0].strip()


def _rerendered(turns: list) -> dict:
    differ = [t for t in turns if not t.rerendered.ids_equal]
    return {"differ": wilson(len(differ), len(turns)),
            "reasons": dict(Counter(reason_kind(t.rerendered.reason) for t in differ).most_common()),
            "segments": dict(Counter(f"turn {t.rerendered.turn} {t.rerendered.segment}" for t in differ)
                             .most_common())}


def _turn(k: int, ok: list[Record]) -> dict:
    """Turn k over the ok records that reached it."""
    turns = [record.turns[k - 1] for record in ok if len(turns_of(record)) >= k]
    pairs = pair_order({pair for t in turns for pair in t.comparisons})
    labelled = [t.arms["session"].correct for t in turns if "session" in t.arms
                and t.arms["session"].correct is not None]
    return {"turn": k, "rows": len(turns),
            "pairs": {pair: _pair([t.comparisons[pair] for t in turns if pair in t.comparisons]) for pair in pairs},
            "rerendered": _rerendered(turns),
            "session_correct": wilson(sum(labelled), len(labelled)) if labelled else None,
            "session_matches_bank": wilson(sum(t.session_matches_bank for t in turns), len(turns))}


def replicas_hold(record: Record, pair: str) -> bool:
    """A replica pair bit-exact at every turn of the record (a turn lacking it: not)."""
    return bool(turns_of(record)) and all(pair in t.comparisons and bit_exact(t.comparisons[pair])
                                          for t in turns_of(record))


def accumulation(ok: list[Record], pair: str, alpha: float = ALPHA) -> dict:
    """Does `pair` diverge more at a conversation's last turn than at its first? Each record with two turns or
    more, paired by conversation: x = its last turn's assistant turns differ, y = its first's; exact McNemar on
    the discordant conversations (the exact sign test), and the paired difference last - first with its
    bootstrap interval. With too few conversations for any p below alpha, `note` says so: such a test could not
    have found an accumulation."""
    held = [r for r in ok if len(turns_of(r)) >= 2 and all(pair in t.comparisons for t in (r.turns[0], r.turns[-1]))]
    last = [diverges(r.turns[-1].comparisons[pair]) for r in held]
    first = [diverges(r.turns[0].comparisons[pair]) for r in held]
    test = mcnemar_exact(sum(a and not b for a, b in zip(last, first, strict=True)),
                         sum(b and not a for a, b in zip(last, first, strict=True)))
    out = {"rows": len(held), "last_turns": sorted({len(r.turns) for r in held}),
           "first": wilson(sum(first), len(held)), "last": wilson(sum(last), len(held)),
           "difference": paired_bootstrap(last, first), "mcnemar": test, "alpha": alpha,
           "reading": reading(test.b, test.c, test.p, alpha), "note": None}
    if not held:
        out["note"] = "no conversation with two turns or more: not tested"
    elif (best := mcnemar_exact(len(held), 0).p) >= alpha:
        out["note"] = (f"{len(held)} conversation{'s' * (len(held) > 1)} cannot show a difference at alpha {alpha:g} "
                       f"(the smallest p an exact sign test over them gives is {best:.3g}): at least "
                       f"{min_conversations(alpha)} are needed")
    return out


def reading(b: int, c: int, p: float, alpha: float = ALPHA) -> str:
    """The accumulation test in words: b conversations diverge at the last turn only, c at the first only."""
    if p < alpha:
        return "accumulates: more at the last turn" if b > c else "recedes: more at the first turn"
    return "no difference shown" if b + c else "no discordant conversation"


def min_conversations(alpha: float = ALPHA) -> int:
    """The fewest paired conversations whose exact sign test can give a p below alpha."""
    return next(n for n in range(1, 64) if mcnemar_exact(n, 0).p < alpha)


def _cell(records: list[Record], runtime: str) -> dict:
    ok = [r for r in records if r.ok]
    depth = max((len(turns_of(r)) for r in ok), default=0)
    replicas = [pair for pair in FAMILY.replicas if any(pair in t.comparisons for r in ok for t in turns_of(r))]
    accumulated = [pair for pair in pair_order({p for r in ok for t in turns_of(r) for p in t.comparisons})
                   if not pair.endswith(REPLICA_SUFFIX)]
    return {"runtime": runtime, "rows": len(records), "ok": len(ok), "excluded": len(records) - len(ok),
            "turns": [_turn(k, ok) for k in range(1, depth + 1)],
            "replicas": {pair: wilson(sum(replicas_hold(r, pair) for r in ok), len(ok))
                         for pair in replicas},
            "accumulation": {pair: accumulation(ok, pair) for pair in accumulated}}


def build(records: list[Record], runtime: str, order: Sequence[str] = ()) -> dict:
    """cell -> the conversation family's measures in that cell: `runtime` (the backend that ran them, from
    run.json), the rows, per turn index the rates of every pair and the re-rendered mismatches, every replica
    pair exact at every turn, and per pair the accumulation test. Cells in `order` first, then the rest sorted;
    empty where the family did not run."""
    by_cell: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record.family == CONVERSATION:
            by_cell[record.precision].append(record)
    cells = [c for c in order if c in by_cell] + sorted(set(by_cell) - set(order))
    return {cell: _cell(by_cell[cell], runtime) for cell in cells}

