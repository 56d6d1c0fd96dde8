"""The contract's gates (what each family must show) and the one way they are judged.

`Gates` is the typed form of a contract's `gates:` section. Its methods turn ledger records into
Judgements, which the conformance tests, `replaytests compare` and the run's verdict all read:

- pass: the check holds;
- recorded: the check does not hold, and the contract allows it or the artifact it was checked
  against comes from another platform; the finding is data, reported in the verdict;
- fail: the check does not hold and nothing allows it.

Each judged quantity is defined once here, on the ledger format alone (no engine import): a replica
pair is a comparison `X~X_replica`, and a pair is bit-exact when its cache, boundary logits and
suffix all are.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from replaytests.outputs.records import Comparison, Record, TurnSplice

BIT_EXACT = ("cache_exact", "logits_exact", "suffix_equal")
# The rollout families' control and recompute pairs, and the conversation family's control (at turn 1, one call each)
ROLLOUT_CONTROL, ROLLOUT_RECOMPUTE = "live~incremental", "live~prefill"
CONVERSATION_CONTROL = "session~replay"
REPLICA_SUFFIX = "_replica"
FOLLOWS, THIRD = "follows_donor", "third"
# A transplant gate's key -> its value that allows no miss: there, one row's miss fails (Gates.transplant_row)
_NO_MISS = {"donor_recovery": 1, "controls_third_trajectory": 0}


# The levels a change between two runs is judged at, strictest first (outputs/compare.py): a gate at a
# level fails on findings at that level and every coarser one.
LEVELS = ("bits", "trajectories", "rates")


def gated(level: str, gate: str) -> bool:
    """Whether a finding at `level` fails a gate at `gate`."""
    return LEVELS.index(level) >= LEVELS.index(gate)


@dataclass(frozen=True)
class Judgement:
    outcome: Literal["pass", "recorded", "fail"]
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"


PASS = Judgement("pass")


def inexact(metrics: Comparison) -> list[str]:
    """The bit-exactness fields (cache, logits, suffix; and every suffix step's logits where a serving
    engine recorded them, `steps_exact`) that are not true for one comparison. A cache the backend does
    not expose is recorded as null (not measured): it is not counted either way."""
    names = (*BIT_EXACT, *(name for name in ("steps_exact", "logprobs_exact") if getattr(metrics, name) is not None))
    return [name for name in names if getattr(metrics, name) is not True and not unmeasured(metrics, name)]


def unmeasured(metrics: Comparison, name: str = "cache_exact") -> bool:
    """Whether a comparison records its caches as not measured (a backend without K/V tensors)."""
    return name == "cache_exact" and metrics.cache_exact is None


def bit_exact(metrics: Comparison) -> bool:
    return not inexact(metrics)


def replica_pairs(record: Record) -> list[str]:
    """The record's replica comparisons (`X~X_replica`)."""
    return [pair for pair in record.comparisons if pair.endswith(REPLICA_SUFFIX)]


def replicas_exact(record: Record) -> bool:
    """Every replica pair of the record bit-exact in cache, logits and suffix. A record that carries no
    replica pair is not: a check over no comparison is no pass (outputs.shapes.replicas_hold also wants
    each pair the record's family compares)."""
    pairs = replica_pairs(record)
    return bool(pairs) and all(bit_exact(record.comparisons[pair]) for pair in pairs)


