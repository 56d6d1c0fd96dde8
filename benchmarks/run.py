"""Benchmarks of the replay engine (issue 7): the suffix decoder against Hugging Face generate(), the
harness's own time per decode step, and the cost and memory of one crossing row, against prefix length.

    python benchmarks/run.py                                  # CPU, embedded tiny model (a few minutes)
    python benchmarks/run.py --device cuda --out DIR/x.json   # CUDA, contracts/h200.yaml
    python benchmarks/run.py --smoke --out /tmp/bench.json    # toy sizes, end to end in seconds

Not timed tests: every number is measured in one run, written as JSON with the environment, and
summarized as Markdown on stdout. The methods are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers

from replaytests.engine.arms import Arms
from replaytests.engine.checks import synthetic_z
from replaytests.engine.environment import capture_run
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf import constructions
from replaytests.engine.hf.decoder import DecodeState, decode_suffix
from replaytests.engine.hf.runtime import Runtime
from replaytests.engine.protocol import Caps, parse_prefix
from replaytests.errors import ReplaytestsError
from replaytests.families import crossing
from replaytests.files import write_atomic, write_json_atomic
from replaytests.inputs import cpu_isa
from replaytests.inputs.bank import BankRow
from replaytests.inputs.cells import PAPER as PRECISIONS
from replaytests.inputs.contract import load_contract
from replaytests.inputs.options import DEFAULT_CONTRACT, DEFAULT_MODEL, REPO

SCHEMA = "replaytests.benchmarks/1"
GPU_CONTRACT = REPO / "contracts" / "h200.yaml"
RESULTS = REPO / "benchmarks" / "results"
# issue 16: BF16 >= 1.5x generate(), FP32 >= 1.0x; <= 0.1 ms and <= 2% of a step outside the model's forward calls
GOAL_SPEEDUP, GOAL_OUTSIDE, GOAL_OUTSIDE_US = {"bf16": 1.5, "fp32": 1.0}, 0.02, 100
SMOKE = {"caps": "8/6/2", "lengths": "48,96", "row_lengths": "48,96", "reps": 1}


# ---------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Accumulated wall time of the calls it brackets; on CUDA each start and stop synchronizes, so
    a bracketed call's time includes its device work."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.calls, self._started = device, 0.0, 0, 0.0

    def start(self) -> None:
        _sync(self.device)
        self._started = time.perf_counter()

    def stop(self) -> None:
        _sync(self.device)
        self.seconds += time.perf_counter() - self._started
        self.calls += 1

    def wrap(self, function: Callable) -> Callable:
        def bracketed(*args, **kwargs):
            self.start()
            try:
                return function(*args, **kwargs)
            finally:
                self.stop()
        return bracketed


@contextmanager
def forward_watch(runtime: Runtime):
    """A stopwatch on the model's forward calls: hooks on the top-level module, so generate() and the
    suite are timed the same way."""
    forward = Stopwatch(runtime.device)
    hooks = [runtime.model.register_forward_pre_hook(lambda *_: forward.start()),
             runtime.model.register_forward_hook(lambda *_: forward.stop())]
    try:
        yield forward
    finally:
        for hook in hooks:
            hook.remove()


@contextmanager
def instrumented(runtime: Runtime):
    """Stopwatches on the model's forward calls and on the suffix decoder's copy of the boundary cache."""
    copy, original = Stopwatch(runtime.device), hf_adapter.clone_cache
    hf_adapter.clone_cache = copy.wrap(original)
    try:
        with forward_watch(runtime) as forward:
            yield forward, copy
    finally:
        hf_adapter.clone_cache = original


def measure(device: torch.device, run: Callable, *watches: Stopwatch) -> tuple[dict, object]:
    """Wall time of run() and what each stopwatch accumulated meanwhile."""
    before = [(w.seconds, w.calls) for w in watches]
    _sync(device)
    started = time.perf_counter()
    result = run()
    _sync(device)
    wall = time.perf_counter() - started
    deltas = [(w.seconds - s, w.calls - c) for w, (s, c) in zip(watches, before, strict=True)]
    return {"wall_s": wall, "watched": deltas}, result


# ---------------------------------------------------------------------------------------------- inputs


def shortest_prefix(caps: Caps) -> int:
    """The shortest synthetic prefix: a one-token prompt block, three full branches and <|merge|>."""
    return 3 + 3 * (caps.branch + 2) + 1


def synthetic_row(runtime: Runtime, length: int, seed: int) -> BankRow:
    """A boundary prefix of exactly `length` tokens (engine.checks.synthetic_z): a prompt block, three branches
    of `caps.branch` content tokens, and <|merge|>; content ids drawn with a seed of `seed` and the length."""
    grammar = runtime.grammar
    z = synthetic_z(runtime, seed * 1_000_003 + length, prompt=length - shortest_prefix(grammar.caps) + 1,
                    branch=grammar.caps.branch)
    return BankRow(f"synthetic-{length}", z, parse_prefix(z, grammar, f"synthetic prefix {length}"), None)


def load_runtime(model: Path, contract, cell: str, device: str | None, positions: int) -> Runtime:
    """The engine's runtime; a model declaring fewer than `positions` positions is allowed them when its
    RoPE is the default one (no position-indexed weights, so the limit is only a declared number)."""
    runtime = Runtime.load(model, contract, cell, device)
    runtime.arms = Arms(budget=0)  # every repetition builds its arms (none is held and handed out again)
    config = runtime.model.config
    if hf_adapter.max_positions(runtime.model) < positions:
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope != "default":
            raise ReplaytestsError(f"{model}: {positions} positions needed, the model declares "
                                   f"{config.max_position_embeddings} and its RoPE ({rope}) is not the default")
        config.max_position_embeddings = positions
    return runtime


def prefix_cache(runtime: Runtime, row: BankRow):
    """The cache of z without its last token (<|merge|>), filled by the suite's own masked prefill."""
    state = DecodeState.empty(runtime, len(row.tokens))
    for token in row.tokens[:-1]:
        state.push(token)
    state.feed(len(row.tokens) - 1, "generate() prefix")
    return state.boundary("prefix").cache


