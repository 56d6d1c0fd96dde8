"""The edge sweep (docs/protocol.md §17): where a replay breaks, along each edge of the engine, rather than at the
one point a row happens to sit.

A backend declares the axes it sweeps (engine.backend.Axis): the prefix's length around its block, chunk and
quantized-cache edges, the requests beside a row in a batch, ... At every point of an axis the family builds the
backend's reference construction and the construction whose edge the axis crosses, each with a replica, over the
point's prefix of the row, continues each greedily for a few tokens, and checks and compares them as every family
does (one state, no shared storage, the same tokens consumed). A record holds every point; `compare`, the gates and
the report read divergence against the swept value.

A position axis's points are each engine edge's first and last `sweep.multiples` multiples that fit the prefix,
one before and one after each, and the row's whole prefix (so every record also holds the row's own boundary).
"""

from __future__ import annotations

from replaytests.engine.backend import Axis, Backend
from replaytests.engine.boundary import check_same_state, check_storage_isolated, steps_digest
from replaytests.errors import ConfigError, FailClosed
from replaytests.families.registry import FAMILIES
from replaytests.families.serving import compare_steps
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base, z_digest
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record, title

FAMILY = FAMILIES["sweep"]


def positions(edges: tuple[tuple[str, int], ...], length: int, multiples: int) -> list[tuple[int, str | None]]:
    """The points of a position axis over a prefix of `length` tokens: (the prefix's length, the edge it sits
    beside), sorted; the whole prefix is a point of its own (None) where no edge puts it there."""
    points: dict[int, str | None] = {}
    for field, size in edges:
        fitting = list(range(size, length + 2, size))  # every multiple whose point before it fits the prefix
        for multiple in sorted(set(fitting[:multiples] + fitting[-multiples:])):
            for offset, where in ((-1, " - 1"), (0, ""), (1, " + 1")):
                if 1 <= multiple + offset <= length:
                    points.setdefault(multiple + offset, f"{field} {size} x{multiple // size}{where}")
    points.setdefault(length, None)
    return sorted(points.items())


def points(axis: Axis, length: int, settings: dict) -> list[tuple[int, str | None, int]]:
    """(value, edge, prefix tokens) of each point of `axis` on a row whose prefix is `length` tokens long."""
    if axis.edges:
        return [(value, edge, value) for value, edge in positions(axis.edges, length, settings["multiples"])]
    return [(value, f"{axis.field} {value}", length) for value in axis.values]


def run(runtime: Backend, row: BankRow, settings: dict) -> Record:
    """The ledger record of one row's sweep, every axis the backend declares at the runtime's cell."""
    base = record_base(FAMILY.name, row, runtime)
    axes = runtime.sweep_axes(settings)
    if settings.get("axes"):  # the contract's choice among them (sweep.axes; empty: every axis)
        axes = tuple(axis for axis in axes if axis.name in settings["axes"])
    if not axes:
        raise ConfigError(f"backend {runtime.name} declares edge_sweep but no axis to sweep at cell "
                          f"{runtime.cell}{' among sweep.axes' if settings.get('axes') else ''}")
    runtime.activate()
    swept = []
    try:
        for axis in axes:
            chosen = {value: (edge, tokens) for value, edge, tokens in points(axis, row.prefix_len, settings)}
            for value, built in runtime.sweep(axis, row.tokens, list(chosen), settings["continuation"]):
                edge, tokens = chosen[value]
                where = f"{title(FAMILY.name, row.id, runtime.cell)} at {axis.name} {value}"
                boundaries = {arm: built[arm][0] for arm in FAMILY.arms}
                check_same_state(list(boundaries.values()), where)
                check_storage_isolated(list(boundaries.values()), where)
                suffixes = {arm: built[arm][1] for arm in FAMILY.arms}
                arms = {arm: arm_record(boundaries[arm], suffixes[arm], None) for arm in FAMILY.arms}
                served = {arm: boundary.state.served for arm, boundary in boundaries.items()
                          if getattr(boundary.state, "served", None) is not None}
                swept.append({"axis": axis.name, "value": value, "edge": edge, "tokens": tokens, "arms": arms,
                              "comparisons": _with_steps(compare_arms(FAMILY.pairs, boundaries, suffixes, arms),
                                                         boundaries),
                              **({"served": served} if served else {})})
    except FailClosed as exc:
        return excluded(base, exc)
    return Record.of(base | {"status": "ok", "arms": swept[-1]["arms"], "comparisons": swept[-1]["comparisons"],
                             "sweep": swept})


def _with_steps(comparisons: dict, boundaries: dict) -> dict:
    """Where every arm's state carries its continuation's steps (a serving engine's top-k rows, which hold more than
    the boundary's: vLLM shows no K/V), each pair also compares them bit for bit, as the serving family does: a
    batch changes a decode step's numbers without changing its boundary's."""
    steps = {arm: getattr(boundary.state, "steps", None) for arm, boundary in boundaries.items()}
    if any(value is None for value in steps.values()):
        return comparisons
    out = {}
    for pair, metrics in comparisons.items():
        a, b = pair.split("~")
        out[pair] = metrics | {"steps_exact": steps_digest(steps[a]) == steps_digest(steps[b])} | compare_steps(
            steps[a], steps[b], metrics["first_divergence"])
    return out


def other_tokens(record: Record, row: BankRow) -> str | None:
    """Token identity at every point: the arms that consumed anything but the row's first `tokens` tokens, in one
    line, or None."""
    wrong = [f"{p.axis} {p.value}: {arm}" for p in record.sweep or () for arm, values in p.arms.items()
             if values.z_sha256 != z_digest(row.tokens[:p.tokens], row.roles[:p.tokens])]
    return f"{record.title}: arms consumed other tokens than the row's prefix: {', '.join(wrong)}" if wrong else None