def differences(metrics: Comparison, pair: str) -> list[str]:
    """One phrase per quantity of a pair that is not bit-exact, with its size or index."""
    out = []
    if metrics.cache_exact is False:
        out.append(f"{pair} caches differ (K rel L2 {metrics.k_rel_l2:.3g}, max |dK| {metrics.k_max_abs:.3g}; "
                   f"V rel L2 {metrics.v_rel_l2:.3g}, max |dV| {metrics.v_max_abs:.3g})")
    if not metrics.logits_exact:
        out.append(f"{pair} boundary logits differ (max |d| {metrics.logits_max_abs:.3g})")
    if not metrics.suffix_equal:
        margins = metrics.margins_at_divergence
        out.append(f"{pair} suffixes diverge at suffix index {metrics.first_divergence} "
                   f"(top-1 minus top-2 margins {None if margins is None else list(margins)})")
    elif metrics.steps_exact is False:
        steps_max_abs = float("nan") if metrics.steps_max_abs is None else metrics.steps_max_abs
        out.append(f"{pair} suffix logits differ from step {metrics.steps_first_difference} on (max |d| "
                   f"{steps_max_abs:.3g}), the tokens do not")
    if metrics.logprobs_exact is False:
        out.append(f"{pair} log-probabilities differ: {_mismatch(metrics)}")
    return out


def _mismatch(metrics: Comparison) -> str:
    """A rollout pair's mismatch measures in one phrase."""
    if not metrics.logprob_tokens:
        return "no response token in common"
    first = metrics.first_exceeding
    return (f"{metrics.logprob_tokens_equal}/{metrics.logprob_tokens} tokens bitwise equal, max |delta logp| "
            f"{metrics.abs_dlogp_max:.3g}, k3 {metrics.k3:.3g} per token, {metrics.outside_bounds} outside the ratio "
            f"bounds, {'none' if first is None else f'first at position {first}'} past the |delta logp| threshold")


def _stale_turns(turns, pair: str) -> str | None:
    """A conversation pair's requests that read the prefix cache where it had been emptied (every construction
    but the session, and the session at turn 1), from the engine's own counters; None where none did (or the
    backend keeps no counters)."""
    stale = [f"turn {t.turn} {arm} read {t.arms[arm].served.cached_tokens} tokens" for t in turns
             for arm in pair.split("~") if t.arms[arm].served is not None and t.arms[arm].served.cached_tokens
             and (t.turn == 1 or not arm.startswith("session"))]
    return f"{pair}: requests on an emptied prefix cache read from it: {', '.join(stale)}" if stale else None


def _at_points(record: Record, judge) -> Judgement:
    """A check judged at every point of a sweep record (its comparisons there), as one judgement: the worst outcome,
    its message naming each point that has it. A record without points is no pass: nothing of it was checked."""
    if not record.sweep:
        return Judgement("fail", f"{record.title}: no sweep point: nothing of it was checked")
    found = [(point, judge(dataclasses.replace(record, comparisons=point.comparisons))) for point in record.sweep]
    for outcome in ("fail", "recorded"):
        if hit := [f"at {p.axis} {p.value} ({p.edge or 'the whole prefix'}): {j.message}" for p, j in found
                   if j.outcome == outcome]:
            return Judgement(outcome, f"{len(hit)} of {len(found)} points: {'; '.join(hit)}")
    return PASS


def _bounds(bounds) -> tuple:
    """A counter's bounds as written: [low, high] (high None: unbounded), or a number: at least that."""
    if isinstance(bounds, (int, float)) and not isinstance(bounds, bool):
        return bounds, None
    low, high = bounds
    return low, high


def _within(value, bounds) -> bool:
    low, high = _bounds(bounds)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value \
        and (high is None or value <= high)


def point_premise(point) -> tuple[list[str], list[str]]:
    """What an edge sweep point's engine counters say (its `served`: arm -> counters, docs/ledger.md): each arm's
    `requires` (counter -> [low, high]: what the construction it names must count; outside it, a broken measurement:
    a request on an emptied cache that read from it) and `premise` (counter -> [low, high]: what the point needs to
    cross its edge at all; outside it, the point is vacuous: a hit that read no block, a prefill in one chunk). A high
    of None is unbounded; a number alone is a least value. Returns (broken, vacuous), each a phrase per counter,
    naming the point and the arm; a point without counters (a backend that calls its constructions itself) has
    nothing to prove."""
    where = f"at {point.axis} {point.value} ({point.edge or 'the whole prefix'})"
    found: dict[str, list[str]] = {"requires": [], "premise": []}
    for arm, served in sorted((point.served or {}).items()):
        for kind, out in found.items():
            for counter, bounds in (served.get(kind) or {}).items():
                if not _within(served.get(counter), bounds):
                    low, high = _bounds(bounds)
                    wanted = f"{low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
                    out.append(f"{where}: {arm} counted {counter} {served.get(counter)}, "
                               f"{'its construction requires' if kind == 'requires' else 'the point needs'} {wanted}")
    return found["requires"], found["premise"]