# ------------------------------------------------------------------------------------- the benchmarks


def suite_decode(runtime: Runtime, boundary, forward: Stopwatch, copy: Stopwatch) -> dict:
    timing, suffix = measure(runtime.device, lambda: decode_suffix(runtime, boundary), forward, copy)
    return _step_record(timing, tokens=len(suffix.tokens))


def generate_decode(runtime: Runtime, cache, row: BankRow, steps: int, forward: Stopwatch) -> dict:
    """Hugging Face greedy generate() of `steps` tokens, batch of identical rows, from a filled cache:
    it feeds <|merge|> and then each new token, one forward call per token, as the suite does."""
    ids = torch.tensor(row.tokens, device=runtime.device).repeat(runtime.batch, 1)
    cache_arg = {hf_adapter._cache_kwarg(runtime.model): hf_adapter.clone_cache(runtime.model, cache)}

    def run():
        with torch.inference_mode():
            return runtime.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=steps, min_new_tokens=steps, **cache_arg)

    timing, out = measure(runtime.device, run, forward)
    if out.shape[1] != len(row.tokens) + steps:
        raise RuntimeError(f"generate() returned {out.shape[1] - len(row.tokens)} new tokens, expected {steps}")
    return _step_record(timing, tokens=steps)


def _step_record(timing: dict, tokens: int) -> dict:
    (forward_s, calls), *rest = timing["watched"]
    setup_s = rest[0][0] if rest else 0.0
    outside = timing["wall_s"] - forward_s - setup_s
    return {"wall_s": timing["wall_s"], "forward_s": forward_s, "forward_calls": calls, "setup_s": setup_s,
            "tokens": tokens, "step_s": (timing["wall_s"] - setup_s) / calls, "outside_per_step_s": outside / calls,
            "outside_fraction": outside / (timing["wall_s"] - setup_s)}


