"""Batch composition: the same row as the duplicated physical pair and as a singleton.

How much does the batch alone change? Each construction of the bank's z is built and decoded once
in the contract's physical batch (two identical copies) and once alone; the pair's first copy is
compared with the singleton, bitwise, at the boundary and after it.
"""

from __future__ import annotations

import dataclasses

from replaytests.engine import constructions, hf_adapter
from replaytests.engine.boundary import Boundary, check_same_state, check_storage_isolated
from replaytests.engine.decoder import suffix_of
from replaytests.engine.runtime import Runtime
from replaytests.errors import FailClosed
from replaytests.families.registry import FAMILIES
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base
from replaytests.inputs.bank import BankRow

FAMILY = FAMILIES["batch"]


def logical_row(runtime: Runtime, boundary: Boundary) -> Boundary:
    """The first copy of a physical batch as a storage-isolated singleton boundary."""
    layers = [(keys[:1], values[:1]) for keys, values in boundary.layers]
    return dataclasses.replace(boundary, cache=hf_adapter.cache_from_layers(runtime.model, layers, like=boundary.cache))


def run(runtime: Runtime, row: BankRow) -> dict:
    singleton = dataclasses.replace(runtime, batch=1)
    runtimes = {arm: singleton if arm.endswith("_singleton") else runtime for arm in FAMILY.arms}
    base = record_base(FAMILY.name, row, runtime)
    where = f"{FAMILY.name} row {row.id} ({runtime.precision})"
    runtime.activate()
    try:
        built = {arm: constructions.build(runtimes[arm], arm.rpartition("_")[0], row.tokens) for arm in FAMILY.arms}
        check_storage_isolated(list(built.values()), where)
        views = {arm: logical_row(runtime, b) if runtimes[arm] is runtime else b for arm, b in built.items()}
        check_same_state(list(views.values()), where)
        suffixes = {arm: suffix_of(runtimes[arm], built[arm]) for arm in FAMILY.arms}
    except FailClosed as exc:
        return excluded(base, exc)
    arms = {arm: arm_record(views[arm], suffixes[arm], row.expected_answer) for arm in FAMILY.arms}
    return base | {"status": "ok", "batch": {"pair": runtime.batch, "singleton": 1}, "arms": arms,
                   "comparisons": compare_arms(FAMILY.pairs, views, suffixes, arms)}
