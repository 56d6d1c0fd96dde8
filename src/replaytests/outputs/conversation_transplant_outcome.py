"""The conversation transplant's outcomes (docs/protocol.md §16, "The transplant at turn k"), per cell: the validity
control, per direction the divergent conversations whose recipient, given the donor's whole turn-k K/V, writes the
donor's assistant turn, the earliest turn whose K/V carries the divergence, the controls whose splice took a third
trajectory (where it moved no differing K/V: gated; past the first differing position: a finding), and the divergent
conversations no splice can test; and each place they are shown (an outcome module: outputs/causal.py).

It also holds the two readings the family's panel shares with the report: a conversation's first divergent turn and
why a splice cannot test it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from replaytests.families.registry import FAMILIES, SELF_SPLICES, SPLICES
from replaytests.inputs.gates import FOLLOWS, Gates, splice_gated, splice_thirds
from replaytests.outputs import transplant_outcome
from replaytests.outputs.causal import validity, validity_cell, validity_text
from replaytests.outputs.findings import Findings, Group, Rows
from replaytests.outputs.records import ConversationTurn, Record
from replaytests.outputs.stats import proportion
from replaytests.outputs.tables import Table, fmt_proportion

PAIR = "session~replay"  # the divergence it transplants (the conversation family's headline pair)
TRACKED: tuple[str, ...] = ()  # the history keeps the per-direction outcomes alone
REQUIRED = ("role", "transplants", "turn_splice")  # what an ok record must hold for summarize
# As the transplant's: no rows in the replica table (its replicas are judged in its records' own tests), and the
# history keeps `full`'s donor recovery and (gated) third trajectories per direction.
replica_rows, tracked = transplant_outcome.replica_rows, transplant_outcome.tracked
# What gates.transplant_family judges, as the transplant's: `full`'s donor recovery and its gated third trajectories
# (here: a control's splice that moved no differing K/V)
counts = transplant_outcome.counts


def divergent_turn(record: Record) -> ConversationTurn | None:
    """A conversation record's first turn whose session and replay assistant turns differ, or None."""
    return next((t for t in record.turns if not t.comparisons[PAIR].suffix_equal), None)


def not_testable_reason(turn: ConversationTurn) -> str | None:
    """Why a divergent turn cannot be tested by splicing, or None where it can: the spliced state keeps the
    recipient's boundary logits, so where session and replay choose different first tokens no splice moves that
    choice."""
    metrics = turn.comparisons[PAIR]
    if metrics.first_divergence != 0:
        return None
    return (f"turn {turn.turn}: session and replay choose different first tokens (raw argmax "
            f"{'equal' if metrics.argmax_equal else 'different too'}): a splice keeps the recipient's boundary "
            "logits and cannot move that choice")


def not_testable(records: list[Record], family: str) -> list[list[str]]:
    """[row, reason] of each ok conversation of the family's panel's source (its registry record's `reads`) whose first
    divergent turn no splice can test."""
    return [[r.row, reason] for r in records if r.family in FAMILIES[family].reads and r.ok and r.turns
            and (turn := divergent_turn(r)) is not None and (reason := not_testable_reason(turn))]


@dataclass(frozen=True)
class ConversationTransplantOutcome(transplant_outcome.PanelOutcome):
    """A conversation transplant family's outcomes in one cell, as the transplant's (its rows are conversations, its
    transplants splices; `full`: follows_donor, control_third where no differing K/V moved (gated), and
    control_third_mixed past the first differing position (recorded)), with the carrier turns per direction and each
    ok row."""

    carrier_turn: dict[str, dict[str, int]]
    by_row: list[dict]


def summarize(records: list[Record], family: str, meta: dict | None = None) -> ConversationTransplantOutcome:
    """Counts with Wilson intervals over the family's records of one cell (`records`: the cell's, every family's: the
    conversations no splice can test are the conversation family's)."""
    mine = [r for r in records if r.family == family]
    ok = [r for r in mine if r.ok]
    divergent = [r for r in ok if r.role == "divergent"]
    controls = [r for r in ok if r.role == "control"]

    def third(name: str, moved_none: bool) -> Callable[[Record], bool]:
        return lambda r: any(copied == moved_none for _, copied in splice_thirds(r.turn_splice).get(name, ()))

    return ConversationTransplantOutcome(
        rows=len(mine), excluded=len(mine) - len(ok), divergent=len(divergent), controls=len(controls),
        validity=validity(mine, SELF_SPLICES), not_testable=not_testable(records, family),
        full={name: {"follows_donor": proportion(divergent, lambda r, n=name: r.transplants[n].outcome == FOLLOWS),
                     # over the controls with a splice that moved no differing K/V: the others gate nothing
                     "control_third": proportion([r for r in controls if splice_gated(r.turn_splice).get(name)],
                                                 third(name, True)),
                     "control_third_mixed": proportion(controls, third(name, False))} for name in SPLICES},
        carrier_turn={name: dict(sorted(Counter(_turn(r.turn_splice.carrier_turn.get(name)) for r in divergent)
                                        .items())) for name in SPLICES},
        by_row=[{"row": r.row, "role": r.role, "turn": r.turn_splice.turn,
                 "first_kv_difference": r.turn_splice.first_kv_difference,
                 "first_kv_difference_turn": r.turn_splice.first_kv_difference_turn,
                 "outcome": {name: r.transplants[name].outcome for name in SPLICES},
                 "carrier_turn": {name: r.turn_splice.carrier_turn.get(name) for name in SPLICES}}
                for r in sorted(ok, key=lambda r: (r.role != "divergent", r.row))])