def bare_decode(runtime: Runtime, boundary, steps: int, forward: Stopwatch) -> dict:
    """The least any harness does per step: one forward call on prebuilt inputs (views of an all-visible
    mask, fixed ids) and one token to the host. Its time outside the forward calls is the floor the
    suite's own outside time is measured against (Python and torch dispatch on this machine)."""
    cache = hf_adapter.clone_cache(runtime.model, boundary.cache)
    start, batch = len(boundary.tokens), runtime.batch
    ids = torch.tensor([boundary.tokens[-1]], device=runtime.device).expand(batch, 1)
    mask = torch.ones(start + steps, dtype=torch.bool, device=runtime.device).expand(batch, 1, 1, -1)
    positions = torch.arange(start + steps, device=runtime.device).expand(batch, -1)

    def run():
        for end in range(start + 1, start + steps + 1):
            with torch.inference_mode():
                logits = runtime._forward(ids, mask[..., :end], positions[:, end - 1:end], cache)
            int(logits[0].argmax())

    timing, _ = measure(runtime.device, run, forward)
    return _step_record(timing, tokens=steps)


def decode_benchmark(runtime: Runtime, row: BankRow, reps: int) -> dict:
    """The suite's suffix decoder, generate() and the bare loop, interleaved (order rotating), after one
    warm-up each."""
    boundary = constructions.prefill(runtime, row.tokens)
    cache = prefix_cache(runtime, row)
    runs: dict[str, list[dict]] = {"suite": [], "generate": [], "bare": []}
    with instrumented(runtime) as (forward, copy):
        steps = suite_decode(runtime, boundary, forward, copy)["forward_calls"]
        sides = {"suite": lambda: suite_decode(runtime, boundary, forward, copy),
                 "generate": lambda: generate_decode(runtime, cache, row, steps, forward),
                 "bare": lambda: bare_decode(runtime, boundary, steps, forward)}
        sides["generate"]()
        sides["bare"]()
        names = list(sides)
        for rep in range(reps):
            for side in names[rep % 3:] + names[: rep % 3]:
                runs[side].append(sides[side]())
    return {"prefix_len": row.prefix_len, "steps": steps, "runs": runs, "summary": _decode_summary(runs)}


def _median(records: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in records)


def _decode_summary(runs: dict[str, list[dict]]) -> dict:
    suite, generate = runs["suite"], runs["generate"]
    return {
        "suite_step_ms": 1e3 * _median(suite, "step_s"),
        "generate_step_ms": 1e3 * _median(generate, "step_s"),
        "suite_tokens_per_s": 1 / _median(suite, "step_s"),
        "generate_tokens_per_s": 1 / _median(generate, "step_s"),
        "speedup": _median(generate, "step_s") / _median(suite, "step_s"),
        "speedup_paired_median": statistics.median(g["step_s"] / s["step_s"]
                                                   for s, g in zip(suite, generate, strict=True)),
        "suite_forward_ms_per_step": 1e3 * statistics.median(r["forward_s"] / r["forward_calls"] for r in suite),
        "generate_forward_ms_per_step": 1e3 * statistics.median(r["forward_s"] / r["forward_calls"] for r in generate),
        "suite_outside_us_per_step": 1e6 * _median(suite, "outside_per_step_s"),
        "bare_outside_us_per_step": 1e6 * _median(runs["bare"], "outside_per_step_s"),
        "suite_outside_fraction": _median(suite, "outside_fraction"),
        "generate_outside_fraction": _median(generate, "outside_fraction"),
        "suite_cache_copy_ms": 1e3 * _median(suite, "setup_s"),
        # what the speedup would be if the suite spent no time outside the model's forward calls
        "speedup_ceiling": _median(generate, "step_s") / statistics.median(
            r["forward_s"] / r["forward_calls"] for r in suite),
    }


def live_tensor_bytes(device: torch.device) -> int:
    """Bytes of the distinct storages of every tensor on `device` that Python holds (found through gc)."""
    storages = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and _on(obj.device, device):  # type(): no __class__ lookups
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _on(actual: torch.device, wanted: torch.device) -> bool:
    """Whether a tensor on `actual` is on `wanted` (`cuda` means the current CUDA device)."""
    index = wanted.index if wanted.index is not None or wanted.type != "cuda" else torch.cuda.current_device()
    return actual.type == wanted.type and actual.index == index


def cache_bytes(boundary) -> int:
    return sum(t.untyped_storage().nbytes() for kv in boundary.layers for t in kv)


