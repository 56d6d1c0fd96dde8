"""Which SDPA kernel makes the two copies of a physical batch disagree? (issue 51)

On one H200 (torch 2.11.0+cu130) the two copies of the suite's physical batch disagreed at BF16 under
torch's default attention (flash, efficient and cuDNN allowed), on different rows from run to run, and
never under SDPA's math kernel; contracts/h200.yaml now pins math at BF16. This runs the tiny model's
physical batch under each kernel alone, in each cell, several times, and counts per (kernel, cell,
repeat) the rows the suite excludes for PhysicalBatchDesync and the replicas that are not bit-exact.

Each kernel is pinned the way benchmarks/gpu_batch_invariance.sh pins one: a contract variant that
extends contracts/h200.yaml and sets `sdpa_backend: K` in each cell (`precisions:` for bf16 and fp32,
`cells:` for fp16; the `default` control sets it to null, torch's own choice). The engine applies it
as torch.backends.cuda.enable_*_sdp, the same switches torch.nn.attention.sdpa_kernel sets: with one
kernel enabled, torch runs it or raises ("No available kernel", "No viable backend"); it never falls
back to another. Both are checked here: the first row of each cell runs under torch's profiler, which
names the SDPA operator that ran (a different one is recorded as a fallback, never as a pass), and a
refusal is recorded as `not available: <torch's reason>`.

    attention_matrix.py matrix --device cuda --out-dir DIR   # the matrix: DIR/attention-matrix.{json,md}
    attention_matrix.py record --device cuda --out FILE      # the machine: GPU, compute capability, versions

On a CPU (`--device cpu`) only the math kernel runs; the others are recorded `not available on cpu`
(`--try-all` runs them anyway, to see torch refuse them). The JSON holds one entry per (kernel, cell,
repeat), the Markdown table for benchmarks/README.md and a one-line verdict.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
BASE_CONTRACT = REPO / "contracts" / "h200.yaml"
SCHEMA = "replaytests.attention_matrix/1"

CONTROL = "default"  # sdpa_backend null: torch's own choice among the kernels it has
CELL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
FAMILIES = ("crossing", "live")  # the families the H200's desyncs were found in
# The ATen operator each SDPA kernel runs as (what the profiler sees) -> the kernel's contract name.
OPERATORS = {
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
REFUSALS = ("No available kernel", "No viable backend")  # torch's words when no enabled kernel takes the call
STATUSES = ("ran", "not available", "fallback", "error", "not run")


def kernels_default() -> tuple[str, ...]:
    from replaytests.inputs.contract import SDPA_BACKENDS

    return SDPA_BACKENDS


# ---- the contract variant (benchmarks/gpu_batch_invariance.sh's mechanism, for any kernel and cell)

def variant(base: Path, kernel: str, cells: list[str], out_dir: Path) -> Path:
    """A contract extending `base` that pins `kernel` (null for the control) in each of `cells`: the paper's
    cells under `precisions:`, any other under `cells:` with its dtype."""
    import yaml

    from replaytests.inputs.cells import PAPER

    pin = None if kernel == CONTROL else kernel
    doc: dict = {"extends": str(base.resolve()), "name": f"{base.stem}-sdpa-{kernel}",
                 "description": f"{base.name} with SDPA pinned to {pin or 'torch default'} in {', '.join(cells)}"}
    for cell in cells:
        if cell in PAPER:
            doc.setdefault("precisions", {})[cell] = {"sdpa_backend": pin}
        else:
            doc.setdefault("cells", {})[cell] = {"dtype": CELL_DTYPES[cell], "sdpa_backend": pin}
    path = out_dir / f"{base.stem}-sdpa-{kernel}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


# ---- the machine (what a GPU baseline is keyed by)

def record_machine(device: str, contract: Path = BASE_CONTRACT) -> dict:
    """The environment as the suite captures it, its platform (the fields that decide the numbers) and a key
    naming the GPU model and compute capability (the CPU model on a CPU)."""
    import torch

    from replaytests.engine.backend import resolve
    from replaytests.engine.environment import capture_run
    from replaytests.inputs.contract import load_contract
    from replaytests.inputs.platforms import platform_of

    hf = resolve("hf")  # the kernels are torch's SDPA, run through the Hugging Face backend
    env = capture_run(load_contract(contract), hf, device)
    hardware = env["hardware"]
    if hardware["device_kind"] == "cuda":
        key = f"{hardware['gpu_name']} (compute capability {hardware['compute_capability']})"
    else:
        key = f"cpu {hardware['cpu']} ({hardware['cpu_capability']})"
    sdpa: dict = {}
    try:
        from torch.nn.attention import SDPBackend, current_flash_attention_impl

        sdpa["priority"] = [SDPBackend(n).name for n in torch._C._get_sdp_priority_order()]
        sdpa["flash_impl"] = current_flash_attention_impl()
    except (ImportError, AttributeError, ValueError) as exc:  # an older or newer torch: say so, keep going
        sdpa["unreadable"] = f"{type(exc).__name__}: {exc}"
    return {"key": key, "platform": platform_of(env, hf), "environment": env, "sdpa": sdpa,
            "recorded": datetime.now(UTC).isoformat(timespec="seconds")}


# ---- one kernel: its cells x repeats x rows

def read_rows(spec: str) -> list:
    """Bank rows: `N` (the first N of the committed bank) or comma-separated ids (those first, in that order,
    then the rest of the bank: a run with time left goes on past them)."""
    from replaytests.inputs.bank import BankRow

    bank = [json.loads(line) for line in BANK.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = {r["id"]: BankRow(r["id"], r["tokens"], r["roles"], r["expected_answer"]) for r in bank}
    if spec.isdigit():
        return list(rows.values())[: int(spec)]
    named = [part.strip() for part in spec.split(",") if part.strip()]
    if unknown := [name for name in named if name not in rows]:
        raise SystemExit(f"--rows: no bank row {', '.join(unknown)} in {BANK}")
    return [rows[name] for name in named] + [row for name, row in rows.items() if name not in named]


def new_unit(kernel: str, cell: str, repeat: int) -> dict:
    return {"kernel": kernel, "cell": cell, "repeat": repeat, "status": "not run", "reason": None,
            "kernels_seen": [], "rows": [], "row_runs": 0, "desync": [], "replica_failures": [],
            "excluded_other": [], "errors": [], "seconds": 0.0, "passed": False}


def classify(record) -> tuple[str, str | None]:
    """A family's record as the matrix counts it: ("ok", None), ("desync", reason), ("excluded", reason)
    or ("replica", what differs)."""
    from replaytests.inputs.gates import differences, replica_pairs, replicas_exact

    if record.status == "excluded":
        kind = "desync" if record.reason.startswith("PhysicalBatchDesync") else "excluded"
        return kind, record.reason
    if replicas_exact(record):
        return "ok", None
    pairs = replica_pairs(record)
    problems = [p for pair in pairs for p in differences(record.comparisons[pair], pair)] if pairs else []
    return "replica", "; ".join(problems) or f"{record.title}: no replica pair compared"


def seen_kernels(events) -> list[str]:
    """The SDPA kernels whose operators appear among a profile's events (their names, sorted)."""
    return sorted({OPERATORS[e.key] for e in events if e.key in OPERATORS})


