"""One replay session: the resolved inputs, the loaded runtimes and every computed record.

Each (family, row, precision) is computed at most once per process and shared by every test that
reads it. Records computed here reach the ledger through the test reports (so pytest-xdist workers
hand theirs to the controller).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replaytests import hf_adapter
from replaytests.bank import BankRow, check_manifest, read_bank
from replaytests.contract import PRECISIONS, Contract, load_contract
from replaytests.decoder import suffix_room
from replaytests.errors import ConfigError
from replaytests.families import bridge, crossing
from replaytests.protocol import Delimiters, Grammar
from replaytests.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
DEFAULT_BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
DEFAULT_CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"
DEFAULT_REPORT_DIR = Path("reports") / "latest"
FAMILIES: dict[str, Callable[[Runtime, BankRow], dict]] = {"crossing": crossing.run, "bridge": bridge.run}
BRIDGE_PANEL = 12


@dataclass(frozen=True)
class Options:
    model: Path = DEFAULT_MODEL
    bank: Path = DEFAULT_BANK
    contract: Path = DEFAULT_CONTRACT
    precision: str = "both"
    rows: str | None = None
    report_dir: Path = DEFAULT_REPORT_DIR
    device: str | None = None

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


@dataclass
class ReplaySession:
    options: Options
    contract: Contract
    rows: list[BankRow]
    manifest: dict
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
        manifest = check_manifest(options.bank)
        return cls(options, contract, select_rows(rows, options.rows), manifest)

    def runtime(self, precision: str) -> Runtime:
        if precision not in self._runtimes:
            self._runtimes[precision] = Runtime.load(self.options.model, self.contract, precision,
                                                     self.options.device)
        return self._runtimes[precision]

    def bridge_panel(self) -> list[BankRow]:
        return bridge.panel(self.rows, BRIDGE_PANEL)

    def record(self, family: str, row: BankRow, precision: str) -> tuple[dict, bool]:
        """The (family, row, precision) record, and whether this call computed it."""
        key = (family, row.id, precision)
        fresh = key not in self._records
        if fresh:
            self._records[key] = FAMILIES[family](self.runtime(precision), row)
        return self._records[key], fresh
