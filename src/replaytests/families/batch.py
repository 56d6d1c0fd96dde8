"""Batch composition: the same row as the duplicated physical pair and as a singleton.

How much does the batch alone change? Each construction of the bank's z is built and decoded once
in the contract's physical batch (two identical copies) and once alone; the pair's first copy is
compared with the singleton, bitwise, at the boundary and after it.
"""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import check_same_state, check_storage_isolated
from replaytests.errors import FailClosed
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record, title

FAMILY = FAMILIES["batch"]


def run(runtime: Backend, row: BankRow) -> Record:
    singleton = runtime.with_batch(1)
    runtimes = {arm: singleton if arm.endswith("_singleton") else runtime for arm in FAMILY.arms}
    base = record_base(FAMILY.name, row, runtime)
    where = title(FAMILY.name, row.id, runtime.cell)
    runtime.activate()
    try:
        built = {arm: runtimes[arm].build(arm.rpartition("_")[0], row.tokens) for arm in FAMILY.arms}
        check_storage_isolated(list(built.values()), where)
        views = {arm: runtime.first_copy(b) if runtimes[arm] is runtime else b for arm, b in built.items()}
        check_same_state(list(views.values()), where)
        suffixes = {arm: runtimes[arm].suffix(built[arm]) for arm in FAMILY.arms}
    except FailClosed as exc:
        return excluded(base, exc)
    arms = {arm: arm_record(views[arm], suffixes[arm], row.expected_answer) for arm in FAMILY.arms}
    return Record.of(base | {"status": "ok", "batch": {"pair": runtime.batch, "singleton": 1}, "arms": arms,
                             "comparisons": compare_arms(FAMILY.pairs, views, suffixes, arms)})
