"""The transplant's outcomes (the paper's Table 5), per cell: the validity control, donor recovery per direction over
the divergent rows, third trajectories over the exact controls, the same for K-only and V-only transplants, the
minimal layer ranges, and the divergent rows no transplant can test; and each place they are shown (an outcome
module: outputs/causal.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from replaytests.families.registry import FAMILIES, TRANSPLANTS
from replaytests.inputs.gates import Gates
from replaytests.outputs.causal import PARTIAL, Validity, not_testable, validity, validity_cell, validity_text
from replaytests.outputs.findings import Findings, Group, Measure, Rows, ok_records
from replaytests.outputs.records import Outcome, Record
from replaytests.outputs.stats import Proportion, fields_of, proportion
from replaytests.outputs.tables import Table, fmt_proportion

TRACKED: tuple[str, ...] = ()  # the history keeps the per-direction outcomes alone
REQUIRED = ("role", "transplants", "parts", "layers")  # what an ok record must hold for summarize


Directions = dict[str, dict[str, Proportion]]  # direction -> outcome (follows_donor, control_third) -> its count


@dataclass(frozen=True)
class PanelOutcome:
    """What a transplant family's outcomes in one cell hold (a conversation transplant's too), and its gates and the
    history read: its rows (`rows` with `excluded` among them, `divergent` and exact `controls` among the ok ones),
    the validity control, the divergent rows no transplant can test ([row, reason]), and per direction the
    recipients that follow their donor and the controls with a third trajectory (`full`)."""

    rows: int
    excluded: int
    divergent: int
    controls: int
    validity: Validity
    not_testable: list[list[str]]
    full: Directions

    def to_json(self) -> dict:
        return fields_of(self)


@dataclass(frozen=True)
class TransplantOutcome(PanelOutcome):
    """The transplant's outcomes in one cell (the paper's Table 5): `full` over all layers, `parts` K only and V only,
    the minimal layer ranges and how often each layer is in one."""

    parts: dict[str, Directions]
    minimal_layers: dict[str, dict[str, int]]
    layer_frequency: dict[str, list[int]]


def summarize(records: list[Record], family: str, meta: dict | None = None) -> TransplantOutcome:
    """Counts with Wilson intervals over the family's records of one cell (`records`: the cell's, every
    family's: the divergent rows no transplant can test are the crossing's)."""
    mine = [r for r in records if r.family == family]
    ok = [r for r in mine if r.ok]
    divergent = [r for r in ok if r.role == "divergent"]
    controls = [r for r in ok if r.role == "control"]

    def both(get: Callable[[Record, str], Outcome]) -> Directions:
        def outcome_is(wanted: str, name: str) -> Callable[[Record], bool]:
            return lambda r: get(r, name).outcome == wanted

        return {name: {"follows_donor": proportion(divergent, outcome_is("follows_donor", name)),
                       "control_third": proportion(controls, outcome_is("third", name))} for name in TRANSPLANTS}

    n_layers = max((r.layers for r in divergent), default=0)
    # Only rows whose all-layer transplant followed the donor were searched.
    minimal = {name: [r.minimal_layers[name] for r in divergent
                      if r.transplants[name].outcome == "follows_donor"] for name in TRANSPLANTS}
    return TransplantOutcome(
        rows=len(mine), excluded=len(mine) - len(ok), divergent=len(divergent), controls=len(controls),
        validity=validity(mine), not_testable=not_testable(records, family),
        full=both(lambda r, n: r.transplants[n]),
        parts={part: both(lambda r, n, p=part: r.parts[p][n]) for part in PARTIAL},
        minimal_layers={name: dict(Counter("none" if m is None else f"{m[0]}-{m[1]}" for m in ranges))
                        for name, ranges in minimal.items()},
        layer_frequency={name: [sum(1 for m in ranges if m is not None and m[0] <= i <= m[1])
                                for i in range(n_layers)] for name, ranges in minimal.items()})


def counts(t: PanelOutcome) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """What gates.transplant_family judges of an outcome's `full` counts (a conversation transplant's too): per
    direction (k, n) of the divergent rows that follow their donor, and of the controls with a (gated) third
    trajectory."""
    return tuple({name: (v[key].k, v[key].n) for name, v in t.full.items()}
                 for key in ("follows_donor", "control_third"))


def compare(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates, alpha: float) -> None:
    """Its checks of one family and cell between a baseline run and a new one (outputs/compare.py): its family gate on
    the new run (judge_runs)."""
    judge_runs(out, group, base, new, gates, summarize)


def judge_runs(out: Findings, group: Group, base: Rows, new: Rows, gates: Gates,
               summarize_cell: Callable[[list[Record], str], PanelOutcome]) -> None:
    """gates.transplant_family over the new run's rows of one family and cell (`summarize_cell`: its outcome module's
    `summarize`, whose `counts` it judges), at every level: per direction, the divergent rows whose recipient follows
    its donor and the controls with a (gated) third trajectory, each beside the baseline's count; a direction with
    no such row is noted as not established, never met."""
    if not ok_records(new):  # compare's `_excluded` says so: nothing to judge
        return
    family = group[0]

    def judged_counts(rows: Rows) -> tuple[dict[str, tuple[int, int]], ...]:  # by direction name, as compare sorts
        return tuple(dict(sorted(c.items())) for c in counts(summarize_cell(list(rows.values()), family)))

    now = judged_counts(new)
    then = judged_counts(base) if ok_records(base) else ({}, {})
    judged = gates.transplant_family(family, *now)
    failed = [j.message for j in judged if j.failed]
    for label, found, before in zip(("follows donor", "third trajectory"), now, then, strict=True):
        for name, (k, n) in found.items():
            if n:  # a direction with no such row is noted below (not established), not tabled as ok
                ok = not any(m.startswith(f"{name}: {label} ") for m in failed)
                out.lines.append(Measure(group, f"{name} {label}", n, before.get(name), (k, n), None, ok))
    gate = f"{FAMILIES[family].gate_section} gate: {'/'.join(group)}"
    out.reasons += [f"{gate} {message}" for message in failed]
    out.notes += [f"{gate} {j.message}" for j in judged if j.outcome == "recorded"]


def gate_text(judgements: list) -> str:
    failed = [j.message for j in judgements if j.failed]
    unsettled = [j.message for j in judgements if j.outcome == "recorded"]
    if failed:
        return "NOT MET: " + "; ".join(failed + unsettled)
    return "not established: " + "; ".join(unsettled) if unsettled else "met"


def terminal_lines(family: str, cell: str, t: TransplantOutcome, gates: Gates) -> list[str]:
    """The outcomes with Wilson 95% intervals and the verdict of its gates (gates.transplant)."""
    full = "; ".join(f"{name} {fmt_proportion(v['follows_donor'])}" for name, v in t.full.items())
    third = "; ".join(f"{name} {fmt_proportion(v['control_third'])}" for name, v in t.full.items())
    parts = "; ".join(f"{part} {name} {fmt_proportion(v['follows_donor'])}" for part, by in t.parts.items()
                      for name, v in by.items())
    ranges = "; ".join(f"{name} " + (", ".join(f"[{r}] x{n}" for r, n in found.items()) or "-")
                       for name, found in t.minimal_layers.items())
    judged = gates.transplant_family(family, *counts(t))
    return [f"{family} ({cell}): validity control (self-transplants reproduce their own trajectory): "
            f"{validity_text(t.validity)}",
            f"  recipient follows donor: {full}", f"  controls with a third trajectory: {third}",
            f"  gates.{FAMILIES[family].gate_section}: {gate_text(judged)}",
            f"  not testable (first suffix tokens differ): {len(t.not_testable)}"
            + "".join(f"; {row}: {reason}" for row, reason in t.not_testable),
            f"  partial transplants follow donor: {parts}", f"  minimal layer ranges: {ranges}"]


def tables(family: str, cell: str, t: TransplantOutcome) -> list[Table]:
    """Table 5: per direction, the recipients that follow their donor (all layers, K only, V only), the controls
    with a third trajectory and the minimal layer ranges; then the divergent rows no transplant can test."""
    rows = tuple((direction, fmt_proportion(t.full[direction]["follows_donor"]),
                  *(fmt_proportion(t.parts[part][direction]["follows_donor"]) for part in sorted(t.parts)),
                  fmt_proportion(t.full[direction]["control_third"]),
                  ", ".join(f"{r}: {n}" for r, n in t.minimal_layers[direction].items()) or "-")
                 for direction in t.full)
    out = [Table(f"{FAMILIES[family].title}, {cell}: {t.divergent} divergent rows, {t.controls} exact controls",
                 ("recipient<-donor", "follows donor", *(f"{p} follows donor" for p in sorted(t.parts)),
                  "controls: third trajectory", "minimal layer ranges (rows)"), rows,
                 "Divergent rows: incremental and prefill suffixes differ, first suffix tokens agree. "
                 f"Validity control (each construction's cache in its own replica reproduces its "
                 f"trajectory): {validity_cell(t.validity)}.")]
    if t.not_testable:
        out.append(Table(f"Transplant, {cell}: divergent rows not testable", ("row", "reason"),
                         tuple((row, reason) for row, reason in t.not_testable)))
    return out


def replica_rows(family: str, cell: str, t: PanelOutcome) -> list[tuple[str, ...]]:
    """None: its replicas are judged in its records' own tests, not counted in the replica table."""
    return []


def tracked(t: PanelOutcome) -> dict:
    """Donor recovery and third trajectories per direction."""
    return {"follows_donor": {d: v["follows_donor"] for d, v in t.full.items()},
            "control_third": {d: v["control_third"] for d, v in t.full.items()}}