def splice_thirds(splice: TurnSplice) -> dict[str, list[tuple[int, bool]]]:
    """Per direction of a conversation transplant (a record's `turn_splice`), each turn j whose splice of turns 1..j
    took a third trajectory, and whether that splice moved no differing K/V (it ends at or before the first position
    whose K/V differ between session and replay: the recipient's own values, copied; a third trajectory there is what
    gates.transplant.controls_third_trajectory bounds, one past it a finding)."""
    differ = splice.first_kv_difference
    return {name: [(step.turn, differ is None or step.end <= differ) for step in curve if step.outcome == THIRD]
            for name, curve in splice.curves.items()}


def splice_gated(splice: TurnSplice) -> dict[str, bool]:
    """Per direction of a conversation transplant, whether any of its splices moved no differing K/V (the splices
    gates.transplant.controls_third_trajectory judges): where session and replay's K/V differ before the first turn
    ends, none did, and a control's third-trajectory check holds nothing."""
    differ = splice.first_kv_difference
    return {name: any(differ is None or step.end <= differ for step in curve) for name, curve in splice.curves.items()}


def _required(required: bool, message: str, gate: str) -> Judgement:
    if required:
        return Judgement("fail", f"{message} (gate {gate}: required)")
    return Judgement("recorded", f"{message} (gate {gate}: false, recorded)")


class ControlGate(NamedTuple):
    """A family's control as its gates judge it (registry Family.control)."""

    pair: str
    gate: str  # `section.key`
    required: bool  # whether the pair must be bit-exact (false: a difference is recorded)