@contextmanager
def memory_probe(runtime: Runtime):
    """While the crossing family decodes each arm, record the tensor bytes alive beyond the baseline
    (every arm's boundary is alive then) and one boundary cache's size."""
    seen = {"held_bytes": 0, "cache_bytes_per_boundary": 0}
    gc.collect()
    baseline = live_tensor_bytes(runtime.device)
    original = runtime.suffix  # what the families call to decode each arm (engine.backend)

    def probed(boundary):
        seen["held_bytes"] = max(seen["held_bytes"], live_tensor_bytes(runtime.device) - baseline)
        seen["cache_bytes_per_boundary"] = cache_bytes(boundary)
        return original(boundary)

    runtime.suffix = probed
    try:
        yield seen
    finally:
        del runtime.suffix
        gc.collect()
        seen["after_row_bytes"] = live_tensor_bytes(runtime.device) - baseline


def row_benchmark(runtime: Runtime, row: BankRow, reps: int) -> dict:
    """The crossing family's run(runtime, row) end to end: wall time, forward time and memory."""
    runs = []
    for _ in range(reps):
        if runtime.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(runtime.device)
        allocated = torch.cuda.memory_allocated(runtime.device) if runtime.device.type == "cuda" else 0
        with forward_watch(runtime) as forward, memory_probe(runtime) as memory:
            timing, record = measure(runtime.device, lambda: crossing.run(runtime, row), forward)
        if not record.ok:
            raise RuntimeError(f"crossing row {row.id} ({runtime.cell}): {record.reason}")
        (forward_s, calls), = timing["watched"]
        runs.append({"wall_s": timing["wall_s"], "forward_s": forward_s, "forward_calls": calls, **memory,
                     "peak_bytes": _peak_bytes(runtime.device, allocated)})
    return {"prefix_len": row.prefix_len, "runs": runs, "wall_s": _median(runs, "wall_s"),
            **{key: runs[-1][key] for key in ("forward_calls", "held_bytes", "cache_bytes_per_boundary",
                                              "after_row_bytes", "peak_bytes")},
            "forward_s": _median(runs, "forward_s")}


def _peak_bytes(device: torch.device, allocated_before: int) -> dict:
    if device.type == "cuda":
        return {"kind": "cuda_max_memory_allocated_above_start",
                "bytes": torch.cuda.max_memory_allocated(device) - allocated_before}
    # ru_maxrss is the process's high-water mark in KiB on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return {"kind": "process_max_rss", "bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