def judge_seen(kernel: str, seen: list[str]) -> tuple[str, str | None]:
    """Whether the kernel that ran is the one pinned: ("ran", None) or ("fallback", why). The control
    (torch's own choice) takes any; a run in which no SDPA operator was seen proves nothing."""
    if not seen:
        return "fallback", "no SDPA operator seen in the profiled row (attention ran some other way)"
    if kernel == CONTROL or seen == [kernel]:
        return "ran", None
    return "fallback", f"pinned {kernel}, torch ran {'+'.join(seen)}"


def one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def refusal(exc: BaseException, caught: list) -> str | None:
    """Torch's refusal of every enabled kernel, in one line with the reasons it warned just before (on CUDA:
    "Flash attention kernel not used because:" and each failed check), or None for any other error."""
    text = str(exc)
    if not any(words in text for words in REFUSALS):
        return None
    reasons = list(dict.fromkeys(one_line(w.message, 160) for w in caught))
    return one_line(f"{text.splitlines()[0]}{' (' + ' '.join(reasons) + ')' if reasons else ''}", 400)


def run_kernel(kernel: str, cells: list[str], repeats: int, rows: list, families: list[str], device: str,
               deadline: float | None, work: Path, try_all: bool = False, save=None) -> list[dict]:
    """Every (cell, repeat) unit of one kernel: row by row (each row in every cell and repeat before the next
    row, so that the units end with the same rows when time runs out), `save(units)` after each row."""
    from replaytests.engine.arms import Arms
    from replaytests.engine.hf.runtime import Runtime
    from replaytests.engine.numerics import read_numeric_flags, write_numeric_flags
    from replaytests.inputs.contract import load_contract

    units = {(cell, r): new_unit(kernel, cell, r) for cell in cells for r in range(1, repeats + 1)}

    def mark(cell: str, status: str, reason: str | None) -> None:
        for r in range(1, repeats + 1):
            units[cell, r].update(status=status, reason=reason)

    if device.startswith("cpu") and kernel != "math" and not try_all:
        for cell in cells:
            mark(cell, "not available", "not available on cpu (the CPU smoke runs SDPA's math kernel only)")
        return list(units.values())
    saved = read_numeric_flags()  # the engine sets torch's global switches: put them back afterwards
    try:
        contract = load_contract(variant(BASE_CONTRACT, kernel, cells, work))
        runtimes = {}
        for cell in cells:
            try:
                runtimes[cell] = Runtime.load(MODEL, contract, cell, device=device)
            except Exception as exc:  # recorded per cell, the others go on
                mark(cell, "error", one_line(f"loading the model: {type(exc).__name__}: {exc}"))
        runs = {name: importlib.import_module(f"replaytests.families.{name}").run for name in families}
        for cell, runtime in runtimes.items():  # which operator runs, before any row is counted
            seen, status, reason = probe(kernel, runtime, rows[0])
            for r in range(1, repeats + 1):
                units[cell, r]["kernels_seen"] = seen
            if status != "ran":
                mark(cell, status, reason)
        block = None
        for row in rows:
            active = [c for c in runtimes if units[c, 1]["status"] in ("not run", "ran")]
            if not active or (deadline is not None and block is not None and time.monotonic() + block > deadline):
                break
            began = time.monotonic()
            for cell in active:
                for r in range(1, repeats + 1):
                    unit = units[cell, r]
                    t = time.monotonic()
                    _run_row(unit, runtimes[cell], row, runs, Arms)
                    unit["seconds"] = round(unit["seconds"] + time.monotonic() - t, 3)
                    if unit["status"] == "not available":  # refused in a call the probe did not make
                        mark(cell, unit["status"], unit["reason"])
                        break
            block = time.monotonic() - began
            if save:
                save(list(units.values()))
    finally:
        write_numeric_flags(saved)
    for unit in units.values():
        if unit["status"] == "not run" and unit["reason"] is None:
            unit["reason"] = "no time left in the budget"
        unit["passed"] = passed(unit)
    return list(units.values())


