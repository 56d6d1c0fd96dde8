"""What comparing two runs found (outputs/compare.py makes it): each judged measure, a row of the verdict
table; each finding, by the level it reached, as a reason that fails the gate or a note that does not;
and the text that explains them.

The text explains before it lists: its first line is the result at the gate, which levels changed and
which held, and the root cause when there is one (the platform, the inputs or the contract differ
between the two run.json files); then the causes; then where the numbers first moved, per cell
and construction (outputs/localization.py); the per-family, per-quantity table with counts; at most a
few examples of each kind of reason (all of them with `verbose`); and the result again as the last
line (docs/nightly.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replaytests.inputs.gates import LEVELS, gated
from replaytests.outputs.expected import Expected
from replaytests.outputs.stats import INTERVAL, wilson
from replaytests.outputs.tables import Table, plain

HEADER = ("family", "precision", "measure", "rows", f"baseline [{INTERVAL}]", f"new [{INTERVAL}]", "p", "verdict")
if TYPE_CHECKING:
    from replaytests.outputs.records import Record

Group = tuple[str, str]  # (family, cell)
Rows = dict[str, "Record"]  # row id -> the record of one (family, cell)
RATES_REASON = "divergence rate changed beyond chance"
ROLLOUT_RATES_REASON = "rollout mismatch changed beyond chance"
RATES_REASONS = (RATES_REASON, ROLLOUT_RATES_REASON)  # what a finding at the rates level starts with


def ok_records(rows: Rows) -> list[Record]:
    """The ok records of one family and cell, by row id."""
    return [rows[row] for row in sorted(rows) if rows[row].ok]


@dataclass(frozen=True)
class Measure:
    """One measure of one family and cell judged between the two runs: a row of compare's table."""

    group: Group
    measure: str
    rows: int
    baseline: tuple[int, int] | str | None  # a count k/n (shown with its Wilson interval), or a value as shown
    new: tuple[int, int] | str | None
    p: float | None
    ok: bool
    allowed: bool = False  # a change at a level this gate does not judge: it informs

    def cells(self) -> tuple[str, ...]:
        counts = ["-" if c is None else c if isinstance(c, str) else _with_interval(*c) for c in (self.baseline,
                                                                                                   self.new)]
        verdict = "ok" if self.ok else "changed (allowed)" if self.allowed else "FAIL"
        return (*self.group, self.measure, str(self.rows), *counts, "-" if self.p is None else f"{self.p:.3g}", verdict)


def _with_interval(k: int, n: int) -> str:
    """`k/n [low, high]%`: the count with its Wilson interval."""
    w = wilson(k, n)
    return f"{k}/{n} [{100 * w.ci_low:.1f}, {100 * w.ci_high:.1f}]%" if n else "0/0"


EXAMPLES = 3  # reasons shown of each kind without --verbose


@dataclass
class Findings:
    """What comparing two runs at one gate found: the verdict table's rows, the reasons that fail the gate,
    the notes that inform, and where the runs differ (causes, the layers that moved)."""

    gate: str = "bits"
    expected: Expected | None = None
    lines: list[Measure] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)  # what differs between the runs' run.json (platform, inputs)
    moved: list[str] = field(default_factory=list)  # localization.lines: where the numbers first moved
    found: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))  # findings per level
    seen: set[tuple[str, str, str]] = field(default_factory=set)  # (family, cell, level) of every finding
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))  # per level, by --expected
    across_runtimes: bool = False  # two runtimes' fingerprints never match: changed bits are counted, not listed
    same: bool = False  # both sides are one run (given twice, or a copy of it): nothing could change

    def gated(self, level: str) -> bool:
        """Whether a finding at `level` fails this gate (it does at the gate's level and every coarser one)."""
        return gated(level, self.gate)

    def finding(self, level: str, group: Group, reason: str) -> None:
        """A change found at `level` in `group`: a reason where the gate judges that level and the
        expected-state file does not accept it, else a note saying why it does not fail."""
        # A changed trajectory is changed bits too (counted and seen at both levels, listed once).
        for at in ("bits", level) if level == "trajectories" else (level,):
            self.found[at] += 1
            self.seen.add((*group, at))
        if level == "bits" and self.across_runtimes and not self.gated(level):
            return
        if self.expected is not None and (entry := self.expected.accepts(group, level)) is not None:
            self.accepted[level] += 1
            self.notes.append(f"{reason} (expected: {entry})")
        elif self.gated(level):
            self.reasons.append(reason)
        else:
            self.notes.append(f"{reason} (allowed at --gate {self.gate})")

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def result(self) -> str:
        return "PASS" if self.passed else f"FAIL: {_count(len(self.reasons), 'reason')}"

    def levels(self) -> str:
        """Which levels changed (and whether this gate allowed them) and which held."""
        nouns = {"bits": "record", "trajectories": "record", "rates": "rate"}

        def why(level: str) -> str:
            if not self.gated(level):
                return ", allowed at this gate"
            return f", {self.accepted[level]} expected" if self.accepted[level] else ""
        return "; ".join(f"{level} changed ({_count(self.found[level], nouns[level])}{why(level)})"
                         if self.found[level] else f"{level} held" for level in LEVELS)

    def text(self, verbose: bool = False) -> str:
        first = (f"{self.result} at --gate {self.gate}: {self.levels()}"
                 + ("; both sides are one run (given twice, or a copy): nothing could have changed"
                    if self.same else "")
                 + (f"; the runs differ in {self.causes[0]}" if self.causes else ""))
        out = [first, *(f"cause: {cause}" for cause in self.causes), *(f"moved: {line}" for line in self.moved), "",
               plain(Table("verdict", HEADER, tuple(line.cells() for line in self.lines)))]
        out += [f"note: {note}" for note in self.notes]
        kinds: dict[str, list[str]] = defaultdict(list)
        for reason in self.reasons:
            kinds[reason.partition(":")[0]].append(reason)
        for kind, reasons in kinds.items():
            shown = reasons if verbose else reasons[:EXAMPLES]
            out += [f"reason: {reason}" for reason in shown]
            if len(reasons) > len(shown):
                out.append(f"reason: ... and {len(reasons) - len(shown)} more {kind} reasons (--verbose lists them)")
        return "\n".join([*out, self.result])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