def loglog_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x: y grows like x**slope."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(points) < 2:
        return None
    mean_x = statistics.fmean(p[0] for p in points)
    mean_y = statistics.fmean(p[1] for p in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else None


# ---------------------------------------------------------------------------------------------- driver


def run_benchmarks(args: argparse.Namespace) -> dict:
    contract = dataclasses.replace(load_contract(args.contract), caps=args.caps)
    cpu_isa.apply(contract.cpu_isa, f"contract {contract.name} ({contract.path})")
    positions = max(args.lengths + args.row_lengths) + args.caps.suffix_room()
    results: dict = {"decode": {}, "rows": {}}
    environment = None
    for cell in args.precision:
        runtime = load_runtime(args.model, contract, cell, args.device, positions)
        environment = environment or capture_run(contract, type(runtime), str(runtime.device),
                                                 attention=runtime.model.config._attn_implementation)
        results["decode"][cell] = [_progress(decode_benchmark(runtime, synthetic_row(runtime, n, args.seed),
                                                                   args.reps), cell, "decode")
                                        for n in args.lengths]
        results["rows"][cell] = [_progress(row_benchmark(runtime, synthetic_row(runtime, n, args.seed),
                                                              args.row_reps), cell, "row")
                                      for n in args.row_lengths]
        del runtime
        gc.collect()
    results["fits"] = {cell: _fits(results, cell) for cell in args.precision}
    return {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
            "environment": environment | {"git": _git()},
            "settings": {"model": str(args.model), "contract": str(args.contract), "device": args.device,
                         "precisions": list(args.precision), "caps": vars(args.caps), "lengths": args.lengths,
                         "row_lengths": args.row_lengths, "reps": args.reps, "row_reps": args.row_reps,
                         "seed": args.seed, "goals": {"speedup": GOAL_SPEEDUP, "outside_fraction": GOAL_OUTSIDE,
                                                           "outside_us_per_step": GOAL_OUTSIDE_US}},
            **results}


def _progress(result: dict, cell: str, what: str) -> dict:
    print(f"  {what} {cell} prefix {result['prefix_len']}: done", file=sys.stderr, flush=True)
    return result


def _fits(results: dict, cell: str) -> dict:
    decode, rows = results["decode"][cell], results["rows"][cell]
    lengths = [d["prefix_len"] for d in decode]
    outside = [d["summary"]["suite_outside_us_per_step"] for d in decode]
    row_lengths = [r["prefix_len"] for r in rows]
    return {
        "suite_outside_per_step_slope": loglog_slope(lengths, outside),
        "suite_outside_per_step_ratio_longest_to_shortest": outside[-1] / outside[0] if outside else None,
        "row_wall_slope": loglog_slope(row_lengths, [r["wall_s"] for r in rows]),
        "row_forward_slope": loglog_slope(row_lengths, [r["forward_s"] for r in rows]),
        "row_held_bytes_slope": loglog_slope(row_lengths, [r["held_bytes"] for r in rows]),
    }


def _git() -> dict:
    def git(*argv: str) -> str | None:
        try:
            out = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


# --------------------------------------------------------------------------------------------- summary


def markdown(result: dict) -> str:
    env, settings = result["environment"], result["settings"]
    device = env["hardware"].get("gpu_name") or env["hardware"].get("cpu") or "unknown"
    lines = [f"Benchmarks: {Path(settings['model']).name} on {env['environment']['device']} ({device}), "
             f"torch {env['software']['torch']}, transformers {env['software']['transformers']}, "
             f"{env['environment']['cpu_threads']} intra-op thread(s), caps {_caps(settings['caps'])}, "
             f"{settings['reps']} interleaved repetitions (median)", "",
             "| precision | prefix | steps | suite ms/step | generate() ms/step | speedup (ceiling) | "
             "suite outside forward µs/step | outside % | bare loop outside µs/step | cache copy ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell, decodes in result["decode"].items():
        for d in decodes:
            s = d["summary"]
            lines.append(_cells(cell, d["prefix_len"], d["steps"], f"{s['suite_step_ms']:.3f}",
                                f"{s['generate_step_ms']:.3f}", f"{s['speedup']:.2f}x ({s['speedup_ceiling']:.2f}x)",
                                f"{s['suite_outside_us_per_step']:.0f}", f"{100 * s['suite_outside_fraction']:.1f}",
                                f"{s['bare_outside_us_per_step']:.0f}", f"{s['suite_cache_copy_ms']:.2f}"))
    lines += ["", "| precision | prefix | crossing row s | forward calls | forward s | cache/boundary MiB | "
                  "held at decode MiB | after row MiB | peak MiB ¹ |", "|---|---|---|---|---|---|---|---|---|"]
    for cell, rows in result["rows"].items():
        for r in rows:
            lines.append(_cells(cell, r["prefix_len"], f"{r['wall_s']:.2f}", r["forward_calls"],
                                f"{r['forward_s']:.2f}", _mib(r["cache_bytes_per_boundary"]), _mib(r["held_bytes"]),
                                _mib(r["after_row_bytes"]), _mib(r["peak_bytes"]["bytes"])))
    kinds = sorted({r["peak_bytes"]["kind"] for rows in result["rows"].values() for r in rows})
    lines += ["", f"¹ {', '.join(kinds)}", ""]
    for cell, fit in result["fits"].items():
        summaries = [d["summary"] for d in result["decode"][cell]]
        lines.append(
            f"{cell}: speedup over generate() {_range([s['speedup'] for s in summaries], 'x')} "
            f"(goal >= {GOAL_SPEEDUP[cell]}x); outside forward "
            f"{_range([s['suite_outside_us_per_step'] for s in summaries], ' µs')}, "
            f"{_range([100 * s['suite_outside_fraction'] for s in summaries], '%')} of a step "
            f"(goal <= {GOAL_OUTSIDE_US} µs, <= {100 * GOAL_OUTSIDE:.0f}%; a bare loop: "
            f"{_range([s['bare_outside_us_per_step'] for s in summaries], ' µs')}); outside µs/step grows like "
            f"prefix^{_num(fit['suite_outside_per_step_slope'])}; crossing row time like "
            f"prefix^{_num(fit['row_wall_slope'])}, memory held like prefix^{_num(fit['row_held_bytes_slope'])}")
    return "\n".join(lines) + "\n"


def _cells(*values: object) -> str:
    return "| " + " | ".join(str(v) for v in values) + " |"


def _caps(caps: dict) -> str:
    return "{branch}/{merge}/{answer}".format(**caps)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _range(values: list[float], unit: str) -> str:
    return f"{min(values):.2f}{unit} to {max(values):.2f}{unit}" if len(values) > 1 else f"{values[0]:.2f}{unit}"


# ------------------------------------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _lengths(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers, got {text!r}")
    return values


def _caps_arg(text: str) -> Caps:
    parts = text.split("/")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected BRANCH/MERGE/ANSWER positive integers, got {text!r}")
    return Caps(*map(int, parts))


def _precisions(text: str) -> tuple[str, ...]:
    values = tuple(text.split(","))
    unknown = [v for v in values if v not in PRECISIONS]
    if unknown or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected one or both of {', '.join(PRECISIONS)}, got {text!r}")
    return values


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="benchmarks/run.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="torch device (cuda: contract h200.yaml). Default: %(default)s")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory. Default: the tiny model")
    p.add_argument("--contract", type=Path, default=None,
                   help="contract YAML (numeric flags, threads, batch). Default: cpu-tiny.yaml, or h200.yaml on cuda")
    p.add_argument("--precision", type=_precisions, default=PRECISIONS, help="bf16, fp32 or bf16,fp32 (default)")
    p.add_argument("--caps", type=_caps_arg, default=Caps(32, 96, 32),
                   help="branch/merge/answer caps replacing the contract's; merge+answer+3 is the suffix length. "
                        "Default: 32/96/32")
    p.add_argument("--lengths", type=_lengths, default=[256, 1024, 4096],
                   help="prefix lengths of the decode benchmark. Default: 256,1024,4096")
    p.add_argument("--row-lengths", type=_lengths, default=[256, 512, 1024, 2048, 4096],
                   help="prefix lengths of the crossing-row benchmark. Default: 256,512,1024,2048,4096")
    p.add_argument("--reps", type=_positive, default=5, help="interleaved decode repetitions. Default: %(default)s")
    p.add_argument("--row-reps", type=_positive, default=1, help="runs of each crossing row. Default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic prefixes. Default: %(default)s")
    p.add_argument("--smoke", action="store_true",
                   help=f"toy sizes for a quick end-to-end check ({', '.join(f'{k} {v}' for k, v in SMOKE.items())})")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON to write (a .md summary beside it). Default: benchmarks/results/<device>-<model>.json")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.smoke:
        given = sys.argv[1:] if argv is None else argv
        args = p.parse_args([*(f"--{key.replace('_', '-')}={value}" for key, value in SMOKE.items()), *given])
    shortest = shortest_prefix(args.caps)
    for name in ("lengths", "row_lengths"):
        if getattr(args, name)[0] < shortest:
            p.error(f"--{name.replace('_', '-')}: {getattr(args, name)[0]} is shorter than {shortest}, the least "
                    f"that holds a prompt block and three branches of {args.caps.branch} tokens (--caps)")
    args.contract = args.contract or (GPU_CONTRACT if args.device.startswith("cuda") else DEFAULT_CONTRACT)
    args.out = args.out or RESULTS / f"{args.device.split(':')[0]}-{args.model.name}.json"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is not available here (torch {torch.__version__})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        result = run_benchmarks(args)
    except ReplaytestsError as exc:
        print(f"benchmarks/run.py: error: {exc}", file=sys.stderr)
        return 2
    summary = markdown(result)
    write_json_atomic(args.out, result)
    write_atomic(args.out.with_suffix(".md"), summary)
    print(summary + f"\nwrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
