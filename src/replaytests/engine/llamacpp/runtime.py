"""llama.cpp as the runtime under test (docs/llamacpp.md): a GGUF model as users run it, on CPU.

Its constructions, each on seq 0 of a llama.cpp context:

- live: the prompt block in one call, then one greedy token per call through <|merge|>;
- incremental: one token per call; prefill: the whole prefix in one call;
- chunked: the prefix in calls of `runtime.llamacpp.chunk` tokens (n_batch = n_ubatch);
- prefix_hit: the live request, then the same prefix on the cache it left, as llama.cpp's server reuses a
  prompt (`cache_prompt`): every position but the last kept, the last re-evaluated for its logits. The
  reuse is proven by llama.cpp's own count of the tokens it evaluated (`Served.evaluated`);
- `*_replica`: the same construction in a fresh context;
- a conversation's session, replays and rendering (engine/llamacpp/conversation.py);
- the edge sweep's points around the chunk's multiples (engine/llamacpp/sweep.py).

A boundary keeps the sequence state llama.cpp serializes (its K/V cells and positions), read as K/V
tensors (engine/llamacpp/state.py); the shared suffix decoder loads it into a context and continues
greedily under the structural mask, and a transplant splices layers of one state into another. llama.cpp attends
causally and takes no role masks, so a contract's visibility must be causal, as on vLLM.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from replaytests.backends import CellProblem
from replaytests.engine import backend
from replaytests.engine.backend import ModelFacts, Unsupported
from replaytests.engine.boundary import Boundary, Suffix, steps_digest
from replaytests.engine.conversation import TurnState
from replaytests.engine.llamacpp import build as llamacpp_build
from replaytests.engine.llamacpp import conversation, rollout, sweep
from replaytests.engine.llamacpp.context import (
    INSTALL,
    Context,
    DecodeFailed,
    Model,
    build_record,
    import_llama_cpp,
    system_info,
    version,
)
from replaytests.engine.llamacpp.declaration import LlamaCpp
from replaytests.engine.llamacpp.state import StateCache, StateLayout, splice
from replaytests.engine.protocol import MERGE, Cursor, Delimiters, Grammar, answer_ids, companions, prompt_of
from replaytests.engine.rollout import Rollout
from replaytests.engine.transplant import transplant
from replaytests.errors import BoundaryMismatch, ConfigError, NonFinite
from replaytests.files import open_regular
from replaytests.inputs.contract import Contract

CONSTRUCTIONS = ("incremental", "prefill", "chunked", "prefix_hit", "batched")
TOP_K = 8  # the logits kept per suffix step for the serving comparisons (as vLLM's logprobs)
GGUF_MAGIC = b"GGUF"
COMPUTE_DTYPE = "float32"  # llama.cpp's CPU backend computes activations in f32 whatever the weights' format


@dataclass
class Saved:
    """What a llama.cpp boundary keeps to continue from (its sequence state and length) and what llama.cpp
    counted building it, as a serving engine's counters (families.serving.SERVED)."""

    state: bytes
    length: int
    evaluated: int  # tokens llama.cpp evaluated to build it (n_p_eval + n_eval)
    prompt_block_tokens: int = 0  # the prompt block's tokens: what live computed in one call, not by decoding
    prefill_steps: int | None = None  # llama_decode calls that computed the prefix
    digest: str = ""  # sha256 of the state (K/V cells, positions)
    suffix: Suffix | None = field(default=None, repr=False)  # decoded once per boundary
    steps: tuple = field(default=(), repr=False)  # every suffix step's top-k (id, logit), in rank order
    served: dict | None = None  # an edge sweep point's counters, with what its construction implies (sweep.py)

    def __post_init__(self) -> None:
        self.digest = hashlib.sha256(self.state).hexdigest()

    @property
    def cached_tokens(self) -> int:
        """Prefix tokens read from the cache, not evaluated (llama.cpp's own count): a hit's reuse."""
        return self.length - self.evaluated

    @property
    def steps_digest(self) -> str:
        return steps_digest(self.steps)


