"""The conversation family's own report section (docs/report.md): report.json's `conversations` (per cell, turn by
turn, outputs/conversation_report.py) and its part of every renderer: the replica layer's rows, the fidelity layer's
tables, summary.md's and the terminal's table, report.html's plots; and its checks of a run's records and between
two runs. A report section module: outputs/family_sections.py says what it holds; the family's registry record names
it.
"""

from __future__ import annotations

from replaytests.families.registry import CONVERSATION, FAMILIES
from replaytests.files import lookup
from replaytests.inputs.gates import CONVERSATION_CONTROL, Gates
from replaytests.outputs import conversation_report, plots
from replaytests.outputs.findings import RATES_REASON, Findings, Group, Measure, Rows, ok_records
from replaytests.outputs.records import Record
from replaytests.outputs.shapes import DIVERGENCES, own_comparisons
from replaytests.outputs.stats import INTERVAL, mcnemar_paired
from replaytests.outputs.tables import Table, fmt_proportion

TERMINAL = True  # its summary table is printed after a run too
HEADLINE_SCOPE = "at every turn"  # what the headline table's note says of its pairs
HEADLINE_DIVERGENCES = True


def headline_comparisons(record: Record, pair: str) -> list:
    """What the headline table (outputs/summary.py) reads of a conversation: `pair` at every turn."""
    if record.turns:
        return [t.comparisons[pair] for t in record.turns if pair in t.comparisons]
    return own_comparisons(record, pair)


def build(records: list[Record], runtime: str, cells: tuple[str, ...], pairs: list[tuple[str, str]]) -> dict:
    """Its report.json key, where the run holds a conversation."""
    return {"conversations": found} if (found := conversation_report.build(records, runtime, cells)) else {}


def replica_rows(report: dict) -> list[tuple[str, ...]]:
    """Its rows of the replica layer's table: each replica pair bit-exact at every turn."""
    return [(CONVERSATION, cell, f"{pair} (every turn)", fmt_proportion(exact))
            for cell, found in (report.get("conversations") or {}).items() for pair, exact in found["replicas"].items()]


def fidelity(report: dict) -> tuple[list[Table], list[Table], list[str]]:
    """Its tables in the fidelity layer (each cell's headline pairs, then whether divergence accumulates), those folded
    away (each cell's every pair), and its lines."""
    found = report.get("conversations") or {}
    tables = [_table(cell, turns, conversation_report.HEADLINE) for cell, turns in found.items()]
    return tables + ([_accumulation_table(found)] if found else []), [_table(c, t) for c, t in found.items()], []


CONVERSATION_MEASURES = {"suffix_divergence": "assistant turns differ", "answer_divergence": "answers differ",
                         "correctness_divergence": "correctness flips", "cache_differs": "cache not exact",
                         "logits_differ": "next-token logits not exact"}


def _tally(counts: dict) -> str:
    return "; ".join(f"{name} {n}" for name, n in counts.items()) or "-"


def _table(cell: str, found: dict, pairs: tuple[str, ...] | None = None) -> Table:
    """A cell of the conversation family (outputs/conversation_report.py), one column per turn index: per pair the
    rates of each measure, the re-rendered histories that differ and why, the session's answers; `pairs` the
    headline pairs alone, else every pair."""
    turns = found["turns"]
    shown = pairs or conversation_report.pair_order({p for t in turns for p in t["pairs"]})
    rows = [("conversations (ok / excluded)", *(f"{t['rows']} / {found['excluded']}" for t in turns)),
            *((f"{pair}: {label}", *(fmt_proportion(lookup(t, "pairs", pair, name)) for t in turns))
              for pair in shown for name, label in CONVERSATION_MEASURES.items()),
            ("re-rendered ids differ from the generated", *(fmt_proportion(t["rerendered"]["differ"]) for t in turns)),
            ("why (the first difference's reason)", *(_tally(t["rerendered"]["reasons"]) for t in turns)),
            ("where (the turn and part holding it)", *(_tally(t["rerendered"]["segments"]) for t in turns)),
            ("session answer correct", *(fmt_proportion(t["session_correct"]) for t in turns)),
            ("session assistant turn is the bank's", *(fmt_proportion(t["session_matches_bank"]) for t in turns))]
    name = f"{FAMILIES[CONVERSATION].title}, {cell}, runtime {found['runtime']}" + ("" if pairs else ": every pair")
    return Table(name, ("", *(f"turn {t['turn']}" for t in turns)),
                 tuple(r for r in rows if any(c not in ("-", "") for c in r[1:])),
                 f"Per turn index k, over the ok conversations that reached it: k/n = rate [{INTERVAL} CI]. "
                 f"{CONVERSATION_CONTROL} at turn 1 is the control (one call each: bit-exact). A re-rendered history "
                 "whose ids differ gives the model other input from that token on; its pairs count what a client "
                 "sending text gets. Caches of two histories that differ are compared over the tokens they share.")