def probe(kernel: str, runtime, row) -> tuple[list[str], str, str | None]:
    """Four physical-batch calls through the engine's own forward path (its mask, positions and cache): the
    row's prompt block in one call, then three tokens one call each, under torch's profiler. Returns the
    SDPA kernels the profiler saw and ("ran", None), ("fallback", why), ("not available", torch's refusal)
    or ("error", what)."""
    from torch.profiler import ProfilerActivity, profile

    from replaytests.engine.hf.decoder import DecodeState
    from replaytests.engine.protocol import prompt_of
    from replaytests.errors import FailClosed

    prompt = len(prompt_of(row.tokens, runtime.grammar.delims))
    runtime.activate()
    state = DecodeState.empty(runtime, len(row.tokens))
    caught: list = []
    try:
        with warnings.catch_warnings(record=True) as caught, profile(activities=[ProfilerActivity.CPU]) as prof:
            warnings.simplefilter("always")
            for token in row.tokens[:prompt]:
                state.push(token)
            state.feed(prompt, "probe: the prompt block")
            for token in row.tokens[prompt: prompt + 3]:
                state.push(token)
                state.feed(1, "probe: one token")
            state.settle()
    except FailClosed:
        pass  # a desync here is not counted (the rows count them); the operators seen still tell
    except Exception as exc:  # torch's refusal, or an error that stops the cell
        why = refusal(exc, caught)
        return ([], "not available", why) if why else ([], "error", one_line(f"probe: {type(exc).__name__}: {exc}"))
    seen = seen_kernels(prof.key_averages())
    return (seen, *judge_seen(kernel, seen))


