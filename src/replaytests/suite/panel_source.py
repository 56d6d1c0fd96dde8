"""The --panel-from source: the finished crossing records of earlier runs that a transplant panel is drawn
from, checked to be this run's (its bank, model and contract, a finished run, every selected row)."""

from __future__ import annotations

from pathlib import Path

from replaytests.errors import ConfigError
from replaytests.families.registry import PANEL_SOURCE
from replaytests.files import lookup
from replaytests.inputs.bank import BankRow
from replaytests.inputs.contract import Contract
from replaytests.inputs.integrity import Integrity
from replaytests.outputs.ledger import collate
from replaytests.outputs.records import Record
from replaytests.outputs.runs import read_run


def read_panel_source(paths: tuple[Path, ...], rows: list[BankRow], integrity: Integrity, contract: Contract,
                      cell_names: tuple[str, ...], accept_interrupted: bool = False) -> dict[tuple[str, str], Record]:
    """The finished crossing records of every selected row in each of `cell_names` (the cells the transplant
    runs on), keyed (cell, row), from the --panel-from ledgers: made from
    this run's bank, model and contract, by runs that were not interrupted, covering every selected row (a
    panel drawn from part of the rows would not be this run's panel)."""
    where = "--panel-from " + " ".join(map(str, paths))
    for path in paths:
        run = read_run(path) or {}
        if lookup(run, "run", "interrupted") and not accept_interrupted:
            raise ConfigError(f"{where}: {path} is an interrupted run; a panel is drawn from a finished {PANEL_SOURCE} "
                              "only (--accept-interrupted to use what it finished)")
        for name, (field_path, actual) in {"bank": (("manifest", "bank_sha256"), integrity.actual.get("bank")),
                                           "model": (("manifest", "model", "sha256"), integrity.actual.get("model"))
                                           }.items():
            recorded = lookup(run, *field_path)
            if recorded is not None and actual is not None and recorded != actual:
                raise ConfigError(f"{where}: {path} was run on another {name} (sha256 {recorded[:12]}…, this run's "
                                  f"{actual[:12]}…)")
        recorded = lookup(run, "contract", "sha256")
        if recorded is not None and recorded != contract.digest:
            raise ConfigError(f"{where}: {path} was run under another contract ({lookup(run, 'contract', 'name')}, "
                              f"sha256 {recorded[:12]}…; this run's {contract.name}, {contract.digest[:12]}…): its "
                              f"{PANEL_SOURCE} is not this run's")
    records = {(r.precision, r.row): r for r in collate(list(paths)) if r.family == PANEL_SOURCE}
    for cell in cell_names:
        if missing := [row.id for row in rows if not ((cell, row.id) in records and records[(cell, row.id)].ok)]:
            raise ConfigError(f"{where}: no finished {cell} {PANEL_SOURCE} record of {len(missing)} selected row(s) "
                              f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); run the "
                              f"{PANEL_SOURCE} of every selected row first")
    return {(cell, row.id): records[(cell, row.id)] for cell in cell_names for row in rows}
