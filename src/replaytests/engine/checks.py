"""The replay properties of a model, checked on short synthetic rows: what `replaytests check-model`
reports before a long audit, and what the architecture matrix holds every decoder family to. Any
backend: only the seam's methods (engine.backend) and its `probe` are used.

On one runtime (one cell), from a seeded synthetic z (a prompt, three short branches, <|merge|>):

| mask           | a key the visibility contract hides has no influence on a query; a visible one has   |
| batch          | the physical-batch copies stay bitwise equal in every construction (`physical_batch`) |
| bridge         | live and incremental of the live z are bit-exact: cache, logits and suffix            |
| suffix         | incremental and prefill give one suffix (judged in an exact cell, recorded in others) |
| self_transplant| prefill's cache copied into its own replica reproduces prefill's trajectory            |
| storage        | no two arms share tensor storage                                                       |
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from replaytests.engine.backend import Backend, Unsupported
from replaytests.engine.boundary import Boundary, bitwise_equal, check_storage_isolated
from replaytests.engine.comparisons import first_divergence
from replaytests.engine.protocol import parse_prefix, prompt_of
from replaytests.errors import FailClosed

PROPERTIES = ("mask", "batch", "bridge", "suffix", "self_transplant", "storage")
# The property a fail-closed error breaks while the arms are built (any other: the constructions, "batch").
FAILS = {"PhysicalBatchDesync": "batch", "StorageAliasing": "storage", "TransplantRefused": "self_transplant"}


@dataclass(frozen=True)
class Check:
    name: str
    cell: str
    outcome: str  # "ok", "fail", "recorded" (a finding the protocol allows), "not run"
    detail: str = ""


@dataclass(frozen=True)
class Cost:
    """What one synthetic row cost, to scale to a bank's lengths."""

    call_s: float  # seconds per single-token forward call (incremental and decoding)
    prefill_s_per_token: float
    cache_bytes_per_token: float  # one boundary's K/V, physical batch included


@dataclass(frozen=True)
class Result:
    checks: list[Check]
    cost: Cost | None  # None where the constructions failed closed
    suffixes: dict[str, list[int]]  # each construction's suffix (incremental, prefill, live, ...)


def synthetic_z(runtime: Backend, seed: int, prompt: int = 8, branch: int = 6) -> list[int]:
    """A valid boundary prefix: a prompt block of `prompt` content tokens, three branches of
    min(branch, cap) content tokens each, then <|merge|>; content ids drawn with `seed`. The one maker of
    synthetic prefixes: check-model, the architecture matrix and the benchmarks use it."""
    grammar, delims = runtime.grammar, runtime.grammar.delims
    content = _content_ids(runtime)
    draw = random.Random(seed)
    branch = min(branch, grammar.caps.branch)
    z = [delims.openers[0], *draw.choices(content, k=prompt), delims.closers[0]]
    for block in (1, 2, 3):
        z += [delims.openers[block], *draw.choices(content, k=branch), delims.closers[block]]
    z.append(delims.openers[4])
    parse_prefix(z, grammar, "synthetic row")
    return z


def _content_ids(runtime: Backend) -> list[int]:
    return [int(i) for i in runtime.grammar.content.nonzero().flatten()]


def check_mask(runtime: Backend, z: list[int]) -> Check:
    """A branch-2 query sees the prompt, never branch 1: changing the last branch-1 token must leave its
    logits bit for bit, changing a prompt token must not (the negative control: the probe reaches the model).
    Under causal visibility branch 1 is seen, so changing it must change the logits too."""
    delims, name = runtime.grammar.delims, runtime.cell
    tokens = z[: z.index(delims.closers[2])]  # ends inside branch 2
    branch_1, seen = tokens.index(delims.closers[1]) - 1, 1
    content = _content_ids(runtime)

    def changed(at: int) -> list[int]:
        other = next(t for t in content if t != tokens[at])
        return [other if i == at else t for i, t in enumerate(tokens)]

    try:
        reference = runtime.probe(tokens)
    except Unsupported as exc:
        return Check("mask", name, "not run", str(exc))
    moved = not bitwise_equal(runtime.probe(changed(branch_1)), reference)
    if moved and runtime.visibility == "roles":
        return Check("mask", name, "fail", f"changing branch-1 token {branch_1} changed a branch-2 query's logits")
    if not moved and runtime.visibility == "causal":
        return Check("mask", name, "fail", f"changing branch-1 token {branch_1} left a branch-2 query's logits "
                                           "unchanged under causal visibility: the mask hides what it should show")
    if bitwise_equal(runtime.probe(changed(seen)), reference):
        return Check("mask", name, "fail", f"changing prompt token {seen} left the logits unchanged: the 4D mask "
                                           "or the probe does not reach the model")
    return Check("mask", name, "ok")


