"""Progress while a run computes: per family and cell, rows done out of rows planned; tests
done out of tests collected, the time elapsed and an estimate of the time left (no torch).

The controller feeds it (suite.collector): the planned rows from the plan, each record as it arrives
(from any xdist worker) and each test as it finishes. `bar` is one line a terminal rewrites in place;
`line` is the plain line a log (CI, a file) gets every INTERVAL seconds and at each group's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

INTERVAL = 30.0  # seconds between plain progress lines
BAR = 24  # characters of the bar
Group = tuple[str, str]  # (family, cell)


def duration(seconds: float) -> str:
    """`42s`, `3m05s` or `1h02m`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class Progress:
    planned: dict[Group, int | None]  # rows per group; None where the plan cannot know (a panel read from outcomes)
    clock: Callable[[], float] = time.monotonic
    tests: int = 0  # collected
    finished: int = 0
    done: dict[Group, set[str]] = field(default_factory=dict)
    started: float = field(default=0.0)
    shown: float = field(default=0.0)  # when the last plain line was shown
    first: float | None = None  # when the first test finished: the estimate's rate is measured from there

    def __post_init__(self) -> None:
        self.started = self.shown = self.clock()

    def record(self, family: str, row: str, cell: str) -> bool:
        """Count a record; True when it completes its group (every planned row done)."""
        rows = self.done.setdefault((family, cell), set())
        if row in rows:
            return False
        rows.add(row)
        return len(rows) == self.planned.get((family, cell))

    def finish(self) -> None:
        """Count a finished test."""
        self.finished += 1
        if self.first is None:
            self.first = self.clock()

    def eta(self) -> float | None:
        """Seconds left, from the rate of the tests finished after the first one: what came before it (collection,
        the session's open, the model's load, its records) is not spent again per test. Measured from the run's
        start instead, a 48-row audit's first estimates were 8 to 130 times the time it had left (docs/ci.md,
        "Progress"). None until INTERVAL seconds after the first test finished: tests that read one record finish
        together, and a rate over a burst of them would promise a run over in seconds."""
        if self.tests and self.finished >= self.tests:
            return 0.0
        if self.first is None or self.finished < 2 or not self.tests or self.clock() - self.first < INTERVAL:
            return None
        return (self.clock() - self.first) * max(self.tests - self.finished, 0) / (self.finished - 1)

    def _times(self) -> str:
        eta = self.eta()
        left = "-" if eta is None else duration(eta)
        return f"{duration(self.clock() - self.started)} elapsed, ETA {left}"

    def _group(self, group: Group) -> str:
        planned = self.planned.get(group)
        return f"{' '.join(group)} {len(self.done.get(group, ()))}/{'?' if planned is None else planned}"

    def groups(self) -> list[Group]:
        return list(self.planned) + sorted(set(self.done) - set(self.planned))

    def line(self) -> str:
        """Every group, then the tests and times: one line for a log."""
        return (f"replaytests progress: {self.finished}/{self.tests} tests, {self._times()}; rows: "
                + ", ".join(self._group(g) for g in self.groups()))

    def bar(self) -> str:
        """A bar, the tests and times, and the groups in progress (started, not done)."""
        share = self.finished / self.tests if self.tests else 0.0
        filled = min(BAR, int(share * BAR))
        running = [self._group(g) for g in self.groups()
                   if self.done.get(g) and len(self.done[g]) != self.planned.get(g)]
        return (f"[{'#' * filled}{'.' * (BAR - filled)}] {self.finished}/{self.tests} tests, {self._times()}"
                + (f" | {', '.join(running)}" if running else ""))

    def due(self) -> bool:
        """Whether a plain line is due (INTERVAL seconds since the last); marks it shown."""
        if self.clock() - self.shown < INTERVAL:
            return False
        self.shown = self.clock()
        return True
