"""One replay session: the resolved inputs, the loaded runtimes and every computed record.

Each (family, row, precision) is computed at most once per process and shared by every test that
reads it. Records computed here reach the ledger through the test reports (so pytest-xdist workers
hand theirs to the controller).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from replaytests import environment, hf_adapter, ledger
from replaytests.bank import BankRow, read_bank
from replaytests.contract import PRECISIONS, Contract, load_contract
from replaytests.decoder import suffix_room
from replaytests.errors import ConfigError
from replaytests.families import FAMILIES, bridge, replication, transplant
from replaytests.integrity import Integrity, verify_inputs
from replaytests.protocol import Delimiters, Grammar
from replaytests.report import read_run
from replaytests.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
DEFAULT_BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
DEFAULT_CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"
DEFAULT_LATER_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2-later"
DEFAULT_BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl"
DEFAULT_REPORT_DIR = Path("reports") / "latest"
# Environment fields that decide a run's numerics: a default baseline recorded with others is not applied.
BASELINE_PLATFORM = ("software.torch", "software.transformers", "hardware.device_kind", "hardware.gpu_name",
                     "hardware.cpu_capability", "environment.cpu_threads")
PANEL_FAMILIES = ("bridge", "batch")  # run on the bridge panel (contract panels.bridge rows), not on every row


@dataclass(frozen=True)
class Options:
    model: Path = DEFAULT_MODEL
    bank: Path = DEFAULT_BANK
    contract: Path = DEFAULT_CONTRACT
    precision: str = "both"
    rows: str | None = None
    report_dir: Path = DEFAULT_REPORT_DIR
    device: str | None = None
    baseline: Path | None = None
    shard: str | None = None
    accept_changed: frozenset[str] = frozenset()
    strict_contract: bool = False
    replication_model: Path | None = None

    @property
    def embedded_default(self) -> bool:
        return (self.model, self.bank, self.contract) == (DEFAULT_MODEL, DEFAULT_BANK, DEFAULT_CONTRACT)

    @property
    def baseline_ledger(self) -> Path | None:
        """--baseline (a ledger, or a run directory holding ledger.jsonl), or for the embedded
        default inputs the committed baseline ledger."""
        if self.baseline is not None:
            return self.baseline / "ledger.jsonl" if self.baseline.is_dir() else self.baseline
        return DEFAULT_BASELINE if self.embedded_default and DEFAULT_BASELINE.is_file() else None

    @property
    def later_model(self) -> Path | None:
        """The checkpoint replication runs on: --replication-model, or for the embedded default its
        derived later checkpoint."""
        return self.replication_model or (DEFAULT_LATER_MODEL if self.embedded_default else None)

    @property
    def precisions(self) -> tuple[str, ...]:
        if self.precision == "both":
            return PRECISIONS
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision: expected bf16, fp32 or both, got {self.precision!r}")
        return (self.precision,)


def select_rows(rows: list[BankRow], spec: str | None) -> list[BankRow]:
    """`--rows N` keeps the first N rows; `--rows A:B` a Python slice of the bank."""
    if spec is None:
        return rows
    try:
        if ":" in spec:
            start, _, stop = spec.partition(":")
            return rows[slice(int(start) if start else None, int(stop) if stop else None)]
        return rows[: int(spec)]
    except ValueError:
        raise ConfigError(f"--rows: expected a count N or a slice A:B, got {spec!r}") from None


def parse_shard(spec: str | None) -> tuple[int, int]:
    """`--shard i/N` (1 <= i <= N) as (i, N); no shard is 1/1."""
    if spec is None:
        return 1, 1
    index, _, count = spec.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise ConfigError(f"--shard: expected i/N with 1 <= i <= N (e.g. 2/4), got {spec!r}")
    return int(index), int(count)


def pinned_device(device: str, worker: str | None) -> str:
    """Under pytest-xdist each worker gets one GPU: worker gwK takes visible device K mod count
    (a restarted worker takes a fresh K, and still lands on a visible device)."""
    if device != "cuda" or not worker or not torch.cuda.is_available():
        return device
    return f"cuda:{int(worker.removeprefix('gw')) % torch.cuda.device_count()}"


@dataclass
class ReplaySession:
    options: Options
    contract: Contract
    rows: list[BankRow]
    integrity: Integrity
    baseline: list[dict]
    _runtimes: dict[tuple[Path, str], Runtime] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], dict] = field(default_factory=dict)
    _attached: set[tuple[str, str, str]] = field(default_factory=set)

    @classmethod
    def open(cls, options: Options) -> ReplaySession:
        """Validate every input before any model work: contract, tokenizer, config, bank, manifest."""
        options.precisions  # noqa: B018 - validates the option
        contract = load_contract(options.contract)
        tokenizer = hf_adapter.load_tokenizer(options.model)
        config = hf_adapter.load_config(options.model)
        grammar = Grammar(Delimiters.resolve(tokenizer, contract.delimiters), contract.caps,
                          config.vocab_size, len(tokenizer), contract.banned_tokens)
        rows = read_bank(options.bank, grammar, config.max_position_embeddings, suffix_room(contract.caps))
        integrity = verify_inputs(options.bank, options.model, list(grammar.delims.all_ids), options.accept_changed)
        parse_shard(options.shard)
        if options.later_model is not None:
            hf_adapter.load_config(options.later_model)
        baseline = ledger.read_ledger(options.baseline_ledger) if options.baseline_ledger else []
        return cls(options, contract, select_rows(rows, options.rows), integrity, baseline)

    @property
    def manifest(self) -> dict:
        return self.integrity.manifest

    @functools.cached_property
    def environment(self) -> dict:
        """The real environment, captured once: versions, device, flags as read back, input digests."""
        return environment.capture(self.contract, self.device, integrity=self.integrity)

    @functools.cached_property
    def drift(self) -> list[environment.Drift]:
        """Every field the contract names whose real value differs."""
        return environment.drift(self.contract, self.environment)

    @property
    def device(self) -> str:
        return pinned_device(self.options.device or self.contract.device, os.environ.get("PYTEST_XDIST_WORKER"))

    def runtime(self, precision: str, model: Path | None = None) -> Runtime:
        key = (model or self.options.model, precision)
        if key not in self._runtimes:
            self._runtimes[key] = Runtime.load(key[0], self.contract, precision, self.device)
        return self._runtimes[key]

    def divergence_allowed(self, family: str, precision: str) -> bool:
        """The contract's gate: may this family's headline suffixes diverge at this precision?"""
        return self.contract.gates[family]["suffix_divergence_allowed"][precision]

    def row(self, row_id: str) -> BankRow:
        for row in self.rows:
            if row.id == row_id:
                return row
        raise KeyError(row_id)

    def family_rows(self, family: str) -> list[BankRow]:
        """The rows a family runs on: every selected row, or its panel of them; then this shard's share
        (panels are drawn from all selected rows, so shards together run exactly the unsharded rows)."""
        panels = self.contract.panels
        if family in PANEL_FAMILIES:
            rows = bridge.panel(self.rows, panels["bridge"])
        elif family == "live" and panels["live"]:
            rows = bridge.panel(self.rows, panels["live"])
        elif family == replication.FAMILY:
            rows = replication.panel(self.rows, panels["replication"]["rows"]) if self.options.later_model else []
        else:
            rows = self.rows
        index, count = parse_shard(self.options.shard)
        position = {row.id: n for n, row in enumerate(self.rows)}
        return [row for row in rows if position[row.id] % count == index - 1]

    def audited(self) -> list[dict]:
        """The baseline records this run recomputes: its families, precisions and rows."""
        wanted = {(f, r.id, p) for f in FAMILIES for r in self.family_rows(f) for p in self.options.precisions}
        return [record for record in self.baseline if ledger.key(record) in wanted]

    @functools.cached_property
    def transplant_panel(self) -> transplant.Panel:
        """The transplant panel, from the finished BF16 crossing of every selected row (computing
        those crossing records not computed yet)."""
        crossing = [self.record("crossing", row, "bf16") for row in self.rows]
        sizes = self.contract.panels["transplant"]
        return transplant.panel(crossing, sizes["divergent"], sizes["exact_controls"])

    @functools.cached_property
    def baseline_differences(self) -> list[str]:
        """Where this run's platform differs from the one that wrote the baseline (its run.json), in
        the fields that decide the numerics; empty without a baseline or its run.json."""
        run = read_run(self.options.baseline_ledger) if self.options.baseline_ledger else None
        before = (run or {}).get("environment", {})
        differences = []
        for path in BASELINE_PLATFORM:
            section, key = path.split(".")
            old, new = before.get(section, {}).get(key), self.environment[section].get(key)
            if run is not None and old != new:
                differences.append(f"{path} {old} (baseline) vs {new} (here)")
        return differences

    @property
    def baseline_applies(self) -> str | None:
        """Why the audit does not run: no baseline, or a default baseline made on another platform."""
        if not self.options.baseline_ledger:
            return "no baseline ledger: pass --baseline LEDGER"
        if self.options.baseline is None and self.baseline_differences:
            return ("the committed baseline was recorded on another platform (" + "; ".join(self.baseline_differences)
                    + "); pass --baseline to audit against it anyway")
        return None

    def transplant_role(self, row: BankRow) -> str | None:
        """"divergent" or "control" for a panel row, "not_testable" where the boundary argmax differs."""
        panel = self.transplant_panel
        roles = dict(panel.rows) | dict.fromkeys(panel.not_testable, "not_testable")
        return roles.get(row.id)

    def record(self, family: str, row: BankRow, precision: str) -> dict:
        """The (family, row, precision) record, computed at most once per process."""
        key = (family, row.id, precision)
        if key not in self._records:
            self._records[key] = self._compute(family, row, precision)
        return self._records[key]

    def attach(self, record: dict) -> bool:
        """Whether this record still has to ride on a test report to reach the ledger (once each)."""
        key = ledger.key(record)
        fresh = key not in self._attached and record["status"] in ("ok", "excluded")
        self._attached.add(key)
        return fresh

    def _compute(self, family: str, row: BankRow, precision: str) -> dict:
        if family == transplant.FAMILY:
            role = self.transplant_role(row)
            if role not in transplant.ROLES:  # not in this run's panel: no record
                return {"family": family, "row": row.id, "precision": precision, "status": "not_in_panel"}
            crossing = self.record("crossing", row, precision)
            return transplant.run(self.runtime(precision), row, crossing, role)
        if family == replication.FAMILY:
            return replication.run(self.runtime(precision, self.options.later_model), row)
        return FAMILIES[family].run(self.runtime(precision), row)
