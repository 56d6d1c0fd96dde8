"""One replay session: the resolved inputs, the loaded runtimes and every computed record.

Each (family, row, cell) is computed at most once per process and shared by every test that
reads it; under pytest-xdist at most once per run (suite.claims). Records computed here are appended
to the run's records file as each is finished; the controller writes the ledger from that file.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.engine import backend, environment
from replaytests.errors import ConfigError, RecordNotKept
from replaytests.families.registry import FAMILIES, PANEL_SOURCE, ROLES, Panel
from replaytests.files import lookup
from replaytests.inputs import cells, conversations, cpu_isa, platforms
from replaytests.inputs.bank import BankRow, model_digest, read_bank
from replaytests.inputs.contract import Contract, load_contract
from replaytests.inputs.gates import PASS, Judgement, artifact
from replaytests.inputs.integrity import Integrity, verify_inputs
from replaytests.inputs.options import Options, parse_shard, select_rows
from replaytests.outputs import ledger
from replaytests.outputs.records import Record
from replaytests.outputs.runs import read_run
from replaytests.suite import heap
from replaytests.suite.baseline import check_baseline
from replaytests.suite.claims import Claims
from replaytests.suite.devices import check_device, pinned_device
from replaytests.suite.panel_source import read_panel_source
from replaytests.suite.planner import Plan


@dataclass
class ReplaySession:
    options: Options
    contract: Contract
    rows: list[BankRow]
    integrity: Integrity
    baseline: list[Record]  # the baseline's records this run recomputes (the only ones read: Plan.audited_keys)
    pinned: cpu_isa.Pin
    backend: type  # the backend class (engine.backend.resolve)
    cells: tuple[str, ...]  # the cells this run computes (--precision), in the contract's order
    skipped_cells: dict[str, str]  # selected cells whose library is not installed here -> why
    _runtimes: dict[tuple[Path, str], backend.Backend] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], Record] = field(default_factory=dict)
    sink: Path | None = None  # the run's records file: every record computed here is appended to it at once
    verified: dict[Path, str] = field(default_factory=dict)  # model directory -> its sha256 when the run opened
    panel_source: dict[tuple[str, str], Record] | None = None  # --panel-from: (cell, row) -> its crossing record
    claims: Claims | None = None  # under pytest-xdist: the records this worker computes, or waits for
    _computed_here: set[tuple[str, str, str]] = field(default_factory=set)  # the keys of the records computed here
    # (family, cell) -> the panel of a family that reads another's records (the transplants), drawn from its outcomes
    panels: dict[tuple[str, str], Panel] = field(default_factory=dict)

    @classmethod
    def open(cls, options: Options, pinned: cpu_isa.Pin | None = None) -> ReplaySession:
        """Validate every input before any model work: contract, CPU instruction set, tokenizer, config,
        bank, manifest. `pinned` is the contract's CPU level as the caller already applied it (the
        pytest plugin does so before torch starts); else it is applied here."""
        # what it imports (the backend's libraries) kept; torch, imported with this module, is frozen with them
        with heap.kept_for_the_run():
            return cls._open(options, pinned)

    @classmethod
    def _open(cls, options: Options, pinned: cpu_isa.Pin | None) -> ReplaySession:
        parse_shard(options.shard)
        check_device(options.device)
        backend_class = backend.resolve(options.backend)
        contract = load_contract(options.contract)
        selected = cells.select(options.precision, contract.cells, f"contract {contract.name} ({contract.path})")
        pinned = cpu_isa.apply(contract.cpu_isa, f"contract {contract.name} ({contract.path})", pinned)
        # after the pin: what a backend can run may depend on the kernels it allows (vLLM's fp8 cache)
        skipped = {name: reason for name in selected if (reason := backend.check_cell(backend_class, contract, name))}
        if len(skipped) == len(selected):  # every test would be skipped: a run that checked nothing
            raise ConfigError(f"--precision {options.precision}: no selected cell can run here: "
                              + "; ".join(skipped.values()))
        facts = backend_class.inspect(options.model, contract, "--model")
        rows = read_bank(options.bank, facts.grammar, facts.max_positions, contract.caps.suffix_room())
        rows = select_rows(rows, options.rows)
        longest = max(row.prefix_len for row in rows) + contract.caps.suffix_room()
        backend.check_window(facts, longest)
        integrity = verify_inputs(options.bank, options.model, list(facts.grammar.delims.all_ids),
                                  options.accept_changed)
        if integrity.actual["model"] != lookup(integrity.manifest, "model", "sha256"):
            backend_class.check_loadable(options.model)  # the bank's own model loaded whole when it was frozen
        if options.later_model is not None:
            backend.check_window(backend_class.inspect(options.later_model, contract,
                                                       "--replication-model"),
                                 longest)
        session = cls(options, contract, rows, integrity, [], pinned, backend_class,
                      tuple(name for name in selected if name not in skipped), skipped)
        session.verified = {options.model: integrity.actual["model"]} | (
            {options.later_model: model_digest(options.later_model)["sha256"]} if options.later_model else {})
        session.panel_source = (read_panel_source(options.panel_from, rows, integrity, contract, session.causal_cells,
                                                  options.accept_interrupted) if options.panel_from else None)
        if not session.plan.sharded_rows:
            raise ConfigError(f"--shard {options.shard}: this shard holds none of the {len(rows)} selected row(s); "
                              "use fewer shards (an empty shard would pass having checked nothing)")
        if options.baseline_ledger is not None:
            session.baseline = ledger.read_ledger(options.baseline_ledger, keys=session.plan.audited_keys())
            check_baseline(session)
        return session

    @property
    def causal_cells(self) -> tuple[str, ...]:
        """The selected cells the transplant and the replication run on: those whose crossing may diverge."""
        return tuple(name for name in self.cells if self.contract.may_diverge(name))

    def cell_digest(self, name: str) -> str:
        """The digest the records of cell `name` carry (its definition and, where the backend runs it
        through a library, that library's version)."""
        return backend.cell_digest(self.backend, self.contract.cell(name))

    def cell_libraries(self, name: str) -> dict[str, str]:
        """The libraries cell `name` runs through, as the backend describes them (run.json), for a selected
        cell; {} for the others."""
        return self.backend.cell_libraries(self.contract.cell(name)) if name in self.cells else {}

    def family_cells(self, family: str) -> tuple[str, ...]:
        """The selected cells a family runs on."""
        return self.causal_cells if FAMILIES[family].divergent_cells_only else self.cells

    @property
    def manifest(self) -> dict:
        return self.integrity.manifest

    @functools.cached_property
    def environment(self) -> dict:
        """The real environment, captured once: versions, device, flags as read back, input digests."""
        return environment.capture_run(self.contract, self.backend, self.device, self.integrity)

    @functools.cached_property
    def drift(self) -> list[environment.Drift]:
        """Every field the contract names whose real value differs."""
        return environment.drift(self.contract, self.environment)

    @property
    def inputs(self) -> dict[str, Path]:
        """The files and directories this run reads (a run never writes among them)."""
        options = self.options
        named = {"bank": options.bank, "contract": options.contract, "model": options.model,
                 "baseline": options.baseline_ledger, "replication model": options.later_model}
        return {name: path for name, path in named.items() if path is not None}

    @functools.cached_property
    def platform(self) -> dict:
        """The fields of this run's environment that decide its numbers (inputs/platforms.py)."""
        return platforms.platform_of(self.environment, self.backend)

    @functools.cached_property
    def bank_platform(self) -> list[str]:
        """Where this run's platform differs from the one the bank was frozen on (empty: the same)."""
        return platforms.platform_differences(self.manifest.get("platform"), self.platform, "bank",
                                              retired_fields=self.backend.retired_platform)

    @functools.cached_property
    def baseline_platform(self) -> list[str]:
        """Where this run's platform differs from the one that recorded the baseline (its run.json)."""
        run = read_run(self.options.baseline_ledger) if self.options.baseline_ledger else None
        return platforms.platform_differences((run or {}).get("platform"), self.platform, "baseline",
                                              retired_fields=self.backend.retired_platform)

    def frozen_with(self) -> dict:
        """What decides a live z besides the model: the bank's cell, caps, K/V cache class (a manifest
        written before the class was recorded was frozen with dynamic caches; the class alone changes BF16
        trajectories) and visibility (one written before it was recorded was frozen under roles)."""
        frozen = self.manifest["contract"]
        return {"precision": self.manifest["precision"], "caps": frozen["caps"],
                "cache": frozen.get("cache", "dynamic"), "visibility": frozen.get("visibility", "roles")}

    def run_with(self, cell: str) -> dict:
        """The same settings for this run at `cell`."""
        return {"precision": cell, "caps": vars(self.contract.caps), "cache": self.contract.cache,
                "visibility": self.contract.visibility}

    def refreezes(self, cell: str) -> bool:
        """Whether live generation at this cell re-freezes the bank (frozen_with)."""
        return self.frozen_with() == self.run_with(cell)

    def judge_against_bank(self, problem: str | None) -> Judgement:
        """A token-identity check against the frozen bank (`problem`: what differs, None if nothing)."""
        here = PASS if problem is None else Judgement("fail", problem)
        return artifact(here, self.bank_platform, self.options.strict_contract, "bank")

    @property
    def device(self) -> str:
        return pinned_device(self.options.device or self.contract.device, os.environ.get("PYTEST_XDIST_WORKER"))

    def runtime(self, cell: str, model: Path | None = None) -> backend.Backend:
        key = (model or self.options.model, cell)
        if key not in self._runtimes:
            with heap.kept_for_the_run():
                loaded = self.backend.load(key[0], self.contract, cell, self.device)
            self._check_unchanged(key[0])
            self._runtimes[key] = loaded
        return self._runtimes[key]

    def _check_unchanged(self, model: Path) -> None:
        """The model's files after a load are those verified when the run opened: a model swapped
        mid-run is refused, never mixed with the first under the first's digest (the HF backend copies
        the weights out of the files' memory maps while it loads, so what runs is what was read)."""
        now, then = model_digest(model)["sha256"], self.verified.get(model)
        if then is not None and now != then:
            raise ConfigError(f"{model}: the model's files changed during this run (sha256 {then[:12]}… when it "
                              f"started, {now[:12]}… after loading); refused: one run never mixes two models")

    def unavailable(self, family: str) -> str | None:
        """Why the backend cannot serve a family (the capabilities it lacks, or its input missing), or None
        where it can."""
        if FAMILIES[family].bank_file == "conversations" and not (path := self.bank_file(family)).is_file():
            return f"no conversation bank beside the bank ({path.name})"
        return backend.missing(self.backend.capabilities, FAMILIES[family].requires, self.backend.name)

    def bank_file(self, family: str) -> Path | None:
        """The file a family's settings carry as `bank` (its registry record's `bank_file`), or None."""
        kind = FAMILIES[family].bank_file
        if kind == "rows":
            return self.options.bank
        return conversations.path_for(self.options.bank) if kind == "conversations" else None

    def family_settings(self, family: str) -> dict:
        """The contract section a family's `run` takes, with its `bank_file` as `bank` where it has one."""
        section = self.contract.settings[FAMILIES[family].settings]
        return section | {"bank": path} if (path := self.bank_file(family)) else section

    def row(self, row_id: str) -> BankRow:
        for row in self.rows:
            if row.id == row_id:
                return row
        raise KeyError(row_id)

    @functools.cached_property
    def plan(self) -> Plan:
        """Which rows each family runs on, and which baseline records this run recomputes."""
        return Plan(self.rows, self.contract.panels, self.options,
                    frozenset(family for family in FAMILIES if self.unavailable(family)),
                    {family: self.family_cells(family) for family in FAMILIES})

    def panel(self, family: str, cell: str) -> Panel:
        """The panel of a family that reads another's records (the transplants: its module's `panel`), drawn from that
        family's finished records of every row it runs on in any shard (computing those not computed yet), sized by
        the contract's panels.<its panel>."""
        if (family, cell) not in self.panels:
            spec = FAMILIES[family]
            (source,) = spec.reads
            records = self.read(source, self.plan.panel_rows(source), cell)
            sizes = self.contract.panels[spec.panel]
            self.panels[family, cell] = spec.draw_panel(records, cell, sizes["divergent"], sizes["exact_controls"])
        return self.panels[family, cell]

    def role(self, family: str, row: BankRow, cell: str) -> str | None:
        """A panel row's role ("divergent" or "control"), "not_testable" for a divergent row the family cannot test
        (its panel gives the reason), None for a row outside the panel."""
        panel = self.panel(family, cell)
        roles = dict(panel.rows) | {row: "not_testable" for row, _ in panel.not_testable}
        return roles.get(row.id)

    def record(self, family: str, row: BankRow, cell: str) -> Record:
        """The (family, row, cell) record, computed at most once per process and appended to the
        run's records as soon as it is (whichever test asked for it first: what reaches the ledger does
        not depend on which tests were selected); under pytest-xdist, by whichever worker needs it first."""
        return self.records(family, [row], cell)[0]

    def records(self, family: str, rows: list[BankRow], cell: str) -> list[Record]:
        """The records of several rows (record); under pytest-xdist, a worker computes those no other
        worker has started while the others compute theirs (suite.claims)."""
        if outside := [row.id for row in rows if not self.has_record(family, row, cell)]:
            raise LookupError(f"{family} row(s) {', '.join(outside)} ({cell}): not in this run's {family} panel, "
                              "so no record")
        wanted = {(family, row.id, cell): row for row in rows}
        keys = {key: row for key, row in self._rows_whose_reads_are_here(family, cell).items()
                if self.has_record(family, row, cell)} | wanted
        missing = [key for key in keys if key not in self._records]

        def compute(key: tuple[str, str, str]) -> Record:
            return self._compute_and_append(family, keys[key], cell)

        self._records |= self.claims.shared(missing, compute) if self.claims else {k: compute(k) for k in missing}
        return [self._records[key] for key in wanted]

    def _rows_whose_reads_are_here(self, family: str, cell: str) -> dict[tuple[str, str, str], BankRow]:
        """Under pytest-xdist, the rows of a family that reads other families' records (the transplant)
        whose read records were computed in this process: this worker computes them first, while their
        arms (the crossing's constructions and suffixes, engine.arms) are held here."""
        reads = FAMILIES[family].reads
        if self.claims is None or not reads:
            return {}
        rows = self.plan.family_rows(family)
        for name in reads:  # the workers compute these together first (or --panel-from gives them)
            self.read(name, rows, cell)
        return {(family, row.id, cell): row for row in rows
                if all((name, row.id, cell) in self._computed_here for name in reads)}

    def has_record(self, family: str, row: BankRow, cell: str) -> bool:
        """Whether the family has a record of the row at all: a transplant's row only in the cell's panel."""
        return not FAMILIES[family].reads or bool(self.unavailable(family)) or self.role(family, row, cell) in ROLES

    def _compute_and_append(self, family: str, row: BankRow, cell: str) -> Record:
        result = self._run_family(family, row, cell)
        self._computed_here.add((family, row.id, cell))
        if self.sink is not None:
            try:
                ledger.append_record(self.sink, result)
            except OSError as exc:
                raise RecordNotKept(f"cannot append the record {family}/{row.id}/{cell} to {self.sink}: "
                                    f"{exc.strerror or exc}; the run stops, keeping the records appended before "
                                    "it") from None
        return result

    def read(self, family: str, rows: list[BankRow], cell: str) -> list[Record]:
        """The records another family reads: from --panel-from where given (a finished crossing), else
        this run's own."""
        if self.panel_source is not None and family == PANEL_SOURCE and cell in self.causal_cells:
            return [self.panel_source[(cell, row.id)] for row in rows]
        return self.records(family, rows, cell)

    def _run_family(self, family: str, row: BankRow, cell: str) -> Record:
        if reason := self.unavailable(family):
            raise backend.Unsupported(f"{family}: {reason}")
        spec = FAMILIES[family]
        settings = (self.family_settings(family),) if spec.settings else ()
        if spec.reads:  # the record it reads, and the row's role in the panel drawn from such records
            (read,) = (self.read(name, [row], cell)[0] for name in spec.reads)
            return spec.run(self.runtime(cell), row, read, self.role(family, row, cell), *settings)
        model = self.options.later_model if spec.later_model else None
        return spec.run(self.runtime(cell, model), row, *settings)