def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Its checks of one family and cell between a baseline run and a new one (outputs/compare.py): the transplant's
    gates over its rows, as the transplant's (transplant_outcome.judge_runs)."""
    transplant_outcome.judge_runs(out, group, base, new, gates, summarize)


def _turn(turn: int | None) -> str:
    return "none" if turn is None else str(turn)


def _carriers(found: dict) -> str:
    return ", ".join(f"turn {turn}: {n}" if turn != "none" else f"none: {n}" for turn, n in found.items()) or "-"


def terminal_lines(family: str, cell: str, t: ConversationTransplantOutcome, gates: Gates) -> list[str]:
    """The outcomes with Wilson 95% intervals and the verdict of the transplant's gates over the family's rows."""
    def each(key: str) -> str:
        return "; ".join(f"{name} {fmt_proportion(v[key])}" for name, v in t.full.items())

    return [f"{family} ({cell}): validity control (self-splices reproduce their own assistant turn): "
            f"{validity_text(t.validity)}",
            f"  recipient given the donor's whole turn-k K/V follows it: {each('follows_donor')}",
            "  earliest turn whose K/V carries the divergence: "
            + "; ".join(f"{name} {_carriers(found)}" for name, found in t.carrier_turn.items()),
            f"  controls with a third trajectory where no differing K/V moved: {each('control_third')}; past the first "
            f"differing position (recorded): {each('control_third_mixed')}",
            f"  gates.{FAMILIES[family].gate_section}: "
            f"{transplant_outcome.gate_text(gates.transplant_family(family, *counts(t)))}",
            f"  not testable (first tokens differ at the divergent turn): {len(t.not_testable)}"
            + "".join(f"; {row}: {reason}" for row, reason in t.not_testable)]


def tables(family: str, cell: str, t: ConversationTransplantOutcome) -> list[Table]:
    """Per direction, the divergent conversations whose recipient follows its donor, their carrier turns and the
    controls' third trajectories; then each row; then the divergent conversations no splice can test."""
    directions = tuple((name, fmt_proportion(v["follows_donor"]), _carriers(t.carrier_turn[name]),
                        fmt_proportion(v["control_third"]), fmt_proportion(v["control_third_mixed"]))
                       for name, v in t.full.items())
    out = [Table(f"{FAMILIES[family].title}, {cell}: {t.divergent} divergent conversations, {t.controls} "
                 "controls", ("recipient<-donor", "follows donor (whole turn-k K/V)", "carrier turn (divergent rows)",
                              "controls: third trajectory, no differing K/V moved",
                              "controls: third trajectory past the first K/V difference"), directions,
                 "Divergent: session and replay write different assistant turns at turn k (their first such turn), "
                 "their first tokens there agreeing; controls agree at every turn and run at the last. The carrier "
                 "turn is the earliest j whose splice of turns 1..j follows the donor. Validity control (each "
                 f"construction's whole turn-k K/V in its own replica reproduces its assistant turn): "
                 f"{validity_cell(t.validity)}.")]
    if t.by_row:
        out.append(Table(f"Conversation transplant, {cell}: each row", (
            "row", "role", "turn k", "first K/V difference (position, turn)",
            *(f"{name}: outcome, carrier turn" for name in t.full)), tuple(
            (r["row"], r["role"], str(r["turn"]),
             "none" if r["first_kv_difference"] is None else f"{r['first_kv_difference']}, turn "
                                                             f"{r['first_kv_difference_turn']}",
             *(f"{r['outcome'][name]}, {_turn(r['carrier_turn'][name])}" for name in t.full))
            for r in t.by_row)))
    if t.not_testable:
        out.append(Table(f"Conversation transplant, {cell}: divergent conversations not testable", ("row", "reason"),
                         tuple((row, reason) for row, reason in t.not_testable)))
    return out
