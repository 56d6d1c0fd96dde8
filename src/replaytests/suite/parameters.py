"""The parameters of the conformance tests: the selected cells, each family's rows and the baseline
records a run audits, with ids like `bf16-tiny-007`. Where the run leaves a test nothing to run on (a
library not installed, a backend that cannot serve the family, a shard without its rows, no baseline),
the test gets one skipped parameter whose reason says which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from replaytests.families.registry import FAMILIES
from replaytests.suite.planner import REPLICA, ROW_FIXTURES

if TYPE_CHECKING:
    from replaytests.suite.session import ReplaySession


def parametrize(metafunc: pytest.Metafunc, replay: ReplaySession) -> None:
    """Each parameter a conformance test asks for: `cell`, `causal_cell`, a row fixture per family
    (planner.ROW_FIXTURES), the replica layer's (family, row, pair), `<family>_family` (a test over a family's whole
    panel), and the baseline records it audits."""
    fixtures = set(metafunc.fixturenames)
    if "cell" in fixtures:
        metafunc.parametrize("cell", cell_params(replay, replay.cells), scope="session")
    if "causal_cell" in fixtures:
        metafunc.parametrize("causal_cell", causal_unavailable(replay) or cell_params(replay, replay.causal_cells),
                             scope="session")
    for name, family in ROW_FIXTURES.items():
        if name in fixtures:
            metafunc.parametrize(name, row_params(replay, family), scope="session")
    if set(REPLICA) <= fixtures:
        metafunc.parametrize(REPLICA, replica_params(replay), scope="session")
    for name in FAMILIES:  # a test over a family's whole panel (`<family>_family`): once, where the family runs
        if f"{name}_family" in fixtures:
            metafunc.parametrize(f"{name}_family", unavailable(replay, name) or ["all-rows"])
    for name, causal in (("baseline_record", False), ("causal_baseline_record", True)):
        if name in fixtures:
            metafunc.parametrize(name, audit_params(replay, causal))


def _skipped(id_: str, reason: str) -> list:
    return [pytest.param(None, id=id_, marks=pytest.mark.skip(reason=reason))]


def cell_params(replay: ReplaySession, names: tuple[str, ...]) -> list:
    """One parameter per cell, and a skipped one per selected cell whose library is not installed here."""
    return ([pytest.param(name, id=name) for name in names]
            + [pytest.param(name, id=name, marks=pytest.mark.skip(reason=reason))
               for name, reason in replay.skipped_cells.items()])


def no_cell(replay: ReplaySession, family: str) -> list:
    """The skipped parameter of a family that runs on the cells that may diverge when --precision
    selects none of them; else empty."""
    if FAMILIES[family].divergent_cells_only and not replay.causal_cells:
        return _skipped("no-divergent-cell", f"{family} runs on the cells whose crossing may diverge (gates.crossing."
                                             f"suffix_divergence_allowed); --precision {replay.options.precision} "
                                             "selects none")
    return []


def unavailable(replay: ReplaySession, family: str) -> list:
    """The skipped parameter of a family the backend cannot serve, or that runs on the cells that may
    diverge under a --precision without one; else empty."""
    if reason := replay.unavailable(family):
        return _skipped("unsupported", reason)
    return no_cell(replay, family)


def causal_unavailable(replay: ReplaySession) -> list:
    """The skipped parameter of `causal_cell` where no family that runs on the cells that may diverge (the causal
    families) can run here, with the first one's reason; else empty: each family's tests skip with their own reason
    where it alone cannot run (its row fixture, or the test itself)."""
    skipped = [unavailable(replay, name) for name, family in FAMILIES.items() if family.divergent_cells_only]
    return skipped[0] if skipped and all(skipped) else []


def row_params(replay: ReplaySession, family: str) -> list:
    if skipped := unavailable(replay, family):
        return skipped
    if FAMILIES[family].later_model and not replay.options.later_model:
        return _skipped("no-later-model", replay.options.why_no_later_model)
    rows = replay.plan.family_rows(family)
    if not rows:  # a shard can hold none of a panel's rows: not an error
        return _skipped("no-rows", f"shard {replay.options.shard} holds none of the {family} family's rows")
    return [pytest.param(row, id=row.id) for row in rows]


def replica_params(replay: ReplaySession) -> list:
    """The replica layer's (family, row, pair): each family that names the layer, each of its rows and replica
    pairs (ids `<family>-<row>-<construction>`), or its one skipped parameter (`<family>-<why>`)."""
    params = []
    for family in (f for f in FAMILIES.values() if "replica" in f.layers):
        for row in row_params(replay, family.name):
            if row.marks:
                params.append(pytest.param(family.name, None, None, id=f"{family.name}-{row.id}", marks=row.marks))
                continue
            params += [pytest.param(family.name, row.values[0], pair, id=f"{family.name}-{row.id}-"
                                                                          f"{pair.partition('~')[0]}")
                       for pair in family.replicas]
    return params


def audit_params(replay: ReplaySession, causal: bool) -> list:
    """The baseline records this run audits: those of the causal families (audited in the causal layer,
    so that `-m "not causal"` then `-m causal --panel-from` splits a run in two phases), or the others."""
    if not replay.options.baseline_ledger:
        return _skipped("no-baseline", "no baseline ledger: pass --baseline LEDGER")
    records = [r for r in replay.baseline if ("causal" in FAMILIES[r.family].layers) == causal]
    if not records:
        return _skipped("no-records", f"the baseline holds no record of this run's rows, families and cells "
                                      f"({replay.options.baseline_ledger})")
    return [pytest.param(r, id="-".join(r.key)) for r in records]