def check_runtime(runtime: Backend, z: list[int], exact: bool) -> Result:
    """Every property on one runtime, what the row cost and the suffixes; a property that could not run
    because an earlier one failed closed is "not run". `exact`: whether incremental and prefill must give
    one suffix in this cell (the contract's crossing gate), else a divergence is recorded."""
    name = runtime.cell
    runtime.activate()
    try:
        started = time.perf_counter()
        incremental = runtime.build("incremental", z)
        incremental_s = time.perf_counter() - started
        started = time.perf_counter()
        prefill = runtime.build("prefill", z)
        prefill_s = time.perf_counter() - started
        arms = {"incremental": incremental, "prefill": prefill,
                "prefill_replica": runtime.build("prefill_replica", z),
                "live": runtime.live(prompt_of(z, runtime.grammar.delims))}
        arms["bridge"] = runtime.build("incremental", arms["live"].tokens)
        suffixes = {arm: runtime.suffix(boundary) for arm, boundary in arms.items()}
        moved = runtime.suffix(runtime.transplant(arms["prefill_replica"], arms["prefill"]))
        batch = (Check("batch", name, "ok") if "physical_batch" in runtime.capabilities else
                 Check("batch", name, "not run", f"backend {runtime.name} runs no physical batch"))
        checks = [check_mask(runtime, z), batch]
    except FailClosed as exc:  # the property it breaks fails; what comes after it cannot run
        broken = FAILS.get(type(exc).__name__, "batch")
        failed = Check(broken, name, "fail", f"{type(exc).__name__}: {exc}")
        return Result([failed, *(Check(p, name, "not run") for p in PROPERTIES if p != broken)], None, {})
    checks.append(_bridge(arms["live"], arms["bridge"], suffixes["live"].tokens, suffixes["bridge"].tokens, name))
    checks.append(_suffix(suffixes["incremental"].tokens, suffixes["prefill"].tokens, name, exact))
    own = suffixes["prefill"].tokens
    checks.append(Check("self_transplant", name, "ok") if moved.tokens == own else Check(
        "self_transplant", name, "fail", f"prefill's cache in its replica diverges at suffix index "
                                         f"{first_divergence(moved.tokens, own)}"))
    try:
        check_storage_isolated([arms[a] for a in ("incremental", "prefill", "prefill_replica", "live")], name)
        checks.append(Check("storage", name, "ok"))
    except FailClosed as exc:
        checks.append(Check("storage", name, "fail", str(exc)))
    calls = len(z) - len(prompt_of(z, runtime.grammar.delims)) + 1
    cost = Cost(incremental_s / calls, prefill_s / len(z), _cache_bytes(prefill) / len(z))
    return Result(checks, cost, {arm: suffix.tokens for arm, suffix in suffixes.items()})


def _bridge(live: Boundary, incremental: Boundary, live_suffix: list[int], suffix: list[int], name: str) -> Check:
    differs = [what for what, same in (("cache", live.cache_digest() == incremental.cache_digest()),
                                       ("boundary logits", live.logits_digest() == incremental.logits_digest()),
                                       ("suffix", live_suffix == suffix)) if not same]
    return Check("bridge", name, "fail", f"live and incremental differ in {', '.join(differs)}") if differs else \
        Check("bridge", name, "ok")


def _suffix(incremental: list[int], prefill: list[int], name: str, exact: bool) -> Check:
    if incremental == prefill:
        return Check("suffix", name, "ok")
    at = f"incremental and prefill suffixes diverge at index {first_divergence(incremental, prefill)}"
    return Check("suffix", name, "fail" if exact else "recorded", at)


def _cache_bytes(boundary: Boundary) -> int:
    return sum(t.nbytes for kv in boundary.layers for t in kv)


def row_estimate(cost: Cost, prefix_len: int, runtime: Backend) -> tuple[float, int]:
    """Seconds and bytes of one crossing row at `prefix_len` tokens: two incremental constructions,
    two prefills and four suffixes at the short row's per-call cost (an estimate: longer caches cost
    more per call, a short row's first calls more than later ones), and four boundary caches held."""
    suffix = runtime.grammar.caps.suffix_room()
    seconds = 2 * prefix_len * cost.call_s + 2 * prefix_len * cost.prefill_s_per_token + 4 * suffix * cost.call_s
    return seconds, int(4 * (prefix_len + suffix) * cost.cache_bytes_per_token)
