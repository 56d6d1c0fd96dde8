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
from replaytests.families import FAMILIES, bridge
from replaytests.integrity import Integrity, verify_inputs
from replaytests.protocol import Delimiters, Grammar
from replaytests.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
DEFAULT_BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
DEFAULT_CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"
DEFAULT_BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl"
DEFAULT_REPORT_DIR = Path("reports") / "latest"
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
    _runtimes: dict[str, Runtime] = field(default_factory=dict)
    _records: dict[tuple[str, str, str], dict] = field(default_factory=dict)

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

    def runtime(self, precision: str) -> Runtime:
        if precision not in self._runtimes:
            self._runtimes[precision] = Runtime.load(self.options.model, self.contract, precision, self.device)
        return self._runtimes[precision]

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
        rows = bridge.panel(self.rows, self.contract.panels["bridge"]) if family in PANEL_FAMILIES else self.rows
        index, count = parse_shard(self.options.shard)
        position = {row.id: n for n, row in enumerate(self.rows)}
        return [row for row in rows if position[row.id] % count == index - 1]

    def audited(self) -> list[dict]:
        """The baseline records this run recomputes: its families, precisions and rows."""
        wanted = {(f, r.id, p) for f in FAMILIES for r in self.family_rows(f) for p in self.options.precisions}
        return [record for record in self.baseline if ledger.key(record) in wanted]

    def record(self, family: str, row: BankRow, precision: str) -> tuple[dict, bool]:
        """The (family, row, precision) record, and whether this call computed it."""
        key = (family, row.id, precision)
        fresh = key not in self._records
        if fresh:
            self._records[key] = FAMILIES[family].run(self.runtime(precision), row)
        return self._records[key], fresh
