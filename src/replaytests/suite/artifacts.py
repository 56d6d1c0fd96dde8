"""The artifacts of a run: what the controller writes into the run's directory (the ledger, run.json,
summary.md and the report, each starting with the verdict) and what the terminal shows, from the
records and the test outcomes the collector gathered (suite.collector).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from replaytests.files import write_atomic, write_json_atomic
from replaytests.outputs import ledger, report, runs, summary, verdict
from replaytests.outputs.verdict import Verdict
from replaytests.suite.gathered import Gathered
from replaytests.suite.session import ReplaySession


def write_run(replay: ReplaySession, gathered: Gathered, outcome: Verdict, run: Path, interrupted: bool,
              started: datetime) -> dict:
    """Write the run's directory, each file starting with the verdict `outcome` (suite.collector.run_verdict): the
    ledger and run.json, then from them the run's statistics computed once (the built report, report.build_report),
    which summary.md and the report read and which it returns for the terminal."""
    finished = datetime.now(UTC)
    times = {"started": started.isoformat(timespec="seconds"), "finished": finished.isoformat(timespec="seconds"),
             "seconds": round((finished - started).total_seconds(), 1)}
    meta = run_metadata(replay, outcome) | {"run": {"name": run.name, "interrupted": interrupted, **times,
                                                        "computed": gathered.computed}} | (
        {"audit": summary.audit_line(gathered.audits)} if gathered.audits else {})
    ledger.write_ledger(run / "ledger.jsonl", gathered.records)
    write_json_atomic(run / "run.json", meta)
    # The report of the files just written, as `replaytests report RUN` builds it: from run.json read back (its
    # sorted keys, its JSON types), so that a run's report and a later one of its directory cannot differ.
    built = report.build_report(gathered.records, runs.report_meta([run]))
    write_atomic(run / "summary.md", summary.markdown(built, header_fields(replay), gathered.audits,
                                                      causal_lines(replay, built), outcome))
    report.write_built(run, built)
    return built


def terminal_lines(replay: ReplaySession, gathered: Gathered, built: dict, outcome: Verdict | None,
                   run: Path | None) -> list[str]:
    """The terminal's replaytests summary from the run's built report: the verdict first, then the table and the
    causal lines."""
    lines = [*verdict.lines(outcome), "", summary.text_table(built), *causal_lines(replay, built)]
    lines += [summary.audit_line(gathered.audits)] if gathered.audits else []
    return lines + ([f"run directory: {run}"] if run is not None else [])


def causal_lines(replay: ReplaySession, built: dict) -> list[str]:
    return summary.causal_lines(built, replay.contract.gates)


def verdict_context(replay: ReplaySession, gathered: Gathered) -> dict:
    """What the verdict says besides the test outcomes: the platform, the CPU pin, the bank and the
    baseline it was checked against (with their findings), and the drift from the contract."""
    records, audits = gathered.records, gathered.audits
    refrozen = [r for r in records if r.family == "live" and r.ok and replay.refreezes(r.precision)]
    z_differs = [r.row for r in refrozen if not r.z_matches_bank]
    bank = verdict.artifact(str(replay.options.bank), replay.bank_platform,
                            f"live z matches the bank in {len(refrozen) - len(z_differs)}/{len(refrozen)} rows"
                            if refrozen else "no live row re-frozen in this run",
                            f"live z differs from the bank in {len(z_differs)}/{len(refrozen)} rows", z_differs)
    changed = ["/".join(a["key"]) for a in audits if a["changes"]]
    baseline_path = replay.options.baseline_ledger
    baseline = ("none", None) if baseline_path is None else verdict.artifact(
        str(baseline_path), replay.baseline_platform,
        f"{len(audits) - len(changed)}/{len(audits)} records reproduce ({sum(a['leaves'] for a in audits)} leaves)"
        + (f", judged at --gate {replay.options.gate}" if replay.options.gate else "")
        if audits else "none of its records audited in this run",
        f"{len(changed)}/{len(audits)} baseline records changed", changed)
    return {"platform": runs.describe_platform(replay.platform), "cpu_isa": pin_line(replay), "bank": bank[0],
            "baseline": baseline[0], "platform_drift": [line for _, line in (bank, baseline) if line],
            "drift": [str(d) for d in replay.drift],
            "skipped_cells": [f"{name} ({reason})" for name, reason in replay.skipped_cells.items()]}


def pin_line(replay: ReplaySession) -> str:
    pinned, contract = replay.pinned, replay.contract
    if pinned.applied:
        return f"{pinned.level}, pinned by contract {contract.name}"
    if pinned.level is None:
        return f"not pinned ({pinned.note}); torch dispatches to {replay.environment['environment']['cpu_isa']}"
    return (f"contract {contract.name} pins {pinned.level}, not applied ({pinned.note}); torch dispatches to "
            f"{replay.environment['environment']['cpu_isa']}")


def run_metadata(replay: ReplaySession, outcome: Verdict | None = None) -> dict:
    """What a report needs besides the records: the verdict, the inputs, their digests, the platform
    and the environment."""
    contract = replay.contract
    # Each family whose panel was drawn (a transplant's): `<family>_panels`, cell -> its panel, with the divergent rows
    # it could not test.
    drawn: dict[str, dict] = {}
    for (family, cell), panel in replay.panels.items():
        drawn.setdefault(f"{family}_panels", {})[cell] = panel._asdict()
    return {
        "schema": runs.RUN_SCHEMA,
        **({"verdict": outcome.to_json()} if outcome is not None else {}),
        "options": {name: _json_option(value) for name, value in vars(replay.options).items()},
        "contract": {"name": contract.name, "path": str(contract.path), "sha256": contract.digest,
                     "description": contract.settings["description"]},
        "panels": contract.panels,
        # The cells as declared and the pairs a report compares; a cell this run ran carries the digest its
        # records carry and its libraries (a declared cell not run may need a library not installed here).
        "cells": [{"name": name, **cell.definition(),
                   **({"digest": replay.cell_digest(name)} if name in replay.cells else {}),
                   **({"libraries": libraries} if (libraries := replay.cell_libraries(name)) else {})}
                  for name, cell in contract.cells.items()],  # a list: the contract's order survives sorted keys
        "cell_pairs": [list(pair) for pair in contract.cell_pairs],
        "manifest": replay.manifest,
        "platform": replay.platform,
        "cpu_isa": {"contract": replay.pinned.level, "applied": replay.pinned.applied, "note": replay.pinned.note},
        "environment": replay.environment,
        "drift": [str(d) for d in replay.drift],
        "overridden": replay.integrity.overridden,
        **drawn,
    }


def _json_option(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, frozenset):
        return sorted(value)
    return [str(v) for v in value] if isinstance(value, tuple) else value


def header_fields(replay: ReplaySession) -> dict[str, str]:
    manifest = replay.manifest
    baseline = replay.options.baseline_ledger
    return {
        "model": f"{replay.options.model} (sha256 {manifest['model']['sha256'][:12]}… per bank manifest)",
        "bank": f"{replay.options.bank} ({len(replay.rows)} rows, sha256 {manifest['bank_sha256'][:12]}…, "
                + ("frozen on this platform)" if not replay.bank_platform else
                   "frozen on another platform: " + "; ".join(replay.bank_platform) + ")"),
        "contract": f"{replay.contract.name} ({replay.options.contract})",
        "backend": f"{replay.backend.name} ({replay.options.backend})",
        "device": replay.device,
        "platform": runs.describe_platform(replay.platform),
        "cpu_isa": pin_line(replay),
        "precision": ", ".join(replay.cells),
        **({"shard": f"{replay.options.shard}: {len(replay.plan.sharded_rows)} of the {len(replay.rows)} selected rows"
            + ("; nothing to run here" if not replay.plan.sharded_rows else "")} if replay.options.shard else {}),
        "baseline": "none: pass --baseline LEDGER" if baseline is None else (
            f"{baseline} (" + ("recorded on this platform)" if not replay.baseline_platform else
                               "recorded on another platform: " + "; ".join(replay.baseline_platform) + ")")),
        "drift": (f"{len(replay.drift)} field(s) differ from the contract: " + "; ".join(map(str, replay.drift))
                  if replay.drift else "none: the environment matches every field the contract names"),
        **({"overridden": "; ".join(replay.integrity.overridden)} if replay.integrity.overridden else {}),
    }
