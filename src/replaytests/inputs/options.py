"""A replay run's options and the embedded defaults: plain data, no torch.

Read by the pytest plugin before torch is first imported (the contract they name may pin the CPU
instruction set torch dispatches to), and by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replaytests.errors import ConfigError, short
from replaytests.inputs.contract import PRECISIONS
from replaytests.outputs.rundir import ledger_of

if TYPE_CHECKING:
    from replaytests.inputs.bank import BankRow

REPO = Path(__file__).resolve().parents[3]
DEFAULT_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
DEFAULT_BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
DEFAULT_CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"
DEFAULT_LATER_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2-later"
DEFAULT_BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl"
DEFAULT_REPORT_DIR = Path("reports")  # a report root: one directory per run, `latest` the last one completed
GPU_CONTRACT = REPO / "contracts" / "h200.yaml"
ACCEPT_OPTION = "--accept-changed"
OVERRIDES = ("bank", "model", "tokenizer")  # inputs whose change since the bank was frozen can be accepted


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
    run_name: str | None = None

    @property
    def embedded_default(self) -> bool:
        return (self.model, self.bank, self.contract) == (DEFAULT_MODEL, DEFAULT_BANK, DEFAULT_CONTRACT)

    @property
    def baseline_ledger(self) -> Path | None:
        """--baseline (a ledger, or a run directory holding ledger.jsonl), or for the embedded
        default inputs the committed baseline ledger."""
        if self.baseline is not None:
            return ledger_of(self.baseline)
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
            raise ConfigError(f"--precision: expected bf16, fp32 or both, got {short(self.precision)}")
        return (self.precision,)


def select_rows(rows: list[BankRow], spec: str | None) -> list[BankRow]:
    """`--rows N` keeps the first N rows (N >= 1); `--rows A:B` rows A to B-1 (0 <= A < B, A omitted: 0,
    B omitted: the end). A selection that holds no row is an error."""
    if spec is None:
        return rows
    start, colon, stop = spec.partition(":")
    bounds = [part.strip() for part in ((start, stop) if colon else ("", start))]
    if not all(part.isdigit() or (part == "" and (colon or i == 0)) for i, part in enumerate(bounds)):
        raise ConfigError(f"--rows: expected a count N or a slice A:B of non-negative integers, got {short(spec)}")
    low, high = (int(part) if part else None for part in bounds)
    if (not colon and high == 0) or (colon and low is not None and high is not None and low >= high):
        raise ConfigError(f"--rows {spec}: selects no row (expected N >= 1, or A:B with A < B)")
    chosen = rows[low:high]
    if not chosen:
        raise ConfigError(f"--rows {spec}: selects no row of the bank's {len(rows)}")
    return chosen


def parse_shard(spec: str | None) -> tuple[int, int]:
    """`--shard i/N` (1 <= i <= N) as (i, N); no shard is 1/1."""
    if spec is None:
        return 1, 1
    index, _, count = spec.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise ConfigError(f"--shard: expected i/N with 1 <= i <= N (e.g. 2/4), got {short(spec)}")
    return int(index), int(count)


