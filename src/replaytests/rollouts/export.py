"""`replaytests rollouts export`: the live rollouts of a conformance run as a `replaytests.rollouts/1` dump, so
that another runtime recomputes them (`rollouts check`): the cross-runtime pair RL users run, a rollout decoded
on a serving engine (vLLM, llama.cpp) and recomputed on transformers.

The prompt of each row is the bank row's z, read from the bank the run names in its run.json (or --bank); the
record's own z digest must be that z's, or the export refuses it (a bank edited since the run is not the
prompt the engine was given). Only a run under a causal contract is exported: a dump is scored causally.
Written whole and atomically; nothing is half-written.
"""

from __future__ import annotations

from pathlib import Path

from replaytests.errors import DumpError
from replaytests.families.registry import ROLLOUT_FAMILIES
from replaytests.families.skeleton import z_digest
from replaytests.files import dumps, write_atomic
from replaytests.inputs.bank import read_prefixes
from replaytests.inputs.contract import load_contract
from replaytests.inputs.rollouts import SCHEMA, read_dump
from replaytests.outputs.ledger import read_ledger
from replaytests.outputs.records import Record
from replaytests.outputs.runs import read_run

ARM = "live"  # the arm exported: the rollout as the live decoder drew it


def _run(ledger: Path) -> dict:
    run = read_run(ledger)
    if run is None:
        raise DumpError(f"{ledger}: no run.json beside it: the run's contract and bank are unknown")
    return run


def _check_causal(ledger: Path, run: dict) -> None:
    """A dump is scored causally (every earlier token visible), as a trainer scores it: a run whose contract
    hid tokens by role drew its rollouts under masks the recompute would not apply, so it is refused. The
    contract is the one run.json names, unchanged since (its sha256)."""
    named = run.get("contract") if isinstance(run.get("contract"), dict) else {}
    path = Path(named["path"]) if isinstance(named.get("path"), str) else None
    if path is None or not path.is_file():
        raise DumpError(f"{ledger}: the run's contract ({path or 'not named in run.json'}) is not here: its "
                        "protocol.visibility cannot be checked")
    contract = load_contract(path)
    if contract.digest != named.get("sha256"):
        raise DumpError(f"{ledger}: the run's contract {path} changed since the run (sha256)")
    if contract.visibility != "causal":
        raise DumpError(f"{ledger}: the run's contract {path} has protocol.visibility {contract.visibility!r}: its "
                        "rollouts were drawn under role masks, and a dump is scored causally; export a run under a "
                        "contract with protocol: {visibility: causal}")


def row(record: Record, prompt: list[int], engine: str) -> dict:
    """One dump row of a rollout record's live arm."""
    arm, spec = record.arms[ARM], record.rollout
    return {"schema": SCHEMA, "id": f"{record.row}/{record.family}/{record.precision}", "prompt_ids": prompt,
            "response_ids": list(arm.suffix), "logprobs": list(arm.logprobs), "engine": engine,
            "dtype": record.precision, "sampling": {"temperature": spec.temperature, "top_p": spec.top_p,
                                                    "top_k": None, "seed": spec.seed}}


def export(ledger: Path, out: Path, bank: Path | None = None, cell: str | None = None,
           families: tuple[str, ...] = ROLLOUT_FAMILIES) -> int:
    """The ok rollout records of `ledger` (of `families`, and `cell` where given) as a dump at `out`;
    the rows written. No such record is an error, not an empty dump."""
    run = _run(ledger)
    _check_causal(ledger, run)
    options = run.get("options") if isinstance(run.get("options"), dict) else {}
    bank = bank or (Path(options["bank"]) if isinstance(options.get("bank"), str) else None)
    if bank is None:
        raise DumpError(f"{ledger}: its run.json names no bank; pass --bank BANK")
    prefixes = read_prefixes(bank)
    engine = options.get("backend") if isinstance(options.get("backend"), str) else "unknown"
    wanted = [r for r in read_ledger(ledger) if r.family in families and r.ok
              and (cell is None or r.precision == cell)]
    if not wanted:
        at = f" at {cell}" if cell else ""
        raise DumpError(f"{ledger}: no ok record of {' or '.join(families)}{at} to export")
    rows = []
    for record in wanted:
        if record.row not in prefixes:
            raise DumpError(f"{ledger}: {record.title}: row {record.row!r} is not in the bank {bank}")
        tokens, roles = prefixes[record.row]
        if record.arms[ARM].z_sha256 != z_digest(tokens, roles):
            raise DumpError(f"{ledger}: {record.title}: its z digest is not the bank row's ({bank}): the bank "
                            "changed since the run, or the ledger is another bank's")
        rows.append(row(record, tokens, engine))
    write_atomic(out, "".join(dumps(r) + "\n" for r in rows))
    read_dump(out)  # what was written reads back as a dump (its own checks)
    return len(rows)

