"""Shared fixtures for the unit tests of replaytests' own machinery, and their kinds.

The embedded tiny model is loaded at most once per session (`fp32_runtime`); everything else works
on the tokenizer, the config or hand-built tensors. Each test is of one kind or none, as markers:
- `model`: it runs the tiny model (it asks for a loaded runtime, or its module says so);
- `e2e`: it runs replaytests whole (the pytest plugin under pytester, or a subprocess of the CLI);
- `data`: it checks the committed ledgers (fixtures/ledgers) whole, not the machinery: the round trip
  of every ledger, README's tables;
- none: the machinery alone, `pytest tests/unit -m "not model and not e2e and not data"`, the quick loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import forkserver
import pytest
import torch

from replaytests.engine.boundary import Boundary
from replaytests.engine.environment import Drift
from replaytests.engine.hf import constructions
from replaytests.engine.hf.adapter import load_tokenizer
from replaytests.engine.hf.decoder import decode_suffix
from replaytests.engine.protocol import DELIMITER_NAMES, Caps, Delimiters, Grammar
from replaytests.inputs import cpu_isa
from replaytests.inputs.bank import BankRow
from replaytests.inputs.contract import Contract, load_contract
from replaytests.inputs.gates import Gates

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "fixtures" / "models" / "tiny-qwen2"
BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"

# The unit-test grammar: small caps so "at cap" is reachable in a few tokens.
UNIT_CAPS = Caps(branch=3, merge=2, answer=1)
BANNED = (5, 7)
VOCAB = 320  # the tiny model's embedding rows (config.json vocab_size); the tokenizer has fewer

# One intra-op thread per test process, as cpu-tiny pins for its runs (a runtime a model test loads sets it anyway):
# under `-n 2` on 2 cores, two workers of torch's default two threads each wait on one another at every parallel
# region, and a finite check of the tiny model's weights (ReplaySession.open, twice) took a second instead of 10 ms.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(MODEL_DIR)


@pytest.fixture(scope="session")
def delims(tokenizer) -> Delimiters:
    return Delimiters.resolve(tokenizer)


@pytest.fixture(scope="session")
def grammar(tokenizer, delims) -> Grammar:
    """A grammar over the real tokenizer with caps 3/2/1 and two banned tokens."""
    return Grammar(delims, UNIT_CAPS, VOCAB, len(tokenizer), BANNED)


@pytest.fixture(scope="session")
def tiny_contract() -> Contract:
    return load_contract(CONTRACT)


@pytest.fixture(scope="session")
def tiny_grammar(tokenizer, delims, tiny_contract) -> Grammar:
    """The grammar the committed bank was frozen under (cpu-tiny caps)."""
    return Grammar(delims, tiny_contract.caps, VOCAB, len(tokenizer), tiny_contract.banned_tokens)


@pytest.fixture(scope="session")
def bank_rows_json() -> list[dict]:
    return [json.loads(line) for line in BANK.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def shortest_z(bank_rows_json) -> list[int]:
    """The shortest committed boundary prefix (123 tokens): cheap to prefill."""
    return min(bank_rows_json, key=lambda r: (len(r["tokens"]), r["id"]))["tokens"]


@pytest.fixture(scope="session")
def opened_session():
    """opened_session(contract=the default's) -> ReplaySession.open(Options(contract=contract)), opened once a
    session per contract: an open reads the committed baseline whole (578 records) and checks the weights of two
    checkpoints, and the tests that only read a session share one (a test that changes one opens its own)."""
    from replaytests.inputs.options import DEFAULT_CONTRACT, Options
    from replaytests.suite.session import ReplaySession

    opened: dict[Path, ReplaySession] = {}

    def open_once(contract: Path = DEFAULT_CONTRACT) -> ReplaySession:
        if contract not in opened:
            opened[contract] = ReplaySession.open(Options(contract=contract))
        return opened[contract]

    return open_once


@pytest.fixture(scope="session")
def fp32_runtime(tiny_contract):
    """The tiny model at FP32, loaded once for the whole unit session."""
    from replaytests.engine.hf.runtime import Runtime

    return Runtime.load(MODEL_DIR, tiny_contract, "fp32")


@pytest.fixture(scope="session")
def bf16_runtime(tiny_contract):
    """The tiny model at BF16, loaded once for the whole unit session."""
    from replaytests.engine.hf.runtime import Runtime

    return Runtime.load(MODEL_DIR, tiny_contract, "bf16")


@pytest.fixture(autouse=True)
def fresh_arms(request):
    """Each test starts with no arm held (engine.arms): a test that perturbs the model builds its own arms,
    never is handed those another test built with the runtime they share."""
    from replaytests.engine.arms import Arms

    for name in ("fp32_runtime", "bf16_runtime"):
        if name in request.fixturenames:
            request.getfixturevalue(name).arms = Arms()


@pytest.fixture(scope="session")
def bank_rows(bank_rows_json) -> list[BankRow]:
    return [BankRow(r["id"], r["tokens"], r["roles"], r["expected_answer"]) for r in bank_rows_json]


def find_row(runtime, rows: list[BankRow], divergent: bool) -> BankRow:
    """The first bank row whose incremental and prefill suffixes diverge with equal first suffix tokens
    (testable by transplant), or with `divergent` false the first whose suffixes are equal, at this
    runtime's cell on this platform. Which rows diverge depends on the CPU kernels (the platform),
    so tests take their rows from this search, never by name; with none found the test is skipped."""
    for row in rows:
        incremental, prefill = (decode_suffix(runtime, constructions.build(runtime, c, row.tokens)).tokens
                                for c in ("incremental", "prefill"))
        if (incremental != prefill and incremental[:1] == prefill[:1]) if divergent else incremental == prefill:
            return row
    kind = "diverges with equal first suffix tokens" if divergent else "has equal suffixes"
    pytest.skip(f"no bank row {kind} at {runtime.cell} on this platform ({len(rows)} rows tried)")


@pytest.fixture(scope="session")
def forced_cpu_isa(tiny_contract) -> list[Drift]:
    """The cpu_isa drift this process carries where its CPU level was forced from outside (dispatch
    variables set in the environment, to play another machine): empty where torch runs at the level
    cpu-tiny pins."""
    actual = cpu_isa.in_force()
    return [] if actual == tiny_contract.cpu_isa else [Drift("environment.cpu_isa", tiny_contract.cpu_isa, actual)]


@pytest.fixture(scope="session")
def divergent_row(bf16_runtime, bank_rows) -> BankRow:
    """A bank row whose BF16 crossing diverges (testably) on this platform."""
    return find_row(bf16_runtime, bank_rows, divergent=True)


@pytest.fixture(scope="session")
def exact_row(bf16_runtime, bank_rows) -> BankRow:
    """A bank row whose BF16 incremental and prefill suffixes are equal on this platform."""
    return find_row(bf16_runtime, bank_rows, divergent=False)


def token_of(delims: Delimiters, spec: str | int) -> int:
    """A delimiter name ('<|cot_2|>') resolved to its id, or a plain integer id."""
    if isinstance(spec, int):
        return spec
    ids = [i for pair in zip(delims.openers, delims.closers, strict=True) for i in pair]
    return dict(zip(DELIMITER_NAMES, ids, strict=True))[spec]


@pytest.fixture(scope="session")
def tok(delims):
    """tok('<|merge|>') -> its id; tok(100) -> 100."""
    return lambda spec: token_of(delims, spec)


# A stand-in for a Hugging Face cache: exactly what boundary.cache_layers / cache_seq_length read.
@dataclass
class FakeLayer:
    keys: torch.Tensor
    values: torch.Tensor


class FakeCache:
    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], seq_length: int | None = None) -> None:
        self.layers = [FakeLayer(k, v) for k, v in layers]
        self._seq_length = seq_length

    def get_seq_length(self) -> int:
        return self._seq_length if self._seq_length is not None else self.layers[0].keys.shape[-2]


def random_layers(n_layers: int = 3, seq: int = 5, seed: int = 0, dtype=torch.float32, batch: int = 2,
                  heads: int = 2, head_dim: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq, head_dim)
    return [(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
            for _ in range(n_layers)]


@pytest.fixture
def make_boundary():
    """make_boundary(name, layers, logits=None, tokens=None, roles=None, seq_length=None) -> Boundary."""

    def make(construction: str, layers, logits: torch.Tensor | None = None, tokens: list[int] | None = None,
             roles: list[int] | None = None, seq_length: int | None = None) -> Boundary:
        seq = layers[0][0].shape[-2]
        tokens = list(range(10, 10 + seq)) if tokens is None else tokens
        roles = [0] * (seq - 1) + [4] if roles is None else roles
        logits = torch.linspace(-1.0, 1.0, 16) if logits is None else logits
        return Boundary(construction, tokens, roles, FakeCache(layers, seq_length), logits)

    return make


@pytest.fixture
def fake_cache():
    return FakeCache


@pytest.fixture
def layers_factory():
    """layers_factory(n_layers=3, seq=5, seed=0, dtype=float32) -> [(K, V), ...] of [2, 2, seq, 4]."""
    return random_layers


def _regated(gates: Gates, section: str, **values) -> Gates:
    return dataclasses.replace(gates, settings={family: {**found, **values} if gates.sections[family] == section
                                                else found for family, found in gates.settings.items()})


@pytest.fixture(scope="session")
def regated():
    """regated(gates, section, **values): `gates` with keys of one `gates:` section set, as a contract that sets them
    reads: every family judged by that section (Gates.sections) reads them."""
    return _regated


@pytest.fixture(scope="session")
def unit_caps() -> Caps:
    return UNIT_CAPS


@pytest.fixture(scope="session")
def banned() -> tuple[int, ...]:
    return BANNED


ROWS = ("--rows", "2", "--precision", "fp32")


def conformance_run(directory, *args):
    """The conformance suite in a child process (as a user starts it): its outcome and its run directory
    (`latest` under the report root)."""
    root = directory / "report"
    defaults = [part for option, value in zip(ROWS[::2], ROWS[1::2], strict=True) if option not in args
                for part in (option, value)]  # an option is given once (a repeated one is refused)
    proc = forkserver.run([sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p",
                           "no:cacheprovider", "--report-dir", str(root), *defaults, *args], cwd=directory)
    return proc, root / "latest"


def forked_pytest(directory, *args) -> pytest.RunResult:
    """`python -m pytest ARGS` in `directory`, forked as conformance_run's runs are, read as pytester reads a run
    (`ret`, `stdout.fnmatch_lines`, `assert_outcomes`). pytester's runpytest_subprocess starts a fresh interpreter
    each time: it sets HOME, which the server's imports read (forkserver.run then starts afresh)."""
    started = time.monotonic()
    proc = forkserver.run([sys.executable, "-m", "pytest", *args], cwd=directory)
    return pytest.RunResult(proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines(),
                            time.monotonic() - started)


@pytest.fixture(scope="session")
def two_row_run(tmp_path_factory):
    """Two FP32 rows through every family, in one process."""
    return conformance_run(tmp_path_factory.mktemp("run"), "-p", "no:xdist")


# The fixtures that load a model: the session's runtimes (the fixtures built on them depend on one), and the test
# modules' own (test_cells' quantized-cache runtime, test_cli's `replaytests freeze`, test_replication's record on
# the later checkpoint)
MODEL_FIXTURES = {"fp32_runtime", "bf16_runtime", "kv_runtime", "frozen", "later_record"}
E2E_FIXTURES = {"pytester", "two_row_run"}  # two_row_run: a whole conformance run in a subprocess
# Modules whose tests load models of their own or run the CLI in a subprocess, and such tests of other modules.
KINDS = {"test_architectures.py": "model", "test_backend.py": "model", "test_causal_visibility.py": "model",
         "test_runner.py": "e2e", "test_signals.py": "e2e", "test_write_failures.py": "e2e",
         "test_closed_pipe.py": "e2e", "test_guest.py": "e2e", "test_benchmarks.py": "e2e", "test_rundir.py": "e2e",
         "test_models.py": "e2e", "test_claims.py": "e2e", "test_forkserver.py": "e2e",
         "test_selftest.py::test_every_fault_is_detected_on_the_embedded_default": "model",
         "test_selftest.py::test_a_disabled_cache_comparison_is_reported_missed": "model",
         "test_cells.py::test_a_run_over_five_cells_reports_compares_and_tracks_every_cell": "e2e",
         "test_cli.py::test_audit_prints_the_header_first_and_the_verdict_last": "e2e",
         "test_history.py::test_appends_from_several_processes_keep_every_line": "e2e",
         "test_plugin.py::test_json_report_carries_metrics": "e2e",
         "test_plugin.py::test_junit_xml_carries_row_precision_and_divergence": "e2e",
         # found by _model_loads_are_marked: they load the tiny model's weights themselves
         "test_bad_input.py::test_bad_command_input_is_one_line_and_loses_nothing[check-model-deleted-tensor]": "model",
         "test_cells.py::test_int8_weights_are_quantized_at_load": "model",
         "test_cells.py::test_int4_weights_run_on_this_cpu_in_groups": "model",
         "test_cli.py::test_freeze_over_a_bank_is_refused_and_force_replaces_it": "model",
         "test_session.py::test_weights_swapped_after_the_run_opened_are_refused_at_load": "model",
         "test_session.py::test_a_loaded_model_does_not_change_when_its_file_does": "model",
         # the committed ledgers whole (100 MB): checks of the data, not of the machinery that reads them
         "test_readme_tables.py": "data",
         "test_records.py::test_every_committed_ledger_round_trips_byte_for_byte": "data",
         "test_records.py::test_the_committed_ledgers_hold_every_version_and_family_the_round_trip_claims": "data",
         "test_records.py::test_every_committed_rollout_measure_is_what_its_log_probabilities_give_on_this_machine":
             "data",
         "test_records.py::test_some_committed_ledgers_hold_rollout_measures_to_re_derive": "data",
         "test_kinds.py::test_a_ledger_a_data_test_opens_is_charged_to_it": "data"}
KIND_NAMES = ("model", "e2e", "data")  # the markers a test's kind is; the quick loop deselects each


def pytest_collection_finish(session: pytest.Session) -> None:
    """pytester's in-process runs drop the modules each run imported, and some cannot be loaded twice in one
    process (numpy.fft, reached through scipy.sparse; torch.distributed's operator library, reached through the
    tiny model's modeling module): imported once, before any such run, where the session holds one (so that a
    test module runs on its own as it runs in the whole suite; the quick loop, which holds none, spares them)."""
    if any("pytester" in getattr(item, "fixturenames", ()) for item in session.items):
        import scipy.sparse  # noqa: F401
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401


def named_kinds(nodeid: str) -> set[str]:
    """The kinds KINDS gives a test: as it names its module, its function or itself (one parameter set, whose id
    may hold a slash: a ledger's run directory)."""
    path, _, test = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    where = f"{module}::{test}"
    return {kind for kind in (KINDS.get(module), KINDS.get(where.split("[", 1)[0]), KINDS.get(where)) if kind}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its kind: from the fixtures it needs, or as KINDS names it (named_kinds); and with the
    xdist group of the fixtures it shares (shared_groups)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        kinds = named_kinds(item.nodeid)
        if names & MODEL_FIXTURES or "model" in kinds:
            item.add_marker(pytest.mark.model)
        if names & E2E_FIXTURES or "e2e" in kinds:
            item.add_marker(pytest.mark.e2e)
        if "data" in kinds:
            item.add_marker(pytest.mark.data)
    for item, group in shared_groups(items, UNIT).items():
        item.add_marker(pytest.mark.xdist_group(group))


SHARED_SESSION = {"two_row_run"}  # session fixtures that run replaytests whole, for tests of several modules


def shared(item: pytest.Item) -> set[str]:
    """The fixtures a unit test shares with others, computed once per process: the module-scoped fixtures of its own
    module (a whole run, a model, a frozen bank: why they are module-scoped) and SHARED_SESSION."""
    module = item.nodeid.split("::", 1)[0]
    found = getattr(item, "_fixtureinfo", None)
    return {f"{module}::{name}" if defs[-1].scope == "module" else name
            for name, defs in (found.name2fixturedefs.items() if found else ())
            if defs and (name in SHARED_SESSION or (defs[-1].scope == "module" and defs[-1].baseid == module))}


def shared_groups(items: list[pytest.Item], under: Path) -> dict[pytest.Item, str]:
    """Each test `under` a folder that shares a fixture -> its xdist group: the tests sharing one fixture (and,
    through a test that uses two, those sharing the other) run on one worker under `--dist loadgroup`, which computes
    it once; spread over both workers, both computed it (every test its own group otherwise)."""
    unit = [(item, shared(item)) for item in items if under in Path(item.path).parents]
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for _, names in unit:
        first, *others = sorted(names) or [None]
        for other in others:
            parent[root(other)] = root(first)
    return {item: root(min(names)) for item, names in unit if names}


_RUNNING: list[pytest.Item] = []  # the test being set up, run or torn down (its fixtures of every scope with it)
# The unit tests, whose kinds this conftest marks: in a session that also runs the conformance suite (README's test
# command), pytest's runtest hooks and the patch below see its tests too, which load the model by design.
UNIT = Path(__file__).resolve().parent
LEDGERS = REPO / "fixtures" / "ledgers"
# A `data` test's function (its node id without parameters) -> the committed ledger files it opened in this process:
# a function's, not a parameter set's, since a cache may spare a later parameter set the read (tools/readme_tables.py)
LEDGERS_READ: dict[str, set[str]] = {}
_DATA_TEST: list[str] = []  # the function of the `data` test now set up, run or torn down


def _function(nodeid: str) -> str:
    return nodeid.split("[", 1)[0]


def _charge_ledger_opens(event: str, args: tuple) -> None:
    """An audit hook: a file under fixtures/ledgers opened while a `data` test runs is charged to its function."""
    if event == "open" and _DATA_TEST and isinstance(args[0], str | bytes | os.PathLike):
        name = os.fsdecode(args[0])
        if name.startswith(f"{LEDGERS}{os.sep}"):
            LEDGERS_READ.setdefault(_DATA_TEST[-1], set()).add(name)


def reads_committed_ledgers(nodeid: str) -> None:
    """A `data` test reads the committed ledgers, or the quick loop leaves it out for nothing: it fails, naming
    itself, where neither it nor another parameter set of its function opened one in this process."""
    if not LEDGERS_READ.get(_function(nodeid)):
        raise AssertionError(f"{nodeid} is marked `data` but opens no file under {LEDGERS}: a test of the machinery "
                             "belongs in the quick loop (KINDS in tests/unit/conftest.py)")


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_charge_ledger_opens)  # audit hooks cannot be removed: one per process, this conftest's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    data = item.get_closest_marker("data") is not None
    _RUNNING.append(item)
    if data:
        _DATA_TEST.append(_function(item.nodeid))
    try:
        return (yield)
    finally:
        _RUNNING.pop()
        if data:
            _DATA_TEST.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    outcome = yield
    if item.get_closest_marker("data"):
        reads_committed_ledgers(item.nodeid)
    return outcome


