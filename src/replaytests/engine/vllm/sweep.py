"""The edge sweep on vLLM (families/sweep.py): every arm one request, continued greedily for `sweep.continuation`
tokens under the structural mask, its boundary the step that chooses the first of them (the top-k logits after the
mask, as every construction of this backend).

Axes, each with its reference and its edge construction (each arm built twice: the replicas):

- `block_position` (points around multiples of runtime.vllm.block_size): the point's prefix as one cold prompt on an
  emptied prefix cache, against the same prompt as a prefix-cache hit on the cache a request over the row's whole
  prefix left (emptied before it). vLLM reuses whole blocks and recomputes at least the prompt's last token, so the
  hit owes (p - 1) // block * block tokens: a point at or below one block can reuse none (vacuous).
- `chunk_position` (around multiples of runtime.vllm.chunk_budget): the cold prompt against the same prompt on the
  chunked engine (max_num_batched_tokens = the budget), which must split it where it is longer than the budget.
- `fp8_position`, on a cell with an fp8 K/V cache only (around multiples of 96): the cold prompt (its last position
  an L-row prefill query) against the prefix's last token decoded (a 1-row query over the cache the first p - 1
  tokens' prefill wrote). On Hopper, FA3's fp8 kernels tile decode by 96 keys and prefill otherwise, so the two
  split from kv_len 97 on (vLLM #54035, SGLang #25790): the points 95, 96, 97 sit on either side of the first tile
  edge, every later multiple where the tile count changes again.
- `batch` (sweep.batch_sizes): the row's whole prefix alone against it as a needle among N other requests (other
  bank rows' prefixes, drawn with sweep.seed, the needle at a drawn position), on an engine of the axis's own: no
  prefix cache (the requests of one step never read each other's blocks) and max_num_seqs max(batch_sizes) + 1, so
  that the main engine's settings stay the contract's.
- `start` (values 0 and 1: the requests the edge's engine served before it): the first request after an engine
  starts against the first request on another fresh engine (0: a second cold start) and the engine's second
  request (1: a warm repeat). Four fresh engines per row (the replicas too), in this process, one at a time, each
  on an emptied prefix cache; a fresh engine's model, cache, scheduler and request counter are new, this process's
  compiled kernels and allocator are not.

Every arm records the engine's counters (`served`): the prompt tokens it read from the prefix cache
(`cached_tokens`), the tokens each scheduler step computed of it up to the boundary (`schedule`), the requests in
the step that computed its boundary (`co_scheduled`), the engine's own count of the requests before it
(`request_index`), a digest of its continuation's top-k rows; and what the point asks of them: `requires` (the
construction itself, e.g. a cold prompt read nothing from the cache: outside it the point fails) and `premise`
(the least count at which the point crosses its edge at all, e.g. the blocks a hit owes: below it the point is
vacuous). gates.sweep_premise judges both.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from replaytests.engine import stop
from replaytests.engine.backend import Axis
from replaytests.engine.boundary import Boundary, Suffix, steps_digest
from replaytests.engine.protocol import ANSWER
from replaytests.errors import BoundaryMismatch, ConfigError

BLOCK, CHUNK, FP8, BATCH, START = "block_position", "chunk_position", "fp8_position", "batch", "start"
FP8_TILE = 96  # FA3's fp8 decode tile on Hopper (kBlockN 96): decode and prefill split from kv_len 97 (vLLM #54035)
START_VALUES = (0, 1)  # the requests the edge's engine served before it: 0 another fresh engine, 1 a warm repeat
START_FIELD = "requests the engine served before"  # what a start point's value counts (no contract field sets it)
ARMS = ("reference", "reference_replica", "edge", "edge_replica")


@dataclass(frozen=True)
class Arm:
    """A sweep arm's state (Boundary.state): the engine's counters for its request, and the continuation."""

    served: dict
    suffix: Suffix
    steps: tuple  # every continuation step's top-k (id, logit), in rank order (compared bit for bit, not recorded)


def axes(runtime, settings: dict) -> tuple[Axis, ...]:
    """The axes at this cell; the settings (the contract's sweep section and the bank's path) are kept for `sweep`."""
    runtime._sweep_settings = settings
    vllm = runtime.settings
    found = [
        Axis(BLOCK, "the prefix as one prompt on an emptied prefix cache",
             "the prefix as a prefix-cache hit on the blocks the row's whole prefix left",
             (("runtime.vllm.block_size", vllm["block_size"]),)),
        Axis(CHUNK, "the prefix as one prompt, computed in one scheduler step",
             "the prefix on the chunked engine, split into chunks of at most runtime.vllm.chunk_budget tokens",
             (("runtime.vllm.chunk_budget", vllm["chunk_budget"]),)),
    ]
    if not runtime.flags.kv_cache.native:
        found.append(Axis(FP8, "the prefix as one prompt (its last position a prefill query)",
                          "the prefix's last token decoded, one query over the fp8 cache of the tokens before it",
                          ((f"cells.{runtime.cell}.kv_cache.format fp8 decode tile", FP8_TILE),)))
    found += [
        Axis(BATCH, "the row's prefix alone (the batch axis's engine)",
             "the row's prefix among other rows' requests in one engine step", values=tuple(settings["batch_sizes"]),
             field="sweep.batch_sizes"),
        Axis(START, "the first request after an engine starts",
             "the first request on another fresh engine (0) or the same engine's second request (1)",
             values=START_VALUES, field=START_FIELD),
    ]
    return tuple(found)


def check(contract) -> None:
    """The sweep settings the vLLM backend cannot take, refused before any model work in one line."""
    if not contract.settings["sweep"]["batch_sizes"]:
        raise ConfigError(f"{contract.path}: sweep.batch_sizes: the batch axis needs at least one batch size")


# --- requests -----------------------------------------------------------------------------------------------------

def _params(runtime, count: int, forced: Sequence[int] = ()):
    return runtime._vllm.SamplingParams(
        temperature=0.0, max_tokens=len(forced) + count, logprobs=runtime.settings["logprobs"], ignore_eos=True,
        stop_token_ids=[runtime.grammar.delims.closers[ANSWER]], detokenize=False, seed=0,
        extra_args={"replaytests": {"grammar": runtime._key, "forced": list(forced)}})


def _generate(runtime, engine, prompts: list[list[int]], params: list, reset: bool):
    """One generate call over the prompts (one batch of requests); each output with the scheduler's steps of it."""
    stop.check()  # between requests: vLLM's own steps cannot be cut
    if reset:
        engine.reset_prefix_cache()
    runtime._steps.clear()
    prompt_type = runtime._vllm.inputs.TokensPrompt
    return engine.generate([prompt_type(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def scheduled(steps: list[dict[str, int]], request_id: str) -> list[tuple[int, int]]:
    """Each scheduler step (the scheduler's plans, as the runtime records them) that ran the request: (the requests
    the step ran, the tokens it computed of this one). The scheduler knows a request by its id plus a suffix of its
    own ("0-b81ba0b0" for request "0")."""
    return [(len(step), tokens) for step in steps for rid, tokens in step.items()
            if rid == request_id or rid.startswith(f"{request_id}-")]


def _counted(runtime, out, prompt_len: int, forced: int) -> dict:
    """The engine's counters for one request: the tokens each scheduler step computed of it up to the step that
    computed its boundary (the prompt's uncached tokens, then each forced token), and the requests in that step."""
    rid = out.request_id
    mine = scheduled(runtime._steps, rid)
    cached = out.num_cached_tokens or 0
    owed, done, schedule, together = prompt_len - cached + forced, 0, [], None
    for size, tokens in mine:
        if done >= owed:
            break
        done += tokens
        schedule.append(tokens)
        together = size
    prefill, computed = 0, 0
    for tokens in schedule:
        if computed >= prompt_len - cached:
            break
        computed, prefill = computed + tokens, prefill + 1
    return {"cached_tokens": cached, "schedule": schedule, "prefill_steps": prefill,
            "decoded": len(schedule) - prefill, "co_scheduled": together, "request_index": int(rid)}


def _arm(runtime, construction: str, z: list[int], roles: list[int], out, forced: int, continuation: int,
         served: dict) -> tuple[Boundary, Suffix]:
    """A request's boundary (the step after its prompt and forced tokens) and continuation."""
    completion = out.outputs[0]
    where = f"vllm sweep {construction} at {len(z)} tokens ({runtime.cell})"
    tokens = list(completion.token_ids)
    if tokens[:forced] != z[len(z) - forced:]:
        raise BoundaryMismatch(f"{where}: the forced decode chose other tokens than the prefix's")
    steps = [sorted(((t, lp.logprob) for t, lp in step.items()), key=lambda item: -item[1])
             for step in completion.logprobs[forced:]]
    chosen = tokens[forced:]
    if not chosen or len(chosen) > continuation or (len(chosen) < continuation and
                                                    chosen[-1] != runtime.grammar.delims.closers[ANSWER]):
        raise BoundaryMismatch(f"{where}: the request ended by {completion.finish_reason} after {len(chosen)} of "
                               f"{continuation} continuation tokens, not at <|/answer|>")
    if any(len(step) < 2 for step in steps):
        raise ConfigError(f"{where}: runtime.vllm.logprobs: a margin needs the top 2 logits of each step")
    suffix = Suffix(chosen, [s[0][1] - s[1][1] for s in steps], runtime.tokenizer.decode(chosen),
                    [s[0][1] for s in steps])
    state = Arm(served | {"steps_digest": steps_digest(steps)}, suffix, tuple(tuple(step) for step in steps))
    return Boundary(construction, list(z), list(roles), None, runtime._logits(steps[0]), state), suffix


def _one(runtime, engine, construction: str, z: list[int], roles: list[int], continuation: int, *, reset: bool = True,
         forced: int = 0, requires: dict | None = None, premise: dict | None = None, extra: dict | None = None):
    """z as one request (its last `forced` tokens forced one decode step each), continued."""
    prompt = z[:len(z) - forced]
    (out,) = _generate(runtime, engine, [prompt], [_params(runtime, continuation, z[len(prompt):])], reset)
    served = _counted(runtime, out, len(prompt), forced) | (extra or {})
    return _arm(runtime, construction, z, roles, out, forced, continuation,
                served | {"requires": requires or {}, "premise": premise or {}})


COLD = {"cached_tokens": [0, 0]}  # a request on an emptied prefix cache reads nothing from it


# --- the axes -----------------------------------------------------------------------------------------------------

class Sweep:
    """One row's sweep at one cell: the cold prompts on the main engine are shared by the position axes (the same
    request, the reference of each)."""

    def __init__(self, runtime, z: list[int]) -> None:
        self.runtime, self.z = runtime, z
        self.roles = runtime.grammar.parse(z, f"vllm sweep ({runtime.cell})")
        self.cold: dict[tuple[int, int], tuple[dict, int]] = {}

    def prefix(self, p: int) -> tuple[list[int], list[int]]:
        if not 1 <= p <= len(self.z):
            raise ConfigError(f"vllm sweep: a point at {p} tokens lies outside the row's prefix ({len(self.z)})")
        return self.z[:p], self.roles[:p]

    def references(self, p: int, continuation: int) -> dict:
        """The point's prefix as one cold prompt on the main engine, twice."""
        key = (p, continuation)
        if key not in self.cold:
            z, roles = self.prefix(p)
            self.cold[key] = {arm: _one(self.runtime, self.runtime.engine, arm, z, roles, continuation,
                                        requires=COLD | {"prefill_steps": [1, 1]}) for arm in ARMS[:2]}
        return self.cold[key]

    def block(self, p: int, continuation: int) -> dict:
        runtime, size = self.runtime, self.runtime.settings["block_size"]
        z, roles = self.prefix(p)
        owed = (p - 1) // size * size  # whole blocks, the prompt's last token recomputed
        built = dict(self.references(p, continuation))
        for arm in ARMS[2:]:
            (left,) = _generate(runtime, runtime.engine, [self.z], [_params(runtime, 1)], reset=True)
            if left.num_cached_tokens:
                raise BoundaryMismatch(f"vllm sweep {arm} at {p} tokens ({runtime.cell}): the request that "
                                       f"fills the cache read {left.num_cached_tokens} tokens from an emptied one")
            built[arm] = _one(runtime, runtime.engine, arm, z, roles, continuation, reset=False,
                              premise={"cached_tokens": max(owed, 1)}, extra={"owed_tokens": owed,
                                                                              "cache_from": len(self.z)})
        return built

    def chunk(self, p: int, continuation: int) -> dict:
        runtime, budget = self.runtime, self.runtime.settings["chunk_budget"]
        z, roles = self.prefix(p)
        built = dict(self.references(p, continuation))
        for arm in ARMS[2:]:
            built[arm] = _one(runtime, runtime.chunked_engine, arm, z, roles, continuation, requires=COLD,
                              premise={"prefill_steps": 2} if p > budget else {})
        return built

    def fp8(self, p: int, continuation: int) -> dict:
        z, roles = self.prefix(p)
        if p < 2:
            raise ConfigError(f"vllm sweep: {FP8} at {p} tokens: the edge decodes the prefix's last token after a "
                              "prompt of at least one")
        built = dict(self.references(p, continuation))
        for arm in ARMS[2:]:
            built[arm] = _one(self.runtime, self.runtime.engine, arm, z, roles, continuation, forced=1,
                              requires=COLD | {"prefill_steps": [1, 1]}, premise={"decoded": 1})
        return built

    def batch(self, n: int, continuation: int, engine) -> dict:
        runtime = self.runtime
        built = {arm: _one(runtime, engine, arm, self.z, self.roles, continuation,
                           requires=COLD | {"co_scheduled": [1, 1]}) for arm in ARMS[:2]}
        others, position = _others(runtime._sweep_settings, self.z, n)
        prompts = [tokens for _, tokens in others]
        prompts.insert(position, self.z)
        for arm in ARMS[2:]:
            params = [_params(runtime, continuation) for _ in prompts]
            outs = _generate(runtime, engine, prompts, params, reset=True)
            out = outs[position]
            served = _counted(runtime, out, len(self.z), 0) | {
                "batch": len(prompts), "position": position, "others": [row for row, _ in others],
                "requires": COLD, "premise": {"co_scheduled": len(prompts)}}
            built[arm] = _arm(runtime, arm, self.z, self.roles, out, 0, continuation, served)
        return built

    def start(self, values: Sequence[int], continuation: int) -> dict[int, dict]:
        """Four fresh engines, one at a time: the reference and its replica each the first request of one (and
        each engine's second request the warm repeat of its point 1), the cold starts of point 0 two more."""
        runtime = self.runtime
        built: dict[int, dict] = {value: {} for value in values}

        def first_and_warm(engine, first: str, warm: str) -> None:
            head = _one(runtime, engine, first, self.z, self.roles, continuation,
                        requires=COLD | {"request_index": [0, 0]})
            for value in values:
                built[value][first] = head
            if 1 in values:
                built[1][warm] = _one(runtime, engine, warm, self.z, self.roles, continuation,
                                      requires=COLD | {"request_index": [1, 1]})

        def only_first(engine, arm: str) -> None:
            built[0][arm] = _one(runtime, engine, arm, self.z, self.roles, continuation,
                                 requires=COLD | {"request_index": [0, 0]})

        for first, warm in (("reference", "edge"), ("reference_replica", "edge_replica")):
            _on(runtime.fresh_engine, lambda engine, first=first, warm=warm: first_and_warm(engine, first, warm))
        if 0 in values:
            for arm in ARMS[2:]:
                _on(runtime.fresh_engine, lambda engine, arm=arm: only_first(engine, arm))
        return built


def _close(engine) -> None:
    """Free an engine's model and K/V cache without tearing down what the process's other engines share. vLLM's own
    shutdown (EngineCore.shutdown, also the client's finalizer when the engine is collected) ends in
    cleanup_dist_env_and_memory, which destroys the process's distributed state under every other engine ("pipeline
    model parallel group is not initialized" at their next step): so its finalizer is detached, and its parts are shut
    down as that shutdown does, but that last step; the engine's startup gc.freeze() is undone so that it is collected.
    The caller drops its last reference and collects."""
    client = engine.llm_engine.engine_core
    core = client.engine_core
    client._finalizer.detach()
    core.structured_output_manager.clear_backend()
    core.model_executor.shutdown()
    core.scheduler.shutdown()
    gc.unfreeze()


def _on(make, use):
    """`use(engine)` on an engine `make()` starts, the engine freed once it returns (one alive at a time)."""
    engine = make()
    try:
        return use(engine)
    finally:
        _close(engine)
        del engine
        gc.collect()


def _others(settings: dict, z: list[int], n: int) -> tuple[list[tuple[str, list[int]]], int]:
    """The `n` requests beside a row in a batch, drawn with sweep.seed from the bank's other rows (each one's whole
    prefix; where the bank holds fewer, they repeat), and the needle's position among them."""
    from replaytests.inputs.bank import read_prefixes

    bank = settings.get("bank")
    if bank is None:
        raise ConfigError("vllm sweep: the batch axis draws the requests beside a row from the bank's other rows, "
                          "and the sweep's settings name no bank")
    pool = [(row, tokens) for row, (tokens, _) in sorted(read_prefixes(Path(bank)).items()) if tokens != z]
    if not pool:
        raise ConfigError(f"{bank}: sweep.batch_sizes: the batch axis needs another row than the swept one")
    digest = hashlib.sha256(json.dumps(z).encode()).hexdigest()
    rng = random.Random(f"{settings['seed']}:{n}:{digest}")
    drawn = [pool[i] for i in rng.sample(range(len(pool)), min(n, len(pool)))]
    drawn += [drawn[i % len(drawn)] for i in range(n - len(drawn))]
    return drawn, rng.randrange(n + 1)


def sweep(runtime, axis: Axis, z: list[int], values: Sequence[int],
          continuation: int) -> Iterator[tuple[int, dict[str, tuple[Boundary, Suffix]]]]:
    if getattr(runtime, "_sweep_row", None) is None or runtime._sweep_row.z != z:
        runtime._sweep_row = Sweep(runtime, z)
    row = runtime._sweep_row
    if axis.name == START:
        built = row.start(values, continuation)
        for value in values:
            yield value, built[value]
        return
    if axis.name == BATCH:  # every point on one engine of the axis's own, freed after the row's last
        built = _on(runtime.batch_engine, lambda engine: {n: row.batch(n, continuation, engine) for n in values})
        for value in values:
            yield value, built[value]
        return
    build = {BLOCK: row.block, CHUNK: row.chunk, FP8: row.fp8}.get(axis.name)
    if build is None:
        raise ConfigError(f"vllm sweep: unknown axis {axis.name!r}")
    for value in values:
        yield value, build(value, continuation)
