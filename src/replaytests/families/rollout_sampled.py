"""Rollout fidelity of a sampled rollout (temperature 1, top-p 1, a per-row seed): families/rollout.py."""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.families.registry import FAMILIES
from replaytests.families.rollout import evaluate
from replaytests.inputs.bank import BankRow
from replaytests.outputs.records import Record

FAMILY = FAMILIES["rollout_sampled"]


def run(runtime: Backend, row: BankRow, rollout: dict) -> Record:
    """The record of one row's sampled rollout under the contract's `rollout:` section."""
    return evaluate(runtime, row, FAMILY, "sampled", rollout)
