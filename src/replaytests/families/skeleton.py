"""The skeleton every family shares: a record's base, its arms' records, the comparisons of its pairs,
the record of an excluded row, and `evaluate`, which builds a row's arms, checks them and compares them.

A family gathers a record's fields as plain values and makes the `Record` once, from all of them
(`Record.of`); nothing changes a record after it is made."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Boundary, Suffix, check_same_state, check_storage_isolated
from replaytests.engine.comparisons import compare_boundaries, compare_suffixes, first_divergence
from replaytests.errors import FailClosed
from replaytests.families.registry import FAMILIES, Family
from replaytests.files import sha256_json
from replaytests.inputs.bank import BankRow
from replaytests.outputs import ledger
from replaytests.outputs.records import Record, title


def z_digest(tokens: list[int], roles: list[int]) -> str:
    return sha256_json({"tokens": tokens, "roles": roles})


def other_z(record: Record, row: BankRow) -> str | None:
    """Token identity: the arms of an ok record that consumed a z other than the bank row's, in one line, or
    None (the conformance test and `replaytests selftest` judge by it)."""
    expected = z_digest(row.tokens, row.roles)
    wrong = sorted(arm for arm in FAMILIES[record.family].arms if record.arms[arm].z_sha256 != expected)
    return f"{record.title}: arms {wrong} consumed a z other than the bank row's" if wrong else None


def z_difference(live: list[int], bank: list[int]) -> dict | None:
    """Where a live z first differs from the bank row's: the index and both token ids (null past an
    end); None where they are equal."""
    index = first_divergence(live, bank)
    if index is None:
        return None
    return {"index": index, "live": live[index] if index < len(live) else None,
            "bank": bank[index] if index < len(bank) else None}


def is_correct(answer: str, expected: str | None) -> bool | None:
    return None if expected is None else answer.strip() == expected.strip()


def arm_record(boundary: Boundary, suffix: Suffix, expected: str | None) -> dict:
    cache_digest, layer_digests = boundary.fingerprint()
    stored = boundary.stored_digest()
    return {
        "suffix": suffix.tokens,
        # top-1 minus top-2 masked logit at each suffix step; null where one token was eligible (forced)
        "margins": [m if math.isfinite(m) else None for m in suffix.margins],
        "answer": suffix.answer,
        "correct": is_correct(suffix.answer, expected),
        "cache_digest": cache_digest,
        "layer_digests": layer_digests,
        "logits_digest": boundary.logits_digest(),
        "z_sha256": z_digest(boundary.tokens, boundary.roles),
        **({"stored_digest": stored} if stored else {}),  # a quantized cache's codes, scales and residual
    }


def compare_arms(pairs, boundaries: dict[str, Boundary], suffixes: dict[str, Suffix],
                 arms: dict[str, dict]) -> dict:
    return {
        f"{a}~{b}": compare_boundaries(boundaries[a], boundaries[b])
        | compare_suffixes(suffixes[a], suffixes[b], arms[a]["correct"], arms[b]["correct"])
        for a, b in pairs
    }


def record_base(family: str, row: BankRow, runtime: Backend) -> dict:
    return {"schema": ledger.SCHEMA, "family": family, "row": row.id, "precision": runtime.cell,
            "cell_digest": runtime.cell_digest, "prefix_len": row.prefix_len, "expected_answer": row.expected_answer}


def excluded(base: dict, exc: FailClosed) -> Record:
    """The record of a row a fail-closed check stopped: the exception type and its message, which
    names the row where the check itself could not."""
    message = str(exc) if base["row"] in str(exc) else f"{title(base['family'], base['row'], base['precision'])}: {exc}"
    return Record.of(base | {"status": "excluded", "reason": f"{type(exc).__name__}: {message}"})


def evaluate(runtime: Backend, row: BankRow, family: Family, build: Callable[[], Iterable[Boundary]],
             extend: Callable[[dict], dict] | None = None) -> Record:
    """Build each arm's boundary (in the family's arm order), check they reached one
    state with no shared storage, continue each with the shared decoder and compare the family's
    pairs. Families whose first arm is live record the live z's length and where it first differs from
    the bank's. `extend`, where given, turns those fields into the family's whole record (what it measures
    beyond its arms). A fail-closed check anywhere, `extend`'s too, excludes the row."""
    arms = family.arms
    base = record_base(family.name, row, runtime)
    runtime.activate()
    try:
        boundaries = dict(zip(arms, build(), strict=True))
        where = title(family.name, row.id, runtime.cell)
        check_same_state(list(boundaries.values()), where)
        check_storage_isolated(list(boundaries.values()), where)
        suffixes = {arm: runtime.suffix(boundaries[arm]) for arm in arms}
    except FailClosed as exc:
        return excluded(base, exc)
    records = {arm: arm_record(boundaries[arm], suffixes[arm], row.expected_answer) for arm in arms}
    z = boundaries[arms[0]].tokens
    live = {"prefix_len": len(z), "z_matches_bank": z == row.tokens,
            "z_first_difference": z_difference(z, row.tokens)} if arms[0] == "live" else {}
    fields = base | live | {"status": "ok", "arms": records,
                            "comparisons": compare_arms(family.pairs, boundaries, suffixes, records)}
    try:
        return Record.of(extend(fields) if extend else fields)
    except FailClosed as exc:
        return excluded(base, exc)
