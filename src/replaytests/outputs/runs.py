"""A run's run.json (written by suite.artifacts.run_metadata; docs/report.md): the one reader, which checks
every field its users read, and what a report shows of it."""

from __future__ import annotations

import json
from pathlib import Path

from replaytests.errors import LedgerError, short
from replaytests.files import lookup, read_json
from replaytests.outputs.rundir import ledger_of
from replaytests.outputs.verdict import Verdict, VerdictError

# The fields run.json's readers read, by type.
RUN_SCHEMA = "replaytests.run/1"
RUN_FIELDS = {"verdict": dict, "options": dict, "contract": dict, "platform": dict, "run": dict, "manifest": dict,
              "environment": dict, "drift": list, "overridden": list}


RUN_LIMIT = 64 << 20  # bytes: a run.json of 48 rows and every option is under 100 KiB


def read_run(path: Path) -> dict | None:
    """The run.json beside a ledger (a file or a run directory), or None where there is none: the one
    reader of run.json, which checks every field its users read."""
    run_json = ledger_of(Path(path)).parent / "run.json"
    if not run_json.is_file():
        return None
    run = read_json(run_json, "run metadata", LedgerError, RUN_LIMIT)
    if not isinstance(run, dict):
        raise LedgerError(f"{run_json}: expected a JSON object, got {type(run).__name__}")
    if run.get("schema", RUN_SCHEMA) != RUN_SCHEMA:
        raise LedgerError(f"{run_json}: field 'schema' is {short(run['schema'])}, expected {RUN_SCHEMA!r}")
    for name, kind in RUN_FIELDS.items():
        if run.get(name) is not None and not isinstance(run[name], kind):
            raise LedgerError(f"{run_json}: field {name!r} must be a {kind.__name__}, got {short(run[name])}")
    try:
        recorded_verdict(run)
    except VerdictError as exc:
        raise LedgerError(f"{run_json}: {exc}") from None
    if problem := _environment_problem(run.get("environment")):
        raise LedgerError(f"{run_json}: {problem}")
    return run


def recorded_verdict(meta: dict) -> Verdict | None:
    """The verdict a run.json (or a report's meta, which carries it) holds, read (Verdict.from_json: a
    VerdictError names the field); None where it holds none (records collated from ledgers)."""
    return Verdict.from_json(meta["verdict"]) if meta.get("verdict") else None


def _environment_problem(environment: dict | None) -> str | None:
    """What makes the recorded environment unprintable in a report's meta (run_meta), or None."""
    for name in ("software", "hardware", "environment"):
        if not isinstance((environment or {}).get(name) or {}, dict):
            return f"field 'environment.{name}' must be an object, got {short(environment[name])}"
    return None


# The bank manifest as a report shows it: its digests (the full manifest stays in run.json).
MANIFEST_DIGESTS = {"bank_sha256": ("bank_sha256",), "model_sha256": ("model", "sha256"),
                    "tokenizer_sha256": ("tokenizer", "sha256"), "contract_sha256": ("contract", "sha256")}


def describe_platform(platform: dict) -> str:
    """A run's platform in one line, each field's last name and value in the order of its path (run.json's): the
    verdict's, the run header's and the report's run details. A backend's settings section (runtime.vllm, a dict) is
    left out: the report shows it in the serving premise (Declaration.report_settings), run.json holds it whole."""
    return ", ".join(f"{path.rpartition('.')[2]} {value}" for path, value in sorted(platform.items())
                     if value is not None and not isinstance(value, dict))


def run_meta(run: dict) -> dict:
    """A run.json for the report's meta: the manifest reduced to its digests, the environment to one line
    each for software and device, the options to those given; every other key as given."""
    meta = dict(run)
    if isinstance(run.get("manifest"), dict):
        digests = {name: lookup(run["manifest"], *path) for name, path in MANIFEST_DIGESTS.items()}
        meta["manifest"] = {name: value for name, value in digests.items() if value is not None}
    if isinstance(run.get("environment"), dict) and {"software", "hardware"} <= set(run["environment"]):
        meta["environment"] = _environment_lines(run["environment"])
    if isinstance(run.get("options"), dict):
        meta["options"] = {name: value for name, value in run["options"].items() if value not in (None, [], False)}
    return meta


def _environment_lines(env: dict) -> dict:
    software = env.get("software") or {}
    hardware = env.get("hardware") or {}
    settings = env.get("environment") or {}
    if hardware.get("gpu_name"):
        device = (f"{hardware['gpu_name']} (compute {hardware.get('compute_capability')}, "
                  f"driver {hardware.get('driver')})")
    else:
        device = f"{hardware.get('cpu')} ({hardware.get('cpu_capability')})"
    return {"software": ", ".join(f"{name} {version}" for name, version in software.items() if version),
            "device": f"{settings.get('device')}: {device}, {settings.get('cpu_threads')} intra-op thread(s)"}


def report_meta(paths: list[Path]) -> dict:
    """The CLI's report meta: the ledgers, and the run.json beside them (one run's keys at the top level;
    runs that differ under `runs`, keyed by ledger)."""
    runs = {str(path): run_meta(run) for path in paths if (run := read_run(path)) is not None}
    meta = {"ledgers": [str(p) for p in paths]}
    if len({json.dumps(run, sort_keys=True) for run in runs.values()}) == 1:
        return meta | next(iter(runs.values()))
    # Shards of one run differ in their options and times, not in their cells: the cells' order and
    # pairs, where every run agrees on them, are the collated report's.
    first = next(iter(runs.values()), {})
    shared = {key: first[key] for key in ("cells", "cell_pairs")
              if key in first and all(run.get(key) == first[key] for run in runs.values())}
    return meta | shared | ({"runs": runs} if runs else {})