def _run_row(unit: dict, runtime, row, runs: dict, arms_class) -> None:
    """One row through each family, counted into `unit`."""
    for family, run in runs.items():
        runtime.arms = arms_class()  # each repeat builds its arms again (the runtime would share them)
        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                record = run(runtime, row)
        except Exception as exc:  # a refusal, or an error counted against the kernel
            if why := refusal(exc, caught):
                unit.update(status="not available", reason=why)
                return
            unit["errors"].append(one_line(f"{family} {row.id}: {type(exc).__name__}: {exc}"))
            unit["status"] = "ran"
            continue
        unit["status"] = "ran"
        unit["row_runs"] += 1
        if row.id not in unit["rows"]:
            unit["rows"].append(row.id)
        kind, why = classify(record)
        if kind != "ok":
            key = {"desync": "desync", "excluded": "excluded_other", "replica": "replica_failures"}[kind]
            unit[key].append(one_line(f"{family} {row.id}: {why}"))


def passed(unit: dict) -> bool:
    """A unit passes only where its kernel ran (and was the one pinned), on at least one row, with no desync,
    no replica difference, no other exclusion and no error."""
    return (unit["status"] == "ran" and unit["row_runs"] > 0
            and not (unit["desync"] or unit["replica_failures"] or unit["excluded_other"] or unit["errors"]))


# ---- the matrix: every kernel, in child processes at once (or here, one after another)

def matrix(args: argparse.Namespace) -> dict:
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work = out / "contracts"
    work.mkdir(exist_ok=True)
    kernels = args.kernels.split(",")
    cells = args.cells.split(",")
    families = args.families.split(",")
    rows = read_rows(args.rows)
    began = time.monotonic()
    deadline = began + args.budget if args.budget else None
    jobs = args.jobs or (1 if args.device.startswith("cpu") else len(kernels))
    units: list[dict] = []
    if jobs <= 1:
        for kernel in kernels:
            units += run_kernel(kernel, cells, args.repeats, rows, families, args.device, deadline, work, args.try_all)
    else:
        units = _children(args, kernels, out, began)
    machine = record_machine(args.device)
    result = {
        "schema": SCHEMA, "device": args.device, "smoke": args.device.startswith("cpu"),
        "machine": machine,
        "settings": {"kernels": kernels, "cells": cells, "repeats": args.repeats, "families": families,
                     "rows": [row.id for row in rows], "budget_s": args.budget, "jobs": jobs,
                     "base_contract": str(BASE_CONTRACT.relative_to(REPO)), "model": str(MODEL.relative_to(REPO))},
        "seconds": round(time.monotonic() - began, 1),
        "units": units,
    }
    result["table"] = table(result)
    result["verdict"] = verdict(units)
    (out / "attention-matrix.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / "attention-matrix.md").write_text(f"{result['table']}\n\n{result['verdict']}\n", encoding="utf-8")
    return result


def _children(args: argparse.Namespace, kernels: list[str], out: Path, began: float) -> list[dict]:
    """One child process per kernel, all at once on the one device; each writes its units after every row, so
    a child stopped by the time box still leaves the rows it finished."""
    procs = {}
    for kernel in kernels:
        part = out / "logs" / f"matrix-{kernel}.json"
        part.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "kernel", "--kernel", kernel, "--device", args.device, "--cells", args.cells,
               "--repeats", str(args.repeats), "--rows", args.rows, "--families", args.families,
               "--out", str(part), *(["--budget", str(args.budget)] if args.budget else []),
               *(["--try-all"] if args.try_all else [])]
        log = (out / "logs" / f"matrix-{kernel}.log").open("w", encoding="utf-8")
        procs[kernel] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), part, log)
    units = []
    for kernel, (proc, part, log) in procs.items():
        left = None if not args.budget else max(1.0, began + args.budget + 20 - time.monotonic())
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        found = json.loads(part.read_text(encoding="utf-8")) if part.is_file() else None
        if not found:
            cells = args.cells.split(",")
            found = [new_unit(kernel, cell, r) | {"status": "error", "reason": f"its child process exited {rc} "
                                                  f"with no result (logs/matrix-{kernel}.log)"}
                     for cell in cells for r in range(1, args.repeats + 1)]
        elif rc != 0:
            for unit in found:
                if unit["status"] in ("ran", "not run"):
                    unit["reason"] = one_line(f"{unit['reason'] or ''} child exited {rc} (stopped at the time box?)")
                unit["passed"] = passed(unit)
        units += found
    return units