def _accumulation_table(conversations: dict) -> Table:
    """Does divergence accumulate? Per cell and pair, each conversation's first turn against its last, paired."""
    rows = []
    for cell, found in conversations.items():
        for pair, a in found["accumulation"].items():
            m = a["mcnemar"]
            test = "-" if not a["rows"] else f"{m.b} / {m.c}, p = {m.p:.3g}"
            rows.append((cell, pair, str(a["rows"]), fmt_proportion(a["first"]), fmt_proportion(a["last"]), test,
                         a["reading"] + (f" ({a['note']})" if a["note"] else "")))
    return Table("Conversations: does divergence accumulate? (first turn against last, paired by conversation)",
                 ("cell", "pair", "conversations", "turn 1: assistant turns differ", "last turn: differ",
                  "last only / first only, exact McNemar p", "reading"), tuple(rows),
                 "Per conversation with two turns or more, whether its assistant turn differs at turn 1 and at its "
                 f"last turn; p: two-sided exact McNemar (the exact sign test on the discordant conversations), read "
                 f"at alpha {conversation_report.ALPHA:g}.")


def _per_turn(turns: list[dict], read) -> str:
    return ", ".join("-" if (p := read(t)) is None else f"{p.k}/{p.n}" for t in turns)


def summary_table(built: dict) -> Table | None:
    """The conversation family's headline pairs per cell (outputs/conversation_report.py): at turns 1, 2, ...
    the conversations whose assistant turns, answers and correctness labels differ, the re-rendered histories whose
    ids differ from the generated ones, and whether divergence accumulates (first turn against last); None where
    the family did not run."""
    found = built.get("conversations") or {}
    rows = []
    for cell, c in found.items():
        turns = c["turns"]
        rerendered = _per_turn(turns, lambda t: t["rerendered"]["differ"])
        for pair in conversation_report.HEADLINE:
            a = c["accumulation"].get(pair)
            rows.append((cell, pair, *(_per_turn(turns, lambda t, n=name, p=pair: t["pairs"].get(p, {}).get(n))
                                       for name in DIVERGENCES),
                         rerendered, "-" if not a or not a["rows"] else
                         f"{a['reading']}, p = {a['mcnemar'].p:.3g}" + (" (too few conversations)" if a["note"]
                                                                            else "")))
    if not rows:
        return None
    return Table("Conversations, turn by turn", ("precision", "pair", "assistant turns differ", "answers differ",
                                                 "correctness flips", "re-rendered ids differ", "first vs last turn"),
                 tuple(rows), "Counts k/n at turns 1, 2, ... (the ok conversations that reached each turn); first vs "
                              "last turn: exact McNemar over the conversations, paired. report.md has every pair, "
                              "the intervals and why re-rendered ids differ.")


def figures(report: dict) -> list[str]:
    """Per headline pair of the conversation family, the share of conversations whose assistant turn differs at
    each turn index: one line per cell (outputs/conversation_report.py), its Wilson interval as a band."""
    found = report.get("conversations") or {}
    depth = max((len(cell["turns"]) for cell in found.values()), default=0)
    if not depth:
        return []
    runtimes = ", ".join(sorted({cell["runtime"] for cell in found.values()}))
    turns = [str(k) for k in range(1, depth + 1)]
    drawn = []
    for pair in conversation_report.HEADLINE:
        series = {name: [lookup(t, "pairs", pair, "suffix_divergence") for t in cell["turns"]]
                  + [None] * (depth - len(cell["turns"])) for name, cell in found.items()}
        if any(series.values()):
            drawn.append(plots.time_plot(
                f"Conversations ({runtimes}), {pair}: conversations whose assistant turn differs at each turn index, "
                f"one line per cell, with {INTERVAL} intervals as bands.", turns, series,
                [f"turn {k}" for k in turns], "turn", "conversations"))
    return drawn


