"""Whole-audit benchmark (issue 16): where the time of a full audit goes, and how it scales with workers.

    python benchmarks/audit.py                        # embedded default, every row: profile, 1 and 2 workers
    python benchmarks/audit.py --workers 2            # the profile and one worker count
    python benchmarks/audit.py --rows 4 --out /tmp/audit.json   # a small one, end to end

Not a timed test: everything is measured in one run and written as JSON (with the machine's CPU
capability) and Markdown under results/. Two parts:

- **Profile** (in this process, one thread, as one worker computes): every record of the audit, family
  by family and cell by cell in the registry's order, with the time of each, split into
  phases (live generation, incremental and prefill constructions, suffix decoding, everything else:
  transplants, comparisons, digests) and the arms built against those shared (engine.arms).
- **Workers**: `replaytests audit --workers N` in a child process for each N, side by side in this one
  run: wall time, the peak resident memory of its largest process, and the speed-up of N workers over
  one. Every run's ledger is compared byte for byte with the first one's.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from replaytests.files import write_atomic, write_json_atomic
from replaytests.inputs.options import REPO

SCHEMA = "replaytests.benchmarks.audit/1"
RESULTS = REPO / "benchmarks" / "results"
INPUTS = ("model", "bank", "contract", "replication_model")  # passed to the profile and to each audit
PHASES = {"live": ("replaytests.engine.hf.decoder", "live_boundary"),
          "incremental": ("replaytests.engine.hf.constructions", "incremental"),
          "prefill": ("replaytests.engine.hf.constructions", "prefill"),
          "suffix": ("replaytests.engine.hf.decoder", "decode_suffix")}


@contextmanager
def phase_timers(totals: collections.Counter, current: list[str]):
    """Time every call of each phase function (as its callers look it up), charged to current[0]."""
    import importlib

    patched = []
    for phase, (module_name, name) in PHASES.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name)

        def timed(*args, _original=original, _phase=phase, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals[(current[0], _phase)] += time.perf_counter() - started

        for holder in _holders(name, original):
            patched.append((holder, name, original))
            setattr(holder, name, timed)
    try:
        yield
    finally:
        for holder, name, original in patched:
            setattr(holder, name, original)


def _holders(name: str, function) -> list:
    """Every loaded replaytests module that holds `function` under `name` (imported by name or defined)."""
    return [m for key, m in list(sys.modules.items())
            if key.startswith("replaytests.") and getattr(m, name, None) is function]


def profile(rows: str | None, inputs: dict[str, Path]) -> dict:
    """Every record of the audit in this process, timed by family, cell and phase."""
    from replaytests.inputs import cpu_isa
    from replaytests.inputs.contract import load_contract
    from replaytests.inputs.options import Options

    options = Options(rows=rows, **inputs)
    pinned = cpu_isa.pin(load_contract(options.contract).cpu_isa)  # before torch starts, as the plugin does

    from replaytests.families.registry import FAMILIES
    from replaytests.suite.session import ReplaySession

    session = ReplaySession.open(options, pinned)
    totals: collections.Counter = collections.Counter()
    current = ["setup"]
    families = []
    started = time.perf_counter()
    with phase_timers(totals, current):
        for cell in session.cells:
            for name in FAMILIES:
                if cell not in session.family_cells(name):
                    continue
                current[0] = f"{name} {cell}"
                begun = time.perf_counter()
                records = [session.record(name, row, cell) for row in session.plan.family_rows(name)
                           if session.has_record(name, row, cell)]  # a transplant row only in its panel
                seconds = time.perf_counter() - begun
                phases = {phase: round(totals[(current[0], phase)], 3) for phase in PHASES}
                families.append({"family": name, "precision": cell, "rows": len(records),
                                 "ok": sum(r.ok for r in records), "seconds": round(seconds, 3),
                                 "phases": phases | {"other": round(seconds - sum(phases.values()), 3)}})
    runtimes = session._runtimes.values()
    return {"seconds": round(time.perf_counter() - started, 3), "families": families,
            "arms": {"built": sum(r.arms.built for r in runtimes), "shared": sum(r.arms.reused for r in runtimes)},
            "platform": _platform(session)}


def _platform(session) -> dict:
    """The run's platform (the kernels' level as pinned by the contract), the CPU and the best level it
    could run (from its flags)."""
    from replaytests.inputs import cpu_isa

    flags = cpu_isa.cpu_flags() or set()
    machine = [name for name, level in cpu_isa.LEVELS.items() if set(level.flags) <= flags]
    return session.platform | {"hardware.cpu": session.environment["hardware"]["cpu"],
                               "machine_cpu_isa": machine[-1] if machine else None}


# Runs a command and then prints the peak RSS of its largest process (itself or any descendant it waited for).
PEAK = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")


def workers_run(count: str, rows: str | None, inputs: dict[str, Path], directory: Path,
                select: str | None = None) -> dict:
    """`replaytests audit --workers N` (its tests those `-k select` picks, given one) in a child process: wall time,
    peak RSS, exit status, ledger."""
    audit = [sys.executable, "-c", "import sys; from replaytests.cli import main; sys.exit(main())", "audit",
             "--workers", count, "--report-dir", str(directory), "--run-name", f"workers-{count}"]
    audit += ["--rows", rows] if rows else []
    audit += [part for name, path in inputs.items() for part in (f"--{name.replace('_', '-')}", str(path))]
    audit += ["--", "-k", select] if select else []
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK, *audit], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    peak = next((int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("peak_rss_kib ")), None)
    ledger = directory / f"workers-{count}" / "ledger.jsonl"
    return {"workers": count, "exit": proc.returncode, "wall_s": round(wall, 2),
            "peak_rss_mib": round(peak / 1024, 1) if peak else None,
            "ledger": ledger.read_text() if ledger.is_file() else None,
            "tail": proc.stdout[-600:] if proc.returncode else ""}


def extrapolate(profiled: dict, path: Path) -> dict:
    """The profile's seconds per record times the records of a whole run's ledger, per family and cell
    (those the profile did not time are named and left out): that run's compute, and its floor on two
    workers (half of it: every record computed once, no worker idle)."""
    from replaytests.outputs import ledger

    counts = collections.Counter((r.family, r.precision) for r in ledger.read_ledger(path))
    per_record = {(f["family"], f["precision"]): f["seconds"] / f["rows"] for f in profiled["families"] if f["rows"]}
    left_out = {" ".join(key): n for key, n in sorted(counts.items()) if key not in per_record}
    total = sum(per_record[key] * n for key, n in counts.items() if key in per_record)
    return {"ledger": str(path), "records": {" ".join(k): n for k, n in sorted(counts.items())}, "left_out": left_out,
            "cpu_s": round(total, 1), "two_workers_floor_s": round(total / 2, 1)}


def markdown(result: dict) -> str:
    from replaytests.outputs.tables import md_cell

    env = result["profile"]["platform"]
    lines = [f"Whole audit: {result.get('inputs') or 'embedded default'} on {env['hardware.cpu']} (capable of "
             f"{env['machine_cpu_isa']}, kernels "
             f"pinned to {env['environment.cpu_isa']}), torch {env['software.torch']}, transformers "
             f"{env['software.transformers']}, rows {result['rows'] or 'all'}; `{result['command']}`", "",
             f"Profile, one process, one thread: {result['profile']['seconds']:.1f} s; arms built "
             f"{result['profile']['arms']['built']}, shared {result['profile']['arms']['shared']}", "",
             "| family | precision | rows | s | " + " | ".join(f"{p} s" for p in (*PHASES, "other")) + " |",
             "|---|---|---|---|" + "---|" * (len(PHASES) + 1)]
    for f in result["profile"]["families"]:
        lines.append(f"| {f['family']} | {f['precision']} | {f['rows']} | {f['seconds']:.1f} | "
                     + " | ".join(f"{f['phases'][p]:.1f}" for p in (*PHASES, "other")) + " |")
    if extra := result.get("extrapolated"):
        records = ", ".join(f"{key} {n}" for key, n in extra["records"].items())
        lines += ["", f"Extrapolated to the records of `{extra['ledger']}` ({records}): {extra['cpu_s']:.0f} s of "
                      f"compute, so at least {extra['two_workers_floor_s']:.0f} s on two workers."]
        if extra["left_out"]:
            lines[-1] += (" Not profiled here, so left out of every figure: "
                          + ", ".join(f"{key} ({n} records)" for key, n in extra["left_out"].items()) + ".")
    if result["workers"]:
        lines += ["", (f"Worker runs of the tests picked by -k \"{md_cell(result['select'])}\":" if result.get("select")
                       else "Worker runs of every test:"), "",
                  "| workers | wall s | speed-up over 1 | peak RSS MiB (largest process) | exit "
                  "| ledger as the first |", "|---|---|---|---|---|---|"]
        one = next((w["wall_s"] for w in result["workers"] if w["workers"] == "1"), None)
        for w in result["workers"]:
            ratio = f"{one / w['wall_s']:.2f}x" if one else "-"
            lines.append(f"| {w['workers']} | {w['wall_s']:.1f} | {ratio} | {w['peak_rss_mib'] or '-'} | {w['exit']} | "
                         f"{'-' if w['same_ledger'] is None else 'yes' if w['same_ledger'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=None, help="bank rows (a count N or a slice A:B). Default: all")
    parser.add_argument("--workers", default="1,2", help="worker counts to run side by side ('' for none). "
                                                          "Default: %(default)s")
    parser.add_argument("--select", default=None, metavar="EXPR",
                        help="the worker runs' tests: those pytest -k EXPR picks (the profile computes every record "
                             "regardless). Default: every test")
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu-tiny-qwen2-audit.json")
    for name in INPUTS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=Path, default=None,
                            help=f"as replaytests audit --{name.replace('_', '-')}. Default: the embedded default's")
    parser.add_argument("--extrapolate", type=Path, default=None, metavar="LEDGER",
                        help="scale the profile's seconds per record to the records of LEDGER (a whole run of the "
                             "same inputs): its compute, and its floor on two workers")
    args = parser.parse_args(argv)
    inputs = {name: getattr(args, name) for name in INPUTS if getattr(args, name) is not None}
    result = {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"), "rows": args.rows,
              "select": args.select,
              "command": " ".join(["python", "benchmarks/audit.py", *(argv if argv is not None else sys.argv[1:])])}
    result["inputs"] = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in inputs.items())
    result["profile"] = profile(args.rows, inputs)
    if args.extrapolate:
        result["extrapolated"] = extrapolate(result["profile"], args.extrapolate)
    print(f"profile: {result['profile']['seconds']:.1f} s", flush=True)
    result["workers"] = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in filter(None, args.workers.split(",")):
            run = workers_run(count.strip(), args.rows, inputs, Path(scratch), args.select)
            print(f"workers {count}: {run['wall_s']:.1f} s, exit {run['exit']}", flush=True)
            result["workers"].append(run)
    first = result["workers"][0]["ledger"] if result["workers"] else None
    for run in result["workers"]:
        ledger = run.pop("ledger")
        run["records"] = len(ledger.splitlines()) if ledger else 0
        # the same ledger as the first run's; None where a single run has none to be compared with
        run["same_ledger"] = ledger == first and first is not None if len(result["workers"]) > 1 else None
    write_json_atomic(args.out, result)
    text = markdown(result)
    write_atomic(args.out.with_suffix(".md"), text)
    print(text)
    return 0 if all(r["exit"] == 0 and r["records"] and r["same_ledger"] is not False for r in result["workers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