def table(result: dict) -> str:
    """The Markdown table for benchmarks/README.md: a line per kernel, a column per cell."""
    s = result["settings"]
    by = {(u["kernel"], u["cell"]): [] for u in result["units"]}
    for unit in result["units"]:
        by[unit["kernel"], unit["cell"]].append(unit)
    lines = [f"| SDPA kernel | {' | '.join(s['cells'])} |", f"|---|{'---|' * len(s['cells'])}"]
    for kernel in s["kernels"]:
        lines.append(f"| {kernel if kernel != CONTROL else 'default (torch picks)'} | "
                     f"{' | '.join(_entry(by.get((kernel, cell), []), kernel) for cell in s['cells'])} |")
    machine = result["machine"]
    software = machine["environment"]["software"]
    ran = list(dict.fromkeys(row for unit in result["units"] for row in unit["rows"]))
    lines.append("")
    lines.append(f"{machine['key']}, torch {software['torch']}, CUDA {software['cuda']}, cuDNN {software['cudnn']}, "
                 f"transformers {software['transformers']}; the tiny model's bank rows {', '.join(ran) or 'none'}, "
                 f"families {', '.join(s['families'])}, {s['repeats']} repeats per cell, {result['seconds']} s. Each "
                 "entry: the rows excluded for PhysicalBatchDesync in each repeat, of the row runs (row x family) a "
                 "repeat made; replica differences; the SDPA operator the profiler saw where it is not the one named.")
    return "\n".join(lines)


def _entry(units: list[dict], kernel: str) -> str:
    if not units:
        return "-"
    statuses = {u["status"] for u in units}
    first = units[0]
    if statuses != {"ran"}:
        bad = next((u for u in units if u["status"] != "ran"), first)
        done = [u for u in units if u["status"] == "ran"]
        reason = bad["reason"] or ""
        head = reason if reason.startswith(bad["status"]) else f"{bad['status']}: {reason}".rstrip(": ")
        return one_line(head, 140) + (f" ({len(done)} of {len(units)} repeats ran)" if done else "")
    desync = [len(u["desync"]) for u in units]
    runs = [u["row_runs"] for u in units]
    replica = sum(len(u["replica_failures"]) for u in units)
    other = sum(len(u["excluded_other"]) + len(u["errors"]) for u in units)
    each = "/".join(map(str, desync))
    of = str(runs[0]) if len(set(runs)) == 1 else "/".join(map(str, runs))
    rows = sorted({d.split(":")[0] for u in units for d in u["desync"]})
    text = f"{'**' if sum(desync) else ''}{each} of {of}{'**' if sum(desync) else ''} desync"
    text += f" ({', '.join(rows)})" if rows else ""
    text += f"; {replica} replica" + (f"; {other} other" if other else "")
    seen = "+".join(first["kernels_seen"])
    return text + (f"; ran {seen}" if kernel == CONTROL or seen != kernel else "")