@dataclass(frozen=True)
class Gates:
    """The typed `gates:` section (docs/contract.md)."""

    audit_reproduce: bool
    # the family whose divergence gate is the contract's per cell (the crossing: registry.DIVERGENCE_REFERENCE)
    reference: str
    sections: dict[str, str] = dataclasses.field(default_factory=dict)  # family -> the gate section it is judged by
    controls: dict[str, ControlGate] = dataclasses.field(default_factory=dict)  # family -> its control
    # family -> the values of the gate section it is judged by (its registry record's gates_schema), which its own
    # judgements read by key: a rollout's k3_max, the transplant's donor_recovery (None: recorded, not gated)
    settings: dict[str, dict] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_settings(cls, gates: dict, sections: dict[str, str], reference: str,
                      controls: dict[str, tuple[str, str]]) -> Gates:
        """From a validated `gates:` mapping with every default filled in; `sections`: family -> the gate section it
        is judged by (its registry record's gate_section, which families that judge alike share); `reference`: the
        family whose divergence gate is the contract's per cell; `controls`: family -> (its control pair, the key of
        its gate section that says whether it must be exact), from its registry record's `control`."""
        return cls(
            audit_reproduce=gates["audit"]["reproduce"],
            reference=reference,
            sections=dict(sections),
            controls={family: ControlGate(pair, f"{sections[family]}.{key}", gates[sections[family]][key])
                      for family, (pair, key) in controls.items()},
            settings={family: dict(gates[section]) for family, section in sections.items() if section in gates},
        )

    def _each(self, key: str) -> dict:
        """family -> its gate section's `key`, for each family whose section has it."""
        return {family: found[key] for family, found in self.settings.items() if key in found}

    @functools.cached_property  # read per record by the judgements and the report: built once
    def replicas_exact(self) -> dict[str, bool]:
        """family -> whether its replicas must be bit-exact (its gate section's replicas_exact)."""
        return self._each("replicas_exact")

    @functools.cached_property
    def suffix_divergence_allowed(self) -> dict[str, dict[str, bool]]:
        """family -> cell -> whether its suffixes may diverge (its gate section's suffix_divergence_allowed)."""
        return self._each("suffix_divergence_allowed")

    def setting(self, family: str, key: str) -> tuple[object, str]:
        """A key of the gate section `family` is judged by: its value and its name as a message says it
        (`section.key`)."""
        return self.settings[family][key], f"{self.sections.get(family, family)}.{key}"

    @property
    def may_diverge(self) -> dict[str, bool]:
        """cell -> whether its suffixes may diverge, by the reference family's gate (the contract's per cell)."""
        return self.suffix_divergence_allowed[self.reference]

    def replicas(self, record: Record, pair: str) -> Judgement:
        """A replica pair (layer 1): bit-exact, unless gates.<its family's section>.replicas_exact is false."""
        return self._replicas(record, differences(record.comparisons[pair], pair))

    def _replicas(self, record: Record, problems: list[str]) -> Judgement:
        if not problems:
            return PASS
        section = self.sections.get(record.family, record.family)
        return _required(self.replicas_exact.get(record.family, True), f"{record.title}: {'; '.join(problems)}",
                         f"{section}.replicas_exact")

    def replicas_at_every_step(self, record: Record, pair: str) -> Judgement:
        """A replica pair wherever the record holds it (layer 1, any family): at every turn of a conversation, at every
        point of an edge sweep, else its one comparison."""
        if record.turns is not None:
            return self.conversation_replicas(record, pair)
        if record.sweep is not None:
            return self.sweep_replicas(record, pair)
        return self.replicas(record, pair)

    def control(self, record: Record) -> Judgement:
        """Its family's control pair (layer 3; registry Family.control: the bridge's live~incremental, a rollout's
        teacher-forced replay on the live schedule): the same calls on both sides, so bit-exact in every layer, the
        logits and the suffix (a rollout's every log-probability); else the measurement itself is broken (a failure
        where its gate requires it, the default; recorded where not)."""
        control = self.controls[record.family]
        problems = differences(record.comparisons[control.pair], control.pair)
        if not problems:
            return PASS
        return _required(control.required, f"{record.title}: {'; '.join(problems)}", control.gate)

    def control_pair(self, record: Record) -> str | None:
        """The control pair an ok record holds (its family's), None where its family has none or it lacks it."""
        control = self.controls.get(record.family)
        return control.pair if control is not None and control.pair in record.comparisons else None

    def rollout_recompute(self, record: Record) -> Judgement:
        """The trainer's recompute (live~prefill) against the rollout gates: the k3 estimate per token and the
        share of tokens with the ratio outside the bounds, each within its bound where the contract sets one
        (a failure past it); a mismatch with no bound set is recorded as data; bitwise equal log-probabilities
        pass."""
        metrics = record.comparisons[ROLLOUT_RECOMPUTE]
        if metrics.logprobs_exact:
            return PASS
        detail = f"{record.title}: {ROLLOUT_RECOMPUTE}: {_mismatch(metrics)}"
        measured = (("k3_max", "k3", metrics.k3),
                    ("outside_bounds_max", "share outside the ratio bounds",
                     metrics.outside_bounds / metrics.logprob_tokens))
        over, unset = [], []
        for key, what, value in measured:
            bound, gate = self.setting(record.family, key)
            if bound is None:
                unset.append(gate)
            elif value > bound:
                over.append(f"{what} {value:.3g} above gate {gate} {bound:g}")
        if over:
            return Judgement("fail", f"{detail}; {'; '.join(over)}")
        if len(unset) == len(measured):
            return Judgement("recorded", f"mismatch recorded (gates {' and '.join(unset)} unset): {detail}")
        return PASS

    def conversation_replicas(self, record: Record, pair: str) -> Judgement:
        """A conversation's replica pair at every turn: bit-exact (gate conversation.replicas_exact)."""
        return self._replicas(record, [f"turn {t.turn}: {p}" for t in record.turns
                                       for p in differences(t.comparisons[pair], pair)])

    def conversation_control(self, record: Record) -> Judgement:
        """At turn 1 the session and the replay are the same one call over the first user turn: bit-exact, or
        the constructions themselves are broken (gate conversation.control_exact)."""
        if stale := _stale_turns(record.turns[:1], CONVERSATION_CONTROL):
            return Judgement("fail", f"{record.title}: {stale}")
        problems = differences(record.turns[0].comparisons[CONVERSATION_CONTROL], CONVERSATION_CONTROL)
        if not problems:
            return PASS
        required, gate = self.setting(record.family, "control_exact")
        return _required(required, f"{record.title}: turn 1: {'; '.join(problems)}", gate)

    def conversation_turns(self, record: Record, pair: str) -> Judgement:
        """A headline pair at every turn after the first: divergent assistant turns are recorded where the
        contract allows the crossing to diverge at this cell, a failure where it does not. A re-rendered history
        that shares no token past the first user turn's with the generated one has nothing to compare: vacuous,
        recorded as such, never a pass. On a serving engine, a turn whose session read no block written while the
        turn before it decoded (prefix_hit.covers_decode false) was no session: vacuous, recorded, never judged; and
        a request on an emptied prefix cache that read from it is a failure."""
        later = record.turns[1:]
        if not later:
            return Judgement("recorded", f"{record.title}: one turn only: nothing after the first turn to compare")
        if stale := _stale_turns(record.turns, pair):
            return Judgement("fail", f"{record.title}: {stale}")
        hits = [t for t in later if "session" in pair.split("~") and t.prefix_hit is not None
                and not t.prefix_hit.covers_decode]
        later = [t for t in later if t not in hits]
        other_ids = [t for t in later if "rerendered" in pair and not t.rerendered.ids_equal]
        vacuous = [t.turn for t in other_ids if t.rerendered.turn == 1]
        diverged = [f"turn {t.turn} at token {t.comparisons[pair].first_divergence}" for t in later
                    if not t.comparisons[pair].suffix_equal and t not in other_ids]
        notes = [f"{pair} at turn {t.turn} reads other ids from token {t.rerendered.first_difference} on (turn "
                 f"{t.rerendered.turn} {t.rerendered.segment}: {t.rerendered.reason}): its assistant turn "
                 f"{'equal' if t.comparisons[pair].suffix_equal else 'differs'}, not judged" for t in other_ids]
        if vacuous:
            notes.append(f"{pair} vacuous at turns {vacuous}: the histories share no assistant token")
        notes += [f"{pair} at turn {t.turn}: vacuous session hit: the engine reused {t.prefix_hit.cached_tokens} "
                  f"tokens, none past the {t.prefix_hit.prompt_block_tokens} of the full blocks turn {t.turn - 1} "
                  f"computed by prefill (no block written while it decoded: no session), not judged" for t in hits]
        if diverged:
            detail = f"{record.title}: {pair} assistant turns diverge ({', '.join(diverged)})"
            if not self.may_diverge[record.precision]:
                return Judgement("fail", f"{detail}; the contract requires {record.precision} {self.reference} "
                                         f"suffixes to be exact (gate {self.reference}.suffix_divergence_allowed."
                                         f"{record.precision})")
            notes.append(f"divergence recorded, allowed by the contract: {detail}")
        return Judgement("recorded", "; ".join(notes)) if notes else PASS

    def conversation_rerendered(self, record: Record) -> Judgement:
        """The re-rendered history's ids against the generated ones at every turn: differences recorded with
        where and why (gate conversation.rerendered_ids_equal true: a failure)."""
        found = [f"turn {t.turn}: first at token {t.rerendered.first_difference} (turn {t.rerendered.turn} "
                 f"{t.rerendered.segment}: {t.rerendered.reason})" for t in record.turns if not t.rerendered.ids_equal]
        if not found:
            return PASS
        message = f"{record.title}: re-rendered ids differ from the generated ones: {'; '.join(found)}"
        required, gate = self.setting(record.family, "rerendered_ids_equal")
        if required:
            return Judgement("fail", f"{message} (gate {gate}: required)")
        return Judgement("recorded", message)

    def divergence(self, record: Record, pair: str) -> Judgement:
        """A headline pair's suffixes: a divergence is recorded where the contract allows it at this
        cell, a failure where it does not."""
        metrics = record.comparisons[pair]
        if metrics.suffix_equal:
            return PASS
        a, b = pair.split("~")
        margins = ["forced" if m is None else format(m, ".3g") for m in metrics.margins_at_divergence or (None, None)]
        detail = (f"{record.title}: {a} and {b} suffixes diverge at suffix index {metrics.first_divergence} "
                  f"(top-1 minus top-2 margins {margins[0]} / {margins[1]}); answers "
                  f"{'equal' if metrics.answer_equal else 'differ'}; boundary K rel L2 "
                  f"{'not measured' if unmeasured(metrics) else format(metrics.k_rel_l2, '.3g')}")
        family, cell = record.family, record.precision
        if self.suffix_divergence_allowed[family][cell]:
            return Judgement("recorded", f"divergence recorded, allowed by the contract: {detail}")
        return Judgement("fail", f"{detail}; the contract requires {cell} {family} suffixes to be exact "
                                 f"(gate {family}.suffix_divergence_allowed.{cell}: false)")

    def served(self, record: Record, pair: str) -> Judgement:
        """The premise of a serving pair (families.serving), from the engine's own counters: a fresh
        prefill read nothing from the prefix cache (else the reset did not take: a failure); a prefix hit
        reused a block the live request wrote while decoding, and a chunked prefill took more than one
        scheduler step (else the comparison is vacuous: recorded as such, never passed)."""
        served = {arm: record.arms[arm].served for arm in pair.split("~")}
        stale = {arm: s.cached_tokens for arm, s in served.items() if arm not in ("live", "prefix_hit")
                 and s.cached_tokens}
        if stale:
            return Judgement("fail", f"{record.title}: {pair}: requests on an emptied prefix cache read tokens from "
                                     f"it: {stale}")
        if "prefix_hit" in served and not record.prefix_hit.covers_decode:
            hit = record.prefix_hit
            return Judgement("recorded", f"{record.title}: vacuous prefix hit: the engine reused "
                                         f"{hit.cached_tokens} tokens, none past the {hit.prompt_block_tokens} "
                                         "of the prompt block's full blocks that the live request computed by "
                                         "prefill (no live-decoded block was reused: the hit says nothing about the "
                                         "live state)")
        if "chunked" in served and (served["chunked"].prefill_steps or 0) < 2:
            steps = served["chunked"].prefill_steps
            return Judgement("recorded", f"{record.title}: vacuous chunked prefill: the prompt took "
                                         f"{'an unobserved number of' if steps is None else steps} scheduler step(s)")
        return PASS

    def sweep_replicas(self, record: Record, pair: str) -> Judgement:
        """A sweep's replica pair at every point: bit-exact (gate sweep.replicas_exact)."""
        return _at_points(record, lambda view: self.replicas(view, pair))

    @staticmethod
    def sweep_premise(record: Record) -> Judgement:
        """The premise of every point of a sweep, from the engine's own counters (point_premise): a count outside what
        an arm's construction requires fails; one outside what the point needs makes it vacuous, recorded with the
        engine's numbers, never a pass. A record without points is no pass."""
        if not record.sweep:
            return Judgement("fail", f"{record.title}: no sweep point: nothing of it was checked")
        found = [point_premise(point) for point in record.sweep]
        if broken := [phrase for wrong, _ in found for phrase in wrong]:
            return Judgement("fail", f"{record.title}: {len(broken)} count(s) outside what the construction "
                                     f"requires: {'; '.join(broken)}")
        if vacuous := [phrase for _, short_of in found for phrase in short_of]:
            points = sum(bool(short_of) for _, short_of in found)
            return Judgement("recorded", f"{record.title}: {points} of {len(found)} points vacuous, not judged: "
                                         f"{'; '.join(vacuous)}")
        return PASS

    def sweep_divergence(self, record: Record, pair: str) -> Judgement:
        """A sweep's headline pair at every point: continuations that diverge are recorded where the contract
        allows the cell to diverge, a failure where it does not (gate sweep.suffix_divergence_allowed). Only the points
        whose premise held are judged (point_premise: a vacuous point measured nothing, sweep_premise says so)."""
        held = tuple(point for point in record.sweep or () if point_premise(point) == ([], []))
        if record.sweep and not held:
            return Judgement("recorded", f"{record.title}: no point's premise held: nothing to judge (sweep_premise)")
        return _at_points(dataclasses.replace(record, sweep=held), lambda view: self.divergence(view, pair))

    def audit(self, message: str | None) -> Judgement:
        """A baseline record against its recomputation (`message`: what changed, None if it reproduced)."""
        return PASS if message is None else _required(self.audit_reproduce, message, "audit.reproduce")

    def transplant_row(self, record: Record, role: str) -> Judgement:
        """One transplant row (layer 4): a divergent row's recipients follow their donors, a control's
        never take a third trajectory. Where the gates allow a share of misses, a miss is recorded
        here and the share is judged over the family (`transplant_family`)."""
        outcomes = {name: t.outcome for name, t in record.transplants.items()}
        if role == "divergent":
            missed = {name: o for name, o in outcomes.items() if o != FOLLOWS}
            if missed:
                return self._every_row(record.family, "donor_recovery", f"{record.title}: the recipient did not "
                                                                        f"follow its donor: {missed}")
            return PASS
        third = {name: record.transplants[name].to_json() for name, o in outcomes.items() if o == THIRD}
        if third:
            return self._every_row(record.family, "controls_third_trajectory", f"{record.title}: a transplant "
                                   f"between exact arms produced a third trajectory: {third}")
        return PASS

    def _every_row(self, family: str, key: str, message: str) -> Judgement:
        """A transplant row's miss: a failure where the gate allows none (_NO_MISS), else recorded here and judged as
        a share over the family (transplant_family)."""
        value, gate = self.setting(family, key)
        return _required(value == _NO_MISS[key], message, gate)

    def conversation_transplant_row(self, record: Record, role: str) -> Judgement:
        """One conversation transplant row (layer 4), under the transplant's gates: a divergent row's recipient
        given the donor's whole turn-k K/V follows the donor in each direction (transplant.donor_recovery); a
        control's splices that moved no differing position (turns ending at or before the first position whose
        K/V differ between session and replay: the recipient's own values, copied) never take a third trajectory
        (transplant.controls_third_trajectory). Past that position a control's splice mixes two caches that
        differ bitwise, though their assistant turns agree: a third trajectory there is a finding, recorded. The
        earliest turn whose K/V carries the divergence is a finding, in the record."""
        splice = record.turn_splice
        if role == "divergent":
            missed = {name: t.outcome for name, t in record.transplants.items() if t.outcome != FOLLOWS}
            if missed:
                return self._every_row(record.family, "donor_recovery", f"{record.title}: turn {splice.turn}: given "
                                       f"the donor's whole turn-{splice.turn} K/V the recipient did not follow it: "
                                       f"{missed}")
            return PASS
        differ = splice.first_kv_difference
        third = [(f"{name} over turns 1..{turn}", copied) for name, steps in splice_thirds(splice).items()
                 for turn, copied in steps]
        if no_op := [name for name, copied in third if copied]:
            return self._every_row(record.family, "controls_third_trajectory", f"{record.title}: turn {splice.turn}: "
                                   f"a splice that moved no differing K/V produced a third trajectory: "
                                   f"{', '.join(no_op)}")
        if third:
            return Judgement("recorded", f"{record.title}: turn {splice.turn}: the K/V of agreeing constructions, "
                                         f"which differ bitwise from position {differ}, mixed by a splice, take a "
                                         f"third trajectory: {', '.join(name for name, _ in third)}")
        if ungated := [name for name, gated in splice_gated(splice).items() if not gated]:
            return Judgement("recorded", f"{record.title}: turn {splice.turn}: nothing gated in {', '.join(ungated)}: "
                                         f"session and replay's K/V differ from position {differ}, before any splice "
                                         "ends, so every splice moved differing K/V (no third trajectory; a finding "
                                         "at most)")
        return PASS

    @staticmethod
    def conversation_transplant_panel(cell: str, divergent: int, not_testable: list[tuple[str, str]],
                                      candidates: int) -> Judgement:
        """The premise of the conversation transplant: a divergent row to transplant. A panel with none (no
        session~replay divergence among the candidate conversations, or none whose first tokens agree) checked
        nothing: recorded as "nothing to transplant", never a pass."""
        if divergent:
            return PASS
        why = (f"{len(not_testable)} divergent, none testable: " + "; ".join(f"{row}: {reason}"
                                                                            for row, reason in not_testable)
               if not_testable else "no session~replay divergence at any turn")
        return Judgement("recorded", f"conversation transplant ({cell}): nothing to transplant: {why} among the "
                                     f"{candidates} conversation(s) of the panel")

    def transplant_family(self, family: str, follows: dict[str, tuple[int, int]],
                          thirds: dict[str, tuple[int, int]]) -> list[Judgement]:
        """Per direction of a transplant `family` (a conversation transplant's too): the share of divergent rows
        whose recipient follows its donor (k, n) against its gate section's donor_recovery, and the controls with a
        third trajectory against its controls_third_trajectory. A direction with no testable divergent row (or no
        control) establishes nothing: it is recorded as not established, never as met."""
        recovery, _ = self.setting(family, "donor_recovery")
        thirds_allowed, _ = self.setting(family, "controls_third_trajectory")
        out = []
        for name, (k, n) in follows.items():
            if not n:
                out.append(Judgement("recorded", f"{name}: donor recovery not established (0 testable divergent "
                                                 "rows)"))
            elif k / n < recovery:
                out.append(Judgement("fail", f"{name}: follows donor {k}/{n} divergent rows, below the donor "
                                             f"recovery gate {recovery:g}"))
        for name, (k, n) in thirds.items():
            if not n:
                out.append(Judgement("recorded", f"{name}: controls' third trajectory not established (0 control "
                                                 "rows with a transplant it judges)"))
            elif k > thirds_allowed:
                out.append(Judgement("fail", f"{name}: third trajectory {k}/{n} control rows, above the gate "
                                             f"{thirds_allowed}"))
        return out or [PASS]


def artifact(here: Judgement, platform_differences: list[str], strict: bool, name: str) -> Judgement:
    """A check against a platform-specific artifact (the bank, a baseline ledger), where `here` is its
    judgement on the platform that made the artifact. Made on another platform, a finding is recorded
    as platform drift, unless --strict-contract makes it a failure."""
    if here.outcome == "pass" or not platform_differences:
        return here
    drift = f"the {name} was made on another platform: {'; '.join(platform_differences)}"
    if strict:
        return Judgement("fail", f"{here.message} ({drift}; --strict-contract)")
    return Judgement("recorded", f"platform drift: {here.message} ({drift})")


def same_platform(name: str, platform_differences: list[str], strict: bool) -> Judgement:
    """Whether an artifact was made on this run's platform: recorded as platform drift where it was
    not, a failure under --strict-contract."""
    if not platform_differences:
        return PASS
    message = f"the {name} was made on another platform: {'; '.join(platform_differences)}"
    if strict:
        return Judgement("fail", f"{message} (--strict-contract)")
    return Judgement("recorded", f"platform drift: {message}")
