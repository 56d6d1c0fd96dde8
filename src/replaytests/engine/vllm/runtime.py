"""The vLLM backend (engine.backend): one engine per cell, one request per construction.

A construction is one request that decodes from its prompt through <|/answer|> under the structural
mask (engine.vllm.mask); its boundary is the step that chooses the first merge-content token, and its
suffix is what the same request decoded from there (a serving engine continues no state it did not
build itself). What vLLM hands back are top-k logits (`processed_logits`: after the mask), so a
boundary carries those in place of K/V and the full logit row.

- `live`: the prompt block, decoded greedily through the merge opener and on.
- `incremental`: the prompt block, then z's later tokens forced one decode step each (the live path,
  teacher-forced), then the suffix.
- `prefill`: z as one prompt, on an empty prefix cache.
- `prefix_hit`: z as one prompt on the cache the request before it left (the family runs it right
  after `live`); its `served.cached_tokens` is the engine's own count of reused tokens.
- `chunked`: z as one prompt on a second engine whose token budget (runtime.vllm.chunk_budget) splits
  the prefill; `served.prefill_steps` is the count of scheduler steps the prompt took, as the
  scheduler itself planned them.
- `batched`: z as one prompt beside two other requests of the same problem in one engine step.
Each `X_replica` is the same request again on an empty cache.

The conversation family's constructions (engine/vllm/conversation.py) are requests on the main engine: the session
in sequence on the prefix cache the turns before it left, every other one on an emptied cache.

The rollout families' arms (engine/vllm/rollout.py) run on an engine of their own, whose logprobs mode is
raw_logprobs (the suite's definition of a log-probability), with no structural mask.

The edge sweep's points (engine/vllm/sweep.py) are requests on the main and the chunked engine, on an engine of the
batch axis's own (no prefix cache, max_num_seqs for the largest batch) and on fresh engines (the start axis).
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from replaytests.backends import CellProblem
from replaytests.engine import backend, stop
from replaytests.engine.backend import Unsupported
from replaytests.engine.boundary import Boundary, Suffix, steps_digest
from replaytests.engine.comparisons import first_divergence
from replaytests.engine.conversation import TurnState
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import inspection
from replaytests.engine.protocol import ANSWER, MERGE, Delimiters, Grammar, answer_ids, companions, prompt_of
from replaytests.engine.rollout import Rollout
from replaytests.engine.vllm import conversation
from replaytests.engine.vllm import rollout as rollouts
from replaytests.engine.vllm import sweep as sweeps
from replaytests.engine.vllm.declaration import VLLM
from replaytests.engine.vllm.rollout import LogprobsUnchecked
from replaytests.errors import BoundaryMismatch, ConfigError, NotServedAsAsked, shorten
from replaytests.files import lookup, read_json
from replaytests.inputs.contract import Contract
from replaytests.inputs.cpu_isa import ATEN, ONEDNN, cpu_flags

INSTALL = "bash tools/install-vllm.sh .venv-vllm (docs/vllm.md)"
CONSTRUCTIONS = ("incremental", "prefill", "prefix_hit", "chunked", "batched")
CPU_BLOCK = 32  # vLLM's CPU attention takes block sizes that are multiples of 32 only
_LOWEST = torch.finfo(torch.float32).min  # every logit vLLM did not return (and every masked one)


def environment(contract: Contract) -> dict[str, str]:
    """The variables vLLM reads at import and engine start: in-process engine core (the structural mask
    needs this process's grammar), offline, the KV cache size, the contract's thread count."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(contract.runtime(VLLM.name)["kv_cache_gib"]),
            "OMP_NUM_THREADS": str(contract.cpu_threads),
            "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def cpu_kernels(flags: set[str] | None = None) -> str:
    """The instruction set vLLM's own CPU kernels (its GEMMs, its attention) run here: the best this CPU
    has, capped by the pin (environment.cpu_isa, through ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA)."""
    flags = (cpu_flags() or set()) if flags is None else flags
    onednn, aten = os.environ.get(ONEDNN), os.environ.get(ATEN)
    if "amx_tile" in flags and (onednn in (None, "ALL", "DEFAULT") or "AMX" in onednn):
        return "AMX"
    if "avx512f" in flags and aten in (None, "avx512"):
        return "AVX512"
    return "below AVX512"


GEMMS = {"onednn_mm": "oneDNN", "weight_packed_linear_cpu": "sgl-kernel", "zentorch_linear_unary": "zentorch"}
SMALL_WEIGHT_GEMM = "sgl-kernel"  # vLLM's choice for small weights (router and gate projections) on AMX


def gemm_of(cpu_linear) -> str:
    """The GEMM vLLM's CPU dispatch (model_executor/layers/utils.py, dispatch_cpu_unquantized_gemm) bound to a
    linear layer, read from the function it stored as the layer's `cpu_linear`: "torch" is its fallback to
    torch.nn.functional.linear ("fallback to torch linear" in its log)."""
    if cpu_linear is torch.nn.functional.linear:
        return "torch"
    names = getattr(getattr(cpu_linear, "__code__", None), "co_names", ())
    return next((kind for name, kind in GEMMS.items() if name in names), "torch" if "linear" in names else "unknown")


@functools.cache
def dense_gemm(dtype: str) -> str:
    """The GEMM vLLM binds a dense projection of this dtype to here, under this process's pin: its own dispatch
    run on a 1024x1024 layer (over the 1 MiB below which it may take the small-weight path). Under the AVX2
    pin BF16 and FP16 fall back to torch's linear (oneDNN cannot make their matmul), FP32 runs oneDNN."""
    from vllm.model_executor.layers import utils

    layer = torch.nn.Linear(1024, 1024, bias=False, dtype=getattr(torch, dtype))
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return gemm_of(layer.cpu_linear)


def _follow_pin() -> None:
    """vLLM picks its CPU kernels by asking torch what the hardware has (torch.cpu._is_amx_tile_supported,
    _is_avx512_supported), not what the pin allows. On a CPU with AMX under any pin, its BF16 GEMMs then
    pack weights for AMX, and torch's oneDNN, capped below AMX, aborts the process ("BFloat16 Brgemm VNNI
    format is only supported ... when amx is supported"). So those questions get the pinned answer."""
    level = cpu_kernels()
    if level != "AMX":
        torch.cpu._is_amx_tile_supported = lambda: False
    if level == "below AVX512":
        torch.cpu._is_avx512_supported = lambda: False


def import_vllm(contract: Contract):
    """The vllm module, after setting its environment; a missing or broken install is one line."""
    os.environ.update(environment(contract))
    # vLLM binds its OpenMP threads to the first cores of a NUMA node: the engines of several xdist
    # workers would all share those cores. Binding never changes a number; a user's choice is kept.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if contract.device == "cpu":
        _follow_pin()
    try:
        import vllm
    except Exception as exc:
        raise ConfigError(f"--backend vllm: cannot import vllm ({type(exc).__name__}: "
                          f"{shorten(str(exc).splitlines()[0] if str(exc) else '')}); install it in a venv of its "
                          f"own: {INSTALL}") from None
    return vllm


def version() -> str | None:
    """vLLM's version where it is installed here (read without importing it), else None."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return None


@dataclass(frozen=True)
class Served:
    """What one request gave besides its boundary and suffix: the engine's counters for it."""

    cached_tokens: int  # RequestOutput.num_cached_tokens: prompt tokens read from the prefix cache
    # the tokens of full blocks inside z's prompt block (prefill-computed in live); in a conversation's session
    # turn k >= 2, inside turn k-1's prompt (prefill-computed in that turn); 0 elsewhere
    prompt_block_tokens: int
    prefill_steps: int | None  # scheduler steps that computed the prompt (None: not observable here)
    steps_digest: str  # sha256 of every suffix step's top-k (id, logit), in rank order
    suffix: Suffix
    steps: tuple[tuple[tuple[int, float], ...], ...] = ()  # every suffix step's top-k (id, logit): not recorded


def _fp8_kv_cache_runs() -> bool:
    """Whether vLLM can run an fp8 K/V cache here: on CUDA, or on a CPU whose kernels, as pinned, are
    AVX-512 or AMX (vLLM's own test, v1/attention/backends/cpu_attn.py, asks torch, which _follow_pin
    answers with the pinned level)."""
    return torch.cuda.is_available() or cpu_kernels() != "below AVX512"


class Runtime(VLLM):
    """One model at one cell on vLLM."""

    visibility: ClassVar[str] = "causal"  # load() refuses any other
    rollout_logprobs_mode: ClassVar[str] = rollouts.LOGPROBS_MODE  # the rollout engine's (a test may set another)
    inspect = staticmethod(inspection.inspect)  # vLLM serves Hugging Face directories
    check_loadable = staticmethod(hf_adapter.check_tensors)

    def __init__(self, model_dir: Path, contract: Contract, cell: str, device: str, vllm) -> None:
        self.model_dir, self.contract, self.cell, self._vllm = model_dir, contract, cell, vllm
        self.settings = contract.runtime(self.name)
        self.flags = contract.cell(cell)
        self.dtype = self.flags.dtype
        self.engine = self._engine(budget=None)
        self.tokenizer = self.engine.get_tokenizer()
        config = self.engine.llm_engine.model_config.hf_config
        delims = Delimiters.resolve(self.tokenizer, contract.delimiters)
        self.grammar = Grammar(delims, contract.caps, config.vocab_size, len(self.tokenizer), contract.banned_tokens,
                               device)
        self.vocab = config.vocab_size
        self._key = f"{id(self)}"
        from replaytests.engine.vllm import mask

        mask.GRAMMARS[self._key] = self.grammar
        self._chunked = None
        self._rollout = None
        self._sweep_settings: dict = {}  # the contract's sweep section and the bank's path (sweep_axes)
        self._sweep_row = None  # the row being swept (engine/vllm/sweep.py)
        self._steps: list[dict[str, int]] = []
        self._watch(self.engine)
        self._check_pins(self.engine)

    @classmethod
    def cell_problem(cls, cell) -> CellProblem | None:
        """vLLM runs a cell's dtype with a native K/V cache or one of its own fp8 caches (kv_cache_dtype), with
        the checkpoint's own weights; its fp8 caches only where its CPU attention has the kernels for them."""
        if problem := super().cell_problem(cell):
            return problem
        if not cell.kv_cache.native and not _fp8_kv_cache_runs():
            return CellProblem("kv_cache.format", f"vLLM's CPU attention runs an {cell.kv_cache.format} K/V cache only "
                                                  f"with AVX-512 or AMX kernels, and its kernels here are "
                                                  f"{cpu_kernels()} (on an AVX-512 CPU, a contract pinning "
                                                  "environment.cpu_isa AVX512 gives them)")
        return None

    @property
    def cell_digest(self) -> str:
        return backend.cell_digest(type(self), self.flags)

    @classmethod
    def load(cls, model_dir: Path, contract: Contract, cell: str, device: str | None = None) -> Runtime:
        backend.require_causal(contract, "vLLM", "docs/vllm.md")
        contract.cell(cell)
        device = device or contract.device
        block = contract.runtime(cls.name)["block_size"]
        if device == "cpu" and block % CPU_BLOCK:
            raise ConfigError(f"{contract.path}: runtime.vllm.block_size: expected a multiple of {CPU_BLOCK} on CPU "
                              f"(vLLM's CPU attention refuses others), got {block}")
        sweeps.check(contract)
        vllm = import_vllm(contract)
        torch.set_num_threads(contract.cpu_threads)
        return cls(model_dir, contract, cell, device, vllm)

    def _engine(self, budget: int | None, logprobs_mode: str = "processed_logits", max_num_seqs: int | None = None,
                prefix_caching: bool | None = None):
        """A vLLM engine; `budget` splits every prefill into chunks of at most that many tokens; `max_num_seqs` and
        `prefix_caching` replace the contract's (the sweep's batch engine)."""
        from replaytests.engine.vllm.mask import StructuralMask

        length = int(lookup(read_json(self.model_dir / "config.json", "model config", ConfigError),
                            "max_position_embeddings"))
        settings = self.settings
        try:
            return self._vllm.LLM(
                str(self.model_dir), tokenizer=str(self.model_dir), dtype=self.dtype, seed=0,
                kv_cache_dtype="auto" if self.flags.kv_cache.native else self.flags.kv_cache.format,
                enforce_eager=settings["enforce_eager"], block_size=settings["block_size"],
                enable_prefix_caching=settings["prefix_caching"] if prefix_caching is None else prefix_caching,
                enable_chunked_prefill=True, max_model_len=length, max_num_batched_tokens=budget or length,
                max_num_seqs=max_num_seqs or settings["max_num_seqs"],
                logits_processors=[StructuralMask], logprobs_mode=logprobs_mode,
                max_logprobs=settings["logprobs"], trust_remote_code=False)
        except Exception as exc:
            raise ConfigError(f"--backend vllm: the engine did not start on {self.model_dir} "
                              f"({type(exc).__name__}: {shorten(str(exc))})") from None

    def _watch(self, engine) -> None:
        """Log each scheduler step's tokens per request (the only place a chunked prefill shows)."""
        try:
            scheduler = engine.llm_engine.engine_core.engine_core.scheduler
        except AttributeError:  # another vLLM layout: chunks are then not observed (prefill_steps None)
            return
        planned = scheduler.schedule

        def schedule(*args, **kwargs):
            out = planned(*args, **kwargs)
            self._steps.append(dict(out.num_scheduled_tokens))
            return out

        scheduler.schedule = schedule

    @property
    def chunked_engine(self):
        if self._chunked is None:
            self._chunked = self._engine(budget=self.settings["chunk_budget"])
            self._watch(self._chunked)
        return self._chunked

    def batch_engine(self):
        """A new engine for the sweep's batch axis: the main engine's settings, but max_num_seqs the largest batch
        (sweep.batch_sizes + the row), a token budget that takes every prompt of it in one step, and no prefix
        cache (the requests of one step never read each other's blocks); the caller frees it."""
        from replaytests.inputs.bank import read_prefixes

        sizes = self._sweep_settings["batch_sizes"]
        longest = max(len(tokens) for tokens, _ in read_prefixes(Path(self._sweep_settings["bank"])).values())
        length = int(lookup(read_json(self.model_dir / "config.json", "model config", ConfigError),
                            "max_position_embeddings"))
        engine = self._engine(budget=max(length, (max(sizes) + 1) * longest), max_num_seqs=max(sizes) + 1,
                              prefix_caching=False)
        self._watch(engine)
        self._check_pins(engine)
        return engine

    def fresh_engine(self):
        """A new engine with the main engine's settings (the sweep's start axis), its scheduler watched and its pins
        checked; the caller shuts it down."""
        engine = self._engine(budget=None)
        self._watch(engine)
        self._check_pins(engine)
        return engine

    @classmethod
    def describe(cls, contract: Contract) -> dict:
        """What the run's environment records of this runtime (part of its platform: a change is drift)."""
        settings = {**contract.runtime(cls.name), "version": version()}
        if contract.device == "cpu":
            settings["cpu_kernels"] = cpu_kernels()
            if version() is not None:  # the GEMM of each cell's dense projections (checked against the engine)
                import_vllm(contract)
                settings["linear"] = {name: dense_gemm(cell.dtype) for name, cell in contract.cells.items()
                                      if cls.cell_problem(cell) is None}
        return {"software": {"transformers": hf_adapter.transformers_version(), "vllm": version()},
                "runtime": {"vllm": settings}}

    def attention_backend(self) -> str | None:
        """The attention backend the engine chose (None where this vLLM does not say)."""
        with contextlib.suppress(Exception):
            layers = self.engine.llm_engine.vllm_config.compilation_config.static_forward_context
            return next(iter(layers.values())).attn_backend.get_name()
        return None

    @property
    def rollout_engine(self):
        """The rollout families' engine and the tap on its logits layer (engine/vllm/rollout.py): logprobs_mode
        raw_logprobs, otherwise the main engine's settings."""
        if self._rollout is None:
            if self.settings["logprobs"] < 2:
                raise ConfigError(f"{self.contract.path}: runtime.vllm.logprobs: a rollout needs the top 2 "
                                  f"log-probabilities of each step, got {self.settings['logprobs']}")
            engine = self._engine(budget=None, logprobs_mode=self.rollout_logprobs_mode)
            self._watch(engine)
            self._check_pins(engine)
            self._rollout = (engine, rollouts.Tap(engine))
        return self._rollout

    def _check_pins(self, engine=None) -> None:
        """The vLLM version and attention backend the contract pins are the ones running, and the engine runs
        the cell's dtype and K/V cache format as it names them (vLLM may cast a dtype its platform does not
        serve, and say so only in its log): a cell is never run in another format under its name."""
        pinned = {"version": version(), "attention_backend": self.attention_backend()}
        for key, actual in pinned.items():
            wanted = self.settings[key]
            if wanted is not None and wanted != actual:
                raise ConfigError(f"{self.contract.path}: runtime.vllm.{key}: the contract pins {wanted!r}, "
                                  f"this engine runs {actual!r}")
        engine = engine or self.engine
        config = engine.llm_engine.vllm_config
        ran = {"dtype": str(config.model_config.dtype).removeprefix("torch."),
               "kv_cache.format": str(config.cache_config.cache_dtype)}
        wanted = {"dtype": self.dtype, "kv_cache.format": "auto" if self.flags.kv_cache.native
                  else self.flags.kv_cache.format}
        for key, actual in ran.items():
            if actual != wanted[key]:
                raise ConfigError(f"{self.contract.path}: cells.{self.cell}.{key}: the cell names "
                                  f"{wanted[key]!r}, the engine runs {actual!r}; refused: the cell would not run in "
                                  "its format")
        if self.contract.device == "cpu":
            self._check_gemms(engine)

    def _check_gemms(self, engine=None) -> None:
        """The engine's linear layers run the GEMM the run's platform records for this cell (describe's
        dense_gemm), small weights aside, which vLLM may give its small-weight kernel."""
        engine = engine or self.engine
        gemms = engine.apply_model(lambda model: sorted({gemm_of(module.cpu_linear) for module in model.modules()
                                                              if hasattr(module, "cpu_linear")}))[0]
        recorded = dense_gemm(self.dtype)
        if recorded not in gemms or set(gemms) - {recorded, SMALL_WEIGHT_GEMM}:
            raise ConfigError(f"{self.contract.path}: cells.{self.cell}: the run records vLLM's linear layers "
                              f"on {recorded!r} (runtime.vllm.linear), the engine runs {', '.join(gemms) or 'none'}")

    def activate(self) -> None:
        """Nothing to re-apply: each engine holds its own dtype and threads."""

    # --- requests -------------------------------------------------------------------------------

    def _params(self, forced: list[int]):
        caps = self.grammar.caps
        room = len(forced) + 3 * (caps.branch + 2) + 1 + caps.suffix_room()
        return self._vllm.SamplingParams(
            temperature=0.0, max_tokens=room, logprobs=self.settings["logprobs"], ignore_eos=True,
            stop_token_ids=[self.grammar.delims.closers[ANSWER]], detokenize=False, seed=0,
            extra_args={"replaytests": {"grammar": self._key, "forced": forced}})

    def _request(self, prompts: list[list[int]], forced: list[int] | None = None, engine=None, reset: bool = True):
        """Run the prompts as one batch of requests; the first's output, and its prefill step count."""
        params = [self._params((forced or []) if i == 0 else []) for i in range(len(prompts))]
        return self._submit(prompts, params, engine or self.engine, reset)

    def _submit(self, prompts: list[list[int]], params: list, engine, reset: bool = True):
        """Run the prompts as one batch of requests with their sampling params; the first's output, and its
        prefill step count."""
        stop.check()  # between requests: vLLM's own steps cannot be cut
        if reset:
            engine.reset_prefix_cache()
        self._steps.clear()
        prompt_type = self._vllm.inputs.TokensPrompt
        outs = engine.generate([prompt_type(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        out = outs[0]
        steps = [tokens for _, tokens in sweeps.scheduled(self._steps, out.request_id)]
        return out, _prefill_steps(steps, len(prompts[0]) - (out.num_cached_tokens or 0))

    def _served(self, construction: str, prompt: list[int], z_len: int, out, prefill_steps: int | None) -> Boundary:
        completion = out.outputs[0]
        tokens = prompt + list(completion.token_ids)
        where = f"vllm {construction} ({self.cell})"
        if completion.finish_reason != "stop" or tokens[-1] != self.grammar.delims.closers[ANSWER]:
            raise BoundaryMismatch(f"{where}: the request ended by {completion.finish_reason} after "
                                   f"{len(completion.token_ids)} tokens, before <|/answer|>")
        start = z_len - len(prompt)  # the output step that chooses the first merge-content token
        steps = [sorted(((t, lp.logprob) for t, lp in step.items()), key=lambda item: -item[1])
                 for step in completion.logprobs]
        z = tokens[:z_len]
        suffix_tokens = tokens[z_len:]
        top1 = [values[0][1] for values in steps[start:]]
        margins = [values[0][1] - values[1][1] for values in steps[start:]]
        suffix = Suffix(suffix_tokens, margins, self.tokenizer.decode(answer_ids(suffix_tokens, self.grammar)), top1)
        served = Served(out.num_cached_tokens or 0, len(prompt_of(z, self.grammar.delims)) //
                        self.settings["block_size"] * self.settings["block_size"], prefill_steps,
                        steps_digest(steps[start:]), suffix, tuple(tuple(step) for step in steps[start:]))
        return Boundary(construction, z, self.grammar.parse(z, where), None, self._logits(steps[start]), served)

    def _logits(self, step: list[tuple[int, float]]) -> torch.Tensor:
        """The boundary's logit row as vLLM shows it: its top-k (masked to -inf: the lowest float32), the
        lowest float32 elsewhere; a NaN stays a NaN."""
        row = torch.full((self.vocab,), _LOWEST, dtype=torch.float32)
        for token, value in step:
            row[token] = _LOWEST if value == float("-inf") else value
        return row

    # --- the Backend protocol --------------------------------------------------------------------

    def live(self, prompt_block: list[int], construction: str = "live") -> Boundary:
        out, steps = self._request([prompt_block])
        output = list(out.outputs[0].token_ids)
        merge = self.grammar.delims.openers[MERGE]
        if merge not in output:
            raise BoundaryMismatch(f"vllm {construction} ({self.cell}): the request never opened the merge "
                                   f"block ({out.outputs[0].finish_reason} after {len(output)} tokens)")
        return self._served(construction, prompt_block, len(prompt_block) + output.index(merge) + 1, out, steps)

    def build(self, construction: str, z: list[int]) -> Boundary:
        kind = construction.removesuffix("_replica")
        if kind not in CONSTRUCTIONS:
            raise ConfigError(f"vllm: unknown construction {construction!r} (expected one of "
                              f"{', '.join(CONSTRUCTIONS)}, or live)")
        if kind == "incremental":
            prompt = prompt_of(z, self.grammar.delims)
            out, steps = self._request([prompt], forced=z[len(prompt):])
            return self._served(construction, prompt, len(z), out, steps)
        engine = self.chunked_engine if kind == "chunked" else None
        prompts = [z, *companions(z, self.grammar.delims)] if kind == "batched" else [z]
        out, steps = self._request(prompts, engine=engine, reset=kind != "prefix_hit")
        if kind == "batched":
            self._check_batch_formed(out, len(prompts), construction)
        return self._served(construction, z, len(z), out, steps)

    def _check_batch_formed(self, out, requests: int, construction: str) -> None:
        """The batched construction's premise, by the scheduler's own steps: the step that began z's prompt ran its
        companions too (else z was prefilled alone, and prefill~batched would compare a prefill with a prefill)."""
        together = next((size for size, _ in sweeps.scheduled(self._steps, out.request_id)), None)
        if together is None or together < requests:
            ran = "was not observed" if together is None else f"ran {together} of the {requests} requests"
            raise NotServedAsAsked(f"vllm {construction} ({self.cell}): the scheduler step that began z's prompt "
                                   f"{ran}: the batch did not form")

    def suffix(self, boundary: Boundary) -> Suffix:
        return boundary.state.suffix

    def _rollout_request(self, prompt: list[int], params, where: str):
        """One rollout request on a reset cache: its output, the logits its steps computed (tapped), and the
        logprobs mode that computed its numbers; fail closed unless the mode is the suite's definition and the
        engine's own counters say it computed every prompt token itself, in one scheduler step."""
        engine, tap = self.rollout_engine
        mode = engine.llm_engine.model_config.logprobs_mode
        if mode != rollouts.LOGPROBS_MODE:
            raise LogprobsUnchecked(f"{where}: the engine reports logprobs_mode {mode!r}; the suite's log-probability "
                                    f"(FP32 log-softmax of the logits, before any processor) is vLLM's "
                                    f"{rollouts.LOGPROBS_MODE!r}")
        tap.start()
        try:
            out, prefill_steps = self._submit([prompt], [params], engine)
        finally:
            rows = tap.stop()
        cached = out.num_cached_tokens or 0
        if cached or prefill_steps != 1:
            raise LogprobsUnchecked(f"{where}: the request did not compute its {len(prompt)} prompt tokens itself in "
                                    f"one step: {cached} read from the prefix cache, scheduler steps {prefill_steps}")
        return out, rows, mode

    def _decoded(self, construction: str, z: list[int], length: int, params, where: str):
        """A request that decodes `length` + 1 tokens after z, one per step: its checked steps and tapped rows."""
        out, rows, mode = self._rollout_request(z, params, where)
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        if len(tokens) != length + 1 or len(rows) != length + 1 or any(row.shape[0] != 1 for row in rows):
            raise LogprobsUnchecked(f"{where}: expected {length + 1} decode steps of one row each, the request decoded "
                                    f"{len(tokens)} tokens and the tap saw {[row.shape[0] for row in rows]} rows")
        steps = rollouts.steps(completion.logprobs, tokens)
        rollouts.check(steps, torch.cat(rows), self.vocab, where)
        return rollouts.rollout(construction, z, steps[:length], rows[length][0], self.grammar, mode, where)

    def rollout(self, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
        where = f"vllm rollout {construction} ({self.cell})"
        params = rollouts.params(self._vllm, length + 1, self.settings["logprobs"], seed)
        return self._decoded(construction, z, length, params, where)

    def replay(self, construction: str, z: list[int], response: list[int]) -> Rollout:
        kind = construction.removesuffix("_replica")
        where = f"vllm rollout {construction} ({self.cell})"
        k = self.settings["logprobs"]
        if kind == "incremental":
            params = rollouts.params(self._vllm, len(response) + 1, k, forced=response)
            replayed = self._decoded(construction, z, len(response), params, where)
            split = first_divergence(replayed.tokens, response)
            if split is not None:
                raise LogprobsUnchecked(f"{where}: the forced decode chose other tokens than the response, first at "
                                        f"step {split}")
            return replayed
        if kind != "prefill":
            raise ConfigError(f"vllm: unknown rollout replay {construction!r} (expected incremental or prefill, or a "
                              "*_replica)")
        prompt = list(z) + list(response)
        out, rows, mode = self._rollout_request(prompt, rollouts.params(self._vllm, 1, k, prompt_logprobs=k), where)
        positions = [row for row in rows if row.shape[0] == len(prompt) - 1]
        sampled = [row for row in rows if row.shape[0] == 1]
        if len(rows) != 2 or len(positions) != 1 or len(sampled) != 1 or out.prompt_logprobs is None:
            raise LogprobsUnchecked(f"{where}: expected one call over the {len(prompt) - 1} prompt positions and one "
                                    f"sampling step, the tap saw {[row.shape[0] for row in rows]} rows")
        steps = rollouts.steps(out.prompt_logprobs[1:], prompt[1:])
        rollouts.check(steps, positions[0], self.vocab, where)
        completion = out.outputs[0]
        rollouts.check(rollouts.steps(completion.logprobs, list(completion.token_ids)), sampled[0], self.vocab,
                       f"{where} (the step after the response)")
        return rollouts.rollout(construction, z, steps[len(z) - 1:], sampled[0][0], self.grammar, mode, where)

    def session(self, users: list[list[int]], cap: int, closer: int,
                construction: str = "session") -> list[TurnState]:
        return conversation.session(self, users, cap, closer, construction)

    def replayed(self, construction: str, histories: list[list[int]], cap: int, closer: int) -> list[TurnState]:
        return conversation.replayed(self, construction, histories, cap, closer)

    def render(self, template: str, messages: list[dict], generation_prompt: bool) -> str:
        return conversation.render(self, template, messages, generation_prompt)

    def transplant(self, recipient, donor, layers=None, parts=("k", "v")) -> Boundary:
        raise Unsupported(f"backend {self.name} exposes no K/V tensors to transplant")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def probe(self, tokens: list[int]):
        raise Unsupported("backend vllm shows top-k logprobs only, not a whole logit row (full_logits)")

    def sweep_axes(self, settings: dict):
        return sweeps.axes(self, settings)

    def sweep(self, axis, z: list[int], values, continuation: int):
        return sweeps.sweep(self, axis, z, values, continuation)

    def with_batch(self, batch: int) -> Runtime:
        raise Unsupported(f"backend {self.name} schedules its own batches")

    def first_copy(self, boundary: Boundary) -> Boundary:
        raise Unsupported(f"backend {self.name} exposes no K/V tensors to copy")


def _prefill_steps(steps: list[int], uncached: int) -> int | None:
    """How many scheduler steps computed the `uncached` prompt tokens (None where no step was seen)."""
    if not steps:
        return None
    done = count = 0
    for tokens in steps:
        if done >= uncached:
            break
        done, count = done + tokens, count + 1
    return count