def verdict(units: list[dict]) -> str:
    """One line: the kernels that desynced (or differed from a replica), or that none did in how many runs."""
    ran = [u for u in units if u["status"] == "ran" and u["row_runs"]]
    unavailable = sorted({f"{u['kernel']} at {u['cell']}" for u in units if u["status"] == "not available"})
    other = sorted({f"{u['kernel']} at {u['cell']}: {u['status']}" for u in units
                    if u["status"] in ("fallback", "error")})
    tail = "".join([f"; not available: {', '.join(unavailable)}" if unavailable else "",
                    f"; {', '.join(other)}" if other else ""])
    if not ran:
        return f"verdict: nothing ran{tail}"
    bad: dict[str, list[str]] = {}
    for u in ran:
        counts = [f"{len(u[k])} {name}" for k, name in (("desync", "desync"), ("replica_failures", "replica"),
                                                      ("excluded_other", "other exclusion"), ("errors", "error"))]
        if not passed(u):
            bad.setdefault(u["kernel"], []).append(f"{u['cell']} repeat {u['repeat']}: "
                                                   f"{', '.join(c for c in counts if not c.startswith('0 '))}")
    row_runs = sum(u["row_runs"] for u in ran)
    if not bad:
        return f"verdict: none desynced in {len(ran)} runs ({row_runs} row runs){tail}"
    named = "; ".join(f"{kernel} ({', '.join(where)})" for kernel, where in bad.items())
    clean = sorted({u["kernel"] for u in ran} - set(bad))
    return (f"verdict: desync or replica difference under {named}; clean: "
            f"{', '.join(clean) or 'none'} ({len(ran)} runs, {row_runs} row runs){tail}")


# ---- command line

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", default="cuda")
    common.add_argument("--cells", default=",".join(CELL_DTYPES))
    common.add_argument("--repeats", type=int, default=3)
    common.add_argument("--rows", default="6", help="N (the bank's first N) or ids, tried first (default 6)")
    common.add_argument("--families", default=",".join(FAMILIES))
    common.add_argument("--budget", type=float, default=0, help="seconds for the whole matrix (0: no limit)")
    common.add_argument("--try-all", action="store_true", help="on a CPU, run every kernel, not math only")
    m = sub.add_parser("matrix", parents=[common], help="every kernel x cell x repeat")
    m.add_argument("--out-dir", required=True)
    m.add_argument("--kernels", default=None, help=f"comma list (default: the contract's SDPA backends, and "
                                                   f"{CONTROL} on CUDA)")
    m.add_argument("--jobs", type=int, default=0, help="child processes at once (default: 1 on a CPU, one per "
                                                      "kernel on CUDA)")
    k = sub.add_parser("kernel", parents=[common], help="one kernel (a child of `matrix`)")
    k.add_argument("--kernel", required=True)
    k.add_argument("--out", required=True)
    r = sub.add_parser("record", help="the machine: GPU, compute capability, versions")
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "record":
        machine = record_machine(args.device)
        Path(args.out).write_text(json.dumps(machine, indent=2) + "\n", encoding="utf-8")
        print(f"recorded {machine['key']} -> {args.out}")
        return 0
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    if args.command == "kernel":
        out = Path(args.out)
        deadline = time.monotonic() + args.budget if args.budget else None

        def save(units: list[dict]) -> None:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(units, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, out)

        save(run_kernel(args.kernel, args.cells.split(","), args.repeats, read_rows(args.rows),
                        args.families.split(","), args.device, deadline, out.parent, args.try_all, save))
        return 0
    if args.kernels is None:
        args.kernels = ",".join((*kernels_default(), *(() if args.device.startswith("cpu") else (CONTROL,))))
    result = matrix(args)
    print(result["table"])
    print()
    print(result["verdict"])
    print(f"-> {Path(args.out_dir) / 'attention-matrix.json'} ({result['seconds']} s)")
    return 1 if any(u["status"] in ("error", "fallback") for u in result["units"]) else 0


if __name__ == "__main__":
    sys.exit(main())