def failing(record: Record, gates: Gates) -> list[str]:
    """The checks an ok conversation fails at every turn (gates.conversation_*): its replicas, the turn-1 control, and
    its headline pairs where the contract requires the cell exact (a report's check of its run's pass,
    report.checked_verdict); a record without turns: none here."""
    family = FAMILIES[CONVERSATION]
    turns = record.turns
    if not turns:
        return []
    replicas = any(gates.conversation_replicas(record, pair).failed for pair in family.replicas
                   if all(pair in t.comparisons for t in turns))
    control = CONVERSATION_CONTROL in turns[0].comparisons and gates.conversation_control(record).failed
    # the turns are judged by the crossing's gate of the cell (a cell the gates do not name is not judged here)
    judged = record.precision in gates.may_diverge
    diverged = judged and any(gates.conversation_turns(record, pair).failed for pair in family.headline
                              if all(pair in t.comparisons for t in turns))
    return [name for name, failed in (("conversation replicas (every turn)", replicas),
                                      ("the conversation control (turn 1)", control),
                                      ("exact-cell assistant turns", diverged)) if failed]


# ---- compare: its checks between a baseline run and a new one ----

def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Its checks of one cell between a baseline run and a new one (outputs/compare.py): its gates at every turn, and
    each headline pair's divergences at each turn index at the rates level."""
    _gates(out, group, base, new, gates)
    _rates(out, group, base, new, alpha)


def _judgements(record: Record, gates: Gates) -> list:
    """A conversation's gates at every turn (gates.conversation_*): each replica pair and the turn-1 control
    bit-exact, and each headline pair's assistant turns where the contract requires the cell exact."""
    family, turns = FAMILIES[CONVERSATION], record.turns or ()
    held = [pair for pair in (*family.replicas, *family.headline) if turns and all(pair in t.comparisons
                                                                                   for t in turns)]
    control = [gates.conversation_control(record)] if turns and CONVERSATION_CONTROL in turns[0].comparisons else []
    return [*(gates.conversation_replicas(record, pair) for pair in held if pair in family.replicas), *control,
            *(gates.conversation_turns(record, pair) for pair in held if pair in family.headline)]


def _gates(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates) -> None:
    """The conversation gates on the new run, at every level (the baseline's count informs): a failure is a
    reason; a record of the family without its turns was never checked, which fails too."""
    def passing(rows: Rows) -> tuple[int, int]:
        ok = ok_records(rows)
        return sum(bool(r.turns) and not any(j.failed for j in _judgements(r, gates)) for r in ok), len(ok)

    counts = passing(new)
    if counts[1]:
        before = passing(base)
        out.lines.append(Measure(group, "every turn: replicas, the turn-1 control, exact-cell turns", counts[1],
                                 before if before[1] else None, counts, None, counts[0] == counts[1]))
    for record in ok_records(new):
        if not record.turns:
            out.reasons.append(f"conversation: {record.label} holds no turns: nothing of it was checked")
        out.reasons += [f"conversation gate: {j.message}" for j in _judgements(record, gates) if j.failed]


def _rates(out: Findings, group: Group, base: Rows, new: Rows, alpha: float) -> None:
    """Each headline pair's divergences at each turn index, paired by row between the runs: exact McNemar, p <
    alpha a finding at the rates level, as the headline families' (_rates)."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys()) if base[row].ok and new[row].ok]
    depth = max((min(len(b.turns or ()), len(n.turns or ())) for b, n in both), default=0)
    cell = "/".join(group)
    for k, pair, name in ((k, pair, name) for k in range(1, depth + 1) for pair in FAMILIES[CONVERSATION].headline
                          for name in DIVERGENCES):
        paired = [(b.turns[k - 1].comparisons[pair], n.turns[k - 1].comparisons[pair]) for b, n in both
                  if min(len(b.turns or ()), len(n.turns or ())) >= k and pair in b.turns[k - 1].comparisons
                  and pair in n.turns[k - 1].comparisons]
        if not paired:
            continue
        x, y = ([conversation_report.diverges(c[i], name) for c in paired] for i in (0, 1))
        test = mcnemar_paired(x, y)
        measure = f"turn {k} {pair} {name.replace('_', ' ')}"
        out.lines.append(Measure(group, measure, len(paired), (sum(x), len(paired)), (sum(y), len(paired)), test.p,
                                 test.p >= alpha))
        if test.p < alpha:
            out.finding("rates", group, f"{RATES_REASON}: {cell} {measure}: baseline {sum(x)}/{len(paired)}, new "
                                        f"{sum(y)}/{len(paired)} (baseline only {test.b}, new only {test.c}), McNemar "
                                        f"p = {test.p:.3g} < {alpha:g}")