def check_gguf(path: Path, option: str) -> None:
    """A GGUF file, by its magic: anything else is one line before llama.cpp reads it."""
    if not path.exists():
        raise ConfigError(f"{path} ({option}): no such file (the llamacpp backend takes a .gguf model file)")
    with open_regular(path, f"the model ({option})", ConfigError) as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{path} ({option}): not a GGUF file (its first bytes are not {GGUF_MAGIC!r})")


class Runtime(LlamaCpp):
    """One GGUF model at one cell on llama.cpp."""

    visibility: ClassVar[str] = "causal"  # load() refuses any other

    def __init__(self, model: Model, contract: Contract, cell: str) -> None:
        self.model, self.contract, self.cell = model, contract, cell
        self.flags = contract.cell(cell)
        self.settings = contract.runtime(self.name)
        self.grammar = grammar_of(model, contract, str(model.path))
        self.context = self._context(self.settings["n_ctx"])
        # the row and the chunked boundaries the edge sweep's position axis made, which its prefix_hit axis reads
        self.swept_chunked: tuple[list[int], dict] | None = None

    # --- the model before its weights ------------------------------------------------------------

    @classmethod
    def inspect(cls, path: Path, contract: Contract, option: str) -> ModelFacts:
        """The GGUF's vocabulary and limits, read by llama.cpp without its weights."""
        check_gguf(path, option)
        model = Model(path, vocab_only=True)
        try:
            grammar = grammar_of(model, contract, f"{path} ({option})")
            arch = model.meta("general.architecture") or "?"
            positions = int(model.meta(f"{arch}.context_length") or 0)
            window = model.meta(f"{arch}.attention.sliding_window")
            layers = model.meta(f"{arch}.block_count") or "?"
            weights = model.weights()
        finally:
            model.close()
        return ModelFacts(grammar, positions, int(window) if window else None,
                          f"{arch}, {layers} layers (GGUF, {weights} weights)", f"{path}")

    @classmethod
    def cell_problem(cls, cell) -> CellProblem | None:
        """llama.cpp computes in f32 with the GGUF's own weights, its K/V cache in f32 (native), f16 or q8_0
        (its type_k/type_v): a cell naming anything else would not run in its format."""
        if cell.dtype != COMPUTE_DTYPE:
            return CellProblem("dtype", f"llama.cpp's CPU backend computes activations in {COMPUTE_DTYPE}, got "
                                        f"{cell.dtype} (select a float32 cell: --precision fp32)")
        return super().cell_problem(cell)

    @property
    def cell_digest(self) -> str:
        return backend.cell_digest(type(self), self.flags)

    @classmethod
    def describe(cls, contract: Contract) -> dict:
        """What the run's environment records of llama.cpp. Its platform part (a change is drift): the
        version, the contract's settings, the ISA the build was pinned to and the CPU features llama.cpp says
        it runs with (system_info, which names llamafile's kernels where they are built in), and for a native
        build the CPU it was compiled for (build_cpu); beside it, the whole build record of
        tools/install-llamacpp.sh."""
        build = build_record() or {}
        settings = {**contract.runtime(cls.name), "version": version(), **llamacpp_build.platform_settings(build),
                    "system_info": system_info(import_llama_cpp())}
        return {"software": {"llama_cpp": version()}, "runtime": {"llamacpp": settings}, "llamacpp_build": build}

    @classmethod
    def load(cls, model_path: Path, contract: Contract, cell: str, device: str | None = None) -> Runtime:
        backend.require_causal(contract, "llama.cpp", "docs/llamacpp.md")
        if (device or contract.device) != "cpu":
            raise ConfigError(f"--device {device or contract.device}: the llamacpp backend runs on the CPU only")
        check_gguf(model_path, "--model")
        settings = contract.runtime(cls.name)
        wanted = settings["version"]
        if wanted is not None and wanted != version():
            raise ConfigError(f"{contract.path}: runtime.llamacpp.version: the contract pins {wanted!r}, this venv "
                              f"has llama-cpp-python {version()!r} ({INSTALL})")
        flags = contract.cell(cell)
        if problem := cls.cell_problem(flags):
            raise ConfigError(f"{contract.path}: cells.{cell}.{problem.field}: {problem.message}")
        if flags.kv_cache.format == "q8_0" and not settings["flash_attention"]:
            raise ConfigError(f"{contract.path}: runtime.llamacpp.flash_attention: expected true for the q8_0 K/V "
                              f"cache of cell {cell} (llama.cpp quantizes a V cache only with flash attention)")
        # the suite's own tensor work (masks, finiteness checks, comparisons) on the contract's threads, as the other
        # backends run it: torch's default (every core) spins against a loaded machine and sums in another order
        torch.set_num_threads(contract.cpu_threads)
        return cls(Model(model_path), contract, cell)

    def _context(self, n_batch: int, sequences: int = 1) -> Context:
        """A context of n_ctx tokens per sequence, evaluating at most n_batch tokens per call."""
        kv = "f32" if self.flags.kv_cache.native else self.flags.kv_cache.format
        return Context(self.model, self.settings["n_ctx"] * sequences, n_batch, self.contract.cpu_threads, kv,
                       self.settings["flash_attention"], sequences)

    def activate(self) -> None:
        """Nothing to re-apply: each context holds its own threads and types."""

    # --- decoding ------------------------------------------------------------------------------------

    def _logits(self, row, step: str) -> torch.Tensor:
        logits = torch.from_numpy(row)
        if not bool(torch.isfinite(logits).all()):
            raise NonFinite(f"llamacpp {step} (logits): {int(torch.isnan(logits).sum())} NaN and "
                            f"{int(torch.isinf(logits).sum())} infinite values of {logits.numel()}")
        return logits

    def feed(self, context: Context, tokens: list[int], step: str) -> torch.Tensor:
        try:
            return self._logits(context.feed(tokens, step), step)
        except DecodeFailed as exc:
            raise BoundaryMismatch(f"llamacpp ({self.cell}): {exc}") from None

    def _masked(self, logits: torch.Tensor, cursor: Cursor) -> torch.Tensor:
        """The logits with every token the structural mask forbids at -inf."""
        return torch.where(self.grammar.eligible(cursor), logits, torch.tensor(float("-inf")))

    def _choose(self, logits: torch.Tensor, cursor: Cursor) -> tuple[int, float, float, tuple]:
        """The greedy token under the structural mask (the first maximal id), its logit, its margin and the
        top-k (id, logit) of the masked row, ties to the lower id (what a suffix step records)."""
        masked = self._masked(logits, cursor)
        best = torch.topk(masked, TOP_K)
        ranked = tuple(sorted(zip(best.indices.tolist(), best.values.tolist(), strict=True),
                              key=lambda item: (-item[1], item[0])))
        return int(masked.argmax()), ranked[0][1], ranked[0][1] - ranked[1][1], ranked

    def feed_every(self, context: Context, tokens: list[int], step: str,
                   rows: Sequence[int] | None = None) -> torch.Tensor:
        """Every token's logits [n, vocab] of one call over `tokens` (a rollout's recompute), or those at the offsets
        `rows` (the edge sweep's points)."""
        try:
            return self._logits(context.feed_every(tokens, step, rows), step)
        except DecodeFailed as exc:
            raise BoundaryMismatch(f"llamacpp ({self.cell}): {exc}") from None

    @contextmanager
    def arm_context(self, construction: str) -> Iterator[Context]:
        """The context an arm runs in, cleared: the runtime's own, or a fresh one for a `*_replica` (closed after)."""
        context = self._fresh() if construction.endswith("_replica") else self.context
        try:
            context.clear()
            yield context
        finally:
            if context is not self.context:
                context.close()

    def boundary_of(self, construction: str, context: Context, tokens: list[int], logits: torch.Tensor,
                    evaluated: int, prefill_steps: int | None, roles: list[int] | None = None) -> Boundary:
        """The state the context holds after `tokens`, saved; their roles by the grammar unless given (a
        rollout's response is outside it)."""
        where = f"llamacpp {construction} ({self.cell})"
        roles = self.grammar.parse(tokens, where) if roles is None else roles
        saved = Saved(context.save(), context.length, evaluated, len(prompt_of(tokens, self.grammar.delims)),
                      prefill_steps)
        return Boundary(construction, list(tokens), roles, self._cache(saved.state, where), logits, saved)

    @staticmethod
    def _cache(state: bytes, where: str) -> StateCache:
        try:
            return StateCache(state)
        except StateLayout as exc:
            raise BoundaryMismatch(f"{where}: llama.cpp's sequence state is not in the layout this backend reads "
                                   f"({exc}); K/V cannot be compared") from None

    def _live(self, context: Context, prompt_block: list[int], construction: str) -> tuple[list[int], torch.Tensor]:
        """Greedy generation from the prompt block until <|merge|> is consumed: its tokens and last logits."""
        tokens, cursor = list(prompt_block), Cursor()
        for token in prompt_block:
            cursor.advance(token, self.grammar)
        logits = self.feed(context, prompt_block, f"{construction} prompt block")
        room = self.settings["n_ctx"] - self.grammar.caps.suffix_room()
        while not (cursor.block == MERGE and cursor.open):
            if len(tokens) >= room:
                raise BoundaryMismatch(f"llamacpp {construction} ({self.cell}): no <|merge|> within "
                                       f"{room} tokens")
            token = int(self._masked(logits, cursor).argmax())  # live records no top-k: the choice alone
            cursor.advance(token, self.grammar)
            tokens.append(token)
            logits = self.feed(context, [token], f"{construction} token {len(tokens) - 1}")
        return tokens, logits

    # --- the Backend protocol ------------------------------------------------------------------------

    def rollout(self, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
        return rollout.live(self, z, length, seed, construction)

    def replay(self, construction: str, z: list[int], response: list[int]) -> Rollout:
        return rollout.replay(self, construction, z, response)

    def session(self, users: list[list[int]], cap: int, closer: int,
                construction: str = "session") -> list[TurnState]:
        return conversation.session(self, users, cap, closer, construction)

    def replayed(self, construction: str, histories: list[list[int]], cap: int, closer: int) -> list[TurnState]:
        return conversation.replayed(self, construction, histories, cap, closer)

    def render(self, template: str, messages: list[dict], generation_prompt: bool) -> str:
        return conversation.render(self, template, messages, generation_prompt)

    def sweep_axes(self, settings: dict) -> tuple[backend.Axis, ...]:
        return sweep.axes(self)

    def sweep(self, axis: backend.Axis, z: list[int], values: Sequence[int], continuation: int):
        return sweep.sweep(self, axis, z, values, continuation)

    def live(self, prompt_block: list[int], construction: str = "live") -> Boundary:
        with self.arm_context(construction) as context:
            before = context.evaluated()
            tokens, logits = self._live(context, prompt_block, construction)
            return self.boundary_of(construction, context, tokens, logits, context.evaluated() - before, 1)

    def build(self, construction: str, z: list[int]) -> Boundary:
        kind = construction.removesuffix("_replica")
        if kind not in CONSTRUCTIONS:
            raise ConfigError(f"llamacpp: unknown construction {construction!r} (expected one of "
                              f"{', '.join(CONSTRUCTIONS)}, or live)")
        replica = construction != kind
        if kind == "chunked":
            context = self._context(self.settings["chunk"])
        elif kind == "batched":
            context = self._context(3 * self.settings["n_ctx"], sequences=3)  # z and its two companions
        else:
            context = self._fresh() if replica else self.context
        try:
            context.clear()
            before, calls = context.evaluated(), context.calls
            if kind == "incremental":
                for i, token in enumerate(z):
                    logits = self.feed(context, [token], f"{construction} token {i}")
            elif kind == "prefix_hit":
                live, _ = self._live(context, prompt_of(z, self.grammar.delims), construction)
                if live != z:
                    raise BoundaryMismatch(f"llamacpp {construction} ({self.cell}): the live request reached "
                                           "another prefix than z (a live replica that differs); no hit to test")
                before, calls = context.evaluated(), context.calls  # the hit: the request after the live one
                context.truncate(len(z) - 1)
                logits = self.feed(context, z[-1:], f"{construction} last token")
            elif kind == "batched":
                others = companions(z, self.grammar.delims)
                logits = self._logits(context.feed_together([z, *others], construction), construction)
                before += sum(map(len, others))  # llama.cpp counts the whole call; the companions' tokens are theirs
            else:
                logits = self.feed(context, z, construction)
            return self.boundary_of(construction, context, z, logits, context.evaluated() - before,
                                  context.calls - calls)
        finally:
            if context is not self.context:
                context.close()

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.model.decode(ids)

    def probe(self, tokens: list[int]) -> torch.Tensor:
        """The last position's logits of one call over `tokens`, in the runtime's own context."""
        self.context.clear()
        return self.feed(self.context, tokens, "probe")

    def _fresh(self) -> Context:
        return self._context(self.settings["n_ctx"])

    def suffix(self, boundary: Boundary) -> Suffix:
        """Continue from the boundary's saved state through <|/answer|> (decoded once per boundary)."""
        saved: Saved = boundary.state
        if saved.suffix is None:
            saved.suffix = self._decode_suffix(boundary)
        return saved.suffix

    def _decode_suffix(self, boundary: Boundary) -> Suffix:
        context, saved = self.context, boundary.state
        try:
            context.load(saved.state, saved.length)
        except DecodeFailed as exc:
            raise BoundaryMismatch(f"llamacpp suffix of {boundary.construction}: {exc}") from None
        cursor, logits = Cursor(block=MERGE, open=True, count=0), boundary.logits
        tokens, margins, top1, steps = [], [], [], []
        while True:
            token, best, margin, ranked = self._choose(logits, cursor)
            steps.append(ranked)
            cursor.advance(token, self.grammar)
            tokens.append(token)
            margins.append(margin)
            top1.append(best)
            if cursor.done:
                break
            logits = self.feed(context, [token], f"suffix token {len(tokens) - 1} of {boundary.construction}")
        saved.steps = tuple(steps)
        return Suffix(tokens, margins, self.model.decode(answer_ids(tokens, self.grammar)), top1)

    def transplant(self, recipient: Boundary, donor: Boundary, layers: Sequence[int] | None = None,
                   parts: Sequence[str] = ("k", "v")) -> Boundary:
        """The recipient's saved state with the selected layers' K and/or V bytes from the donor's, which
        llama.cpp loads as any saved state (engine.transplant checks provenance and the result)."""
        where = f"llamacpp transplant {recipient.construction}<-{donor.construction}"

        def copy(chosen: list[int], selected: tuple[str, ...]) -> tuple[StateCache, Saved]:
            state = splice(recipient.state.state, donor.state.state, chosen, selected, where)
            return self._cache(state, where), Saved(state, recipient.state.length, 0)

        return transplant(recipient, donor, layers, parts, copy)

    def with_batch(self, batch: int) -> Runtime:
        raise Unsupported(f"backend {self.name} runs one sequence per context")

    def first_copy(self, boundary: Boundary) -> Boundary:
        raise Unsupported(f"backend {self.name} runs one sequence per context")


def grammar_of(model: Model, contract: Contract, where: str) -> Grammar:
    """The contract's delimiters, caps and banned tokens resolved in the GGUF's own vocabulary."""
    try:
        delims = Delimiters.resolve(model, contract.delimiters)
        return Grammar(delims, contract.caps, model.n_vocab, model.n_vocab, contract.banned_tokens)
    except ConfigError as exc:
        raise ConfigError(f"{where} with contract {contract.path}: {exc}") from None
