"""Rollout fidelity: the trainer's recompute of a rollout, token by token (docs/protocol.md §15).

Per bank row and cell, from the boundary of the row's z: a live rollout of the contract's `rollout.length`
tokens (z in one call, then one token per call; greedy here, sampled in `rollout_sampled`, with a per-row
seed), each chosen token's log-probability as the live decoder computed it; and its replays over the same
tokens: the trainer's recompute (one prefill call over z + response) and teacher forcing on the live schedule
(`incremental`, the same calls as live: bit-exact or the measurement is broken). Each arm has a replica.

Beside the usual comparisons (the cache over z + response, the next token's logits, the response tokens and
their top-1 minus top-2 margins) each pair carries the mismatch measures of outputs/mismatch.py over the
tokens both arms share (docs/ledger.md, "Rollout measures").
"""

from __future__ import annotations

import numpy as np

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Suffix, check_finite, check_same_state, check_storage_isolated
from replaytests.engine.comparisons import first_divergence
from replaytests.engine.rollout import Rollout, row_seed
from replaytests.errors import FailClosed
from replaytests.families.registry import FAMILIES, Family
from replaytests.families.skeleton import arm_record, compare_arms, excluded, record_base, z_digest
from replaytests.inputs.bank import BankRow
from replaytests.outputs.mismatch import Scored, Thresholds, row_measures
from replaytests.outputs.records import Record, title

FAMILY = FAMILIES["rollout"]


def settings(runtime: Backend, row: BankRow, mode: str, rollout: dict) -> dict:
    """What the record says of how its rollout was drawn and judged (the contract's `rollout:` section)."""
    low, high = rollout["ratio_bounds"]
    return {"mode": mode, "length": rollout["length"],
            "seed": row_seed(rollout["seed"], row.id) if mode == "sampled" else None,
            "temperature": 1.0 if mode == "sampled" else 0.0, "top_p": 1.0,
            "ratio_low": low, "ratio_high": high, "delta_threshold": rollout["delta_threshold"]}


def measures(a: Rollout, b: Rollout, thresholds: Thresholds) -> dict:
    """The mismatch of b's log-probabilities against a's (a: the reference, the live decoder's) over the
    tokens they share (up to where two live rollouts' tokens split), and whether all are bitwise equal."""
    split = first_divergence(a.tokens, b.tokens)
    shared = len(a.tokens) if split is None else split
    if not shared:
        return {"logprobs_exact": False, "logprob_tokens": 0, "logprob_tokens_equal": 0, "abs_dlogp_max": None,
                "abs_dlogp_median": None, "abs_dlogp_p99": None, "k3": None, "outside_bounds": None,
                "first_exceeding": None}
    m = row_measures(Scored("", np.asarray(a.tokens[:shared]), np.asarray(a.logprobs[:shared], dtype=np.float64),
                            np.asarray(b.logprobs[:shared], dtype=np.float32)), thresholds)
    return {"logprobs_exact": split is None and m.bitwise_equal == m.tokens, "logprob_tokens": m.tokens,
            "logprob_tokens_equal": m.bitwise_equal, "abs_dlogp_max": m.abs_delta_max,
            "abs_dlogp_median": m.abs_delta_median, "abs_dlogp_p99": m.abs_delta_p99, "k3": m.k3,
            "outside_bounds": m.outside_bounds, "first_exceeding": m.first_exceeding}


def evaluate(runtime: Backend, row: BankRow, family: Family, mode: str, rollout: dict) -> Record:
    """The record of one row's rollout in `mode`: the live rollout and its replica, then each replay of the
    live tokens; every arm's end state checked as any boundary (same tokens for the replays, finite, no
    shared storage), then compared pair by pair."""
    base = record_base(family.name, row, runtime) | {"rollout": settings(runtime, row, mode, rollout)}
    spec = base["rollout"]
    thresholds = Thresholds(spec["ratio_low"], spec["ratio_high"], spec["delta_threshold"])
    runtime.activate()
    where = title(family.name, row.id, runtime.cell)
    try:
        arms = {arm: runtime.rollout(row.tokens, spec["length"], spec["seed"], arm)
                for arm in ("live", "live_replica")}
        response = arms["live"].tokens
        arms |= {arm: runtime.replay(arm, row.tokens, response) for arm in family.arms if arm not in arms}
        replays = [arms["live"].end] + [r.end for arm, r in arms.items() if not arm.startswith("live")]
        check_same_state(replays, where)
        check_finite(arms["live_replica"].end, where)  # its tokens may differ from live's: compared, not required
        check_storage_isolated([r.end for r in arms.values()], where)
    except FailClosed as exc:
        return excluded(base, exc)
    suffixes = {arm: Suffix(r.tokens, r.margins, "", []) for arm, r in arms.items()}  # no answer: not the protocol's
    # z_sha256: the prompt each arm consumed (its first len(z) tokens and roles); the response is its suffix
    prompt = len(row.tokens)
    records = {arm: arm_record(r.end, suffixes[arm], None) | {
        "z_sha256": z_digest(r.end.tokens[:prompt], r.end.roles[:prompt]), "logprobs": r.logprobs, "top2": r.top2,
        "logprobs_mode": r.logprobs_mode} for arm, r in arms.items()}
    comparisons = compare_arms(family.pairs, {arm: r.end for arm, r in arms.items()}, suffixes, records)
    for a, b in family.pairs:
        comparisons[f"{a}~{b}"] |= measures(arms[a], arms[b], thresholds)
    return Record.of(base | {"status": "ok", "arms": records, "comparisons": comparisons})


def run(runtime: Backend, row: BankRow, rollout: dict) -> Record:
    """The record of one row's greedy rollout under the contract's `rollout:` section."""
    return evaluate(runtime, row, FAMILY, "greedy", rollout)
