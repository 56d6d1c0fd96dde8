"""`replaytests rollouts check`: a dump read and checked against the model (before any model work), each row
recomputed by one prefill call, the measures, the report written as one, the summary printed, the exit status.

Imported by the CLI after the contract's CPU instruction set is pinned (cli._pin): the recompute imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replaytests.engine.backend import resolve
from replaytests.engine.environment import capture_run
from replaytests.engine.hf.logprobs import Scorer, limits
from replaytests.errors import Exit
from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import Contract
from replaytests.inputs.options import DEFAULT_REPORT_DIR
from replaytests.inputs.rollouts import Dump, read_dump
from replaytests.outputs import rollout_report, rundir
from replaytests.outputs.mismatch import RunMeasures, Scored, Thresholds, run_measures

SHOWN = 20  # failing rows printed (rollouts.json holds every row)


@dataclass(frozen=True)
class Request:
    dump: Path
    model: Path
    contract: Contract
    cell: str
    thresholds: Thresholds
    out: Path | None = None
    device: str | None = None
    gate: bool = False


def recompute(scorer: Scorer, dump: Dump) -> list[Scored]:
    """Every row's recomputed log-probabilities beside the dump's."""
    return [Scored(row.id, np.asarray(row.response_ids), np.asarray(row.logprobs, dtype=np.float64),
                   scorer.recompute(list(row.prompt_ids), list(row.response_ids),
                                    f"{dump.path}:{row.line} (row {row.id})").cpu().numpy())
            for row in dump.rows]


def _verdict(run: RunMeasures, gate: bool) -> str:
    failures = run.failures()
    if not gate:
        return (f"verdict: measured, not gated ({len(failures)} of {len(run.rows)} rows past a threshold; "
                "--gate makes that a failure)")
    return "verdict: PASS (no token past a threshold)" if not failures else (
        f"verdict: FAIL ({len(failures)} of {len(run.rows)} rows with a token past a threshold)")


def checked_dump(request: Request) -> Dump:
    """The dump read and checked, and every token against the model and the cell against the contract: all
    before any model work."""
    dump = read_dump(request.dump)
    model = limits(request.model)
    dump.check_model(model.vocab_size, model.max_positions, model.source)
    request.contract.cell(request.cell)
    return dump


def _meta(request: Request, dump: Dump, seconds: float) -> dict:
    """What rollouts.json says of the inputs, the platform and the time beside the measures."""
    return {"dump": str(request.dump), "dump_sha256": dump.sha256, "model": str(request.model),
            "contract": f"{request.contract.name} ({request.contract.path})", "precision": request.cell,
            "platform": cpu_isa.platform_line(),
            "environment": capture_run(request.contract, resolve("hf"), request.device),
            "gate": request.gate, "recompute_seconds": round(seconds, 3),
            "tokens_per_second": dump.tokens / seconds if seconds > 0 else 0.0}


def _print_failures(failures: list[str]) -> None:
    more = [f"... and {len(failures) - SHOWN} more rows"] if len(failures) > SHOWN else []
    for line in failures[:SHOWN] + more:
        print(line)


def run(request: Request) -> int:
    """The check: print the tables, write the report, exit 1 only where --gate finds a token past a threshold."""
    started = time.perf_counter()
    dump = checked_dump(request)
    directory = rundir.output_dir(request.out, DEFAULT_REPORT_DIR, {
        "dump": request.dump, "model": request.model, "contract": request.contract.path}, "rollouts")
    scorer = Scorer.load(request.model, request.contract, request.cell, request.device)
    recompute_started = time.perf_counter()
    scored = recompute(scorer, dump)
    meta = _meta(request, dump, time.perf_counter() - recompute_started)
    measures = run_measures(scored, request.thresholds)
    verdict = _verdict(measures, request.gate)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    print(f"rollouts check: {request.dump} ({len(dump.rows)} rows, {dump.tokens} response tokens) on "
          f"{request.model} at {request.cell}, {meta['platform']}; {meta['tokens_per_second']:.0f} tokens/s")
    print("\n".join(rollout_report.summary(measures)))
    print("worst tokens:\n" + "\n".join(rollout_report.worst(measures)))
    for path in rollout_report.write(directory(), measures, meta, verdict):
        print(f"wrote {path}")
    print(verdict)
    failures = measures.failures() if request.gate else []
    _print_failures(failures)
    return Exit.FAIL if failures else Exit.PASS