@pytest.fixture(scope="session", autouse=True)
def _model_loads_are_marked():
    """The `model` and `e2e` kinds are one fixture's: a test that loads a model's weights without either mark
    fails, naming itself, so the quick loop (which deselects both) never loads one. The guard holds
    for the whole session, so a load in a module- or session-scoped fixture is charged to the test it is set up
    for. Reading a config on the meta device (inspection) is no load."""
    from replaytests.engine.hf import adapter

    real = adapter._from_pretrained

    def guarded(path, **how):
        test = _RUNNING[-1] if _RUNNING else None
        if test is not None and not test.path.resolve().is_relative_to(UNIT):  # the conformance suite's: by design
            return real(path, **how)
        if how.get("device_map") != "meta" and not (test and (test.get_closest_marker("model")
                                                              or test.get_closest_marker("e2e"))):
            who = test.nodeid if test else "a hook outside any test"
            raise AssertionError(f"{who} loads the model {path}: mark it `model` (KINDS in tests/unit/conftest.py), "
                                 "or take a runtime from the model fixtures")
        return real(path, **how)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adapter, "_from_pretrained", guarded)
        yield


def within(seconds: float, call):
    """What `call` raised or returned, or "hung" where it took longer than `seconds`: a reader that blocks (a
    FIFO) or never ends (/dev/zero) must fail its test, not stop the suite (the thread, a daemon, is left)."""
    outcome = ["hung"]

    def run():
        try:
            outcome[0] = call()
        except BaseException as exc:  # the outcome under test, whatever it is
            outcome[0] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0]
