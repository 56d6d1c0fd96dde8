"""The pytest plugin: options, markers, the session object, the ledger and the summary.

Registered through the `pytest11` entry point. State lives in one ReplaySession kept in
config.stash; records ride on report.user_properties so xdist workers hand them to the controller.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaytests import ledger, summary
from replaytests.errors import ReplaytestsError
from replaytests.files import write_atomic
from replaytests.session import (
    DEFAULT_BANK,
    DEFAULT_CONTRACT,
    DEFAULT_MODEL,
    DEFAULT_REPORT_DIR,
    Options,
    ReplaySession,
)

RECORD_PROPERTY = "replaytests_record"
MARKERS = {
    "gpu": "needs a CUDA device",
    "replica": "fidelity layer 1: replica stability",
    "token_identity": "fidelity layer 2: token identity",
    "fidelity": "fidelity layer 3: live-state fidelity",
    "causal": "fidelity layer 4: causal state sufficiency",
    "slow": "long-running conformance targets",
}
DEFAULT_OPTIONS = vars(Options())
session_key = pytest.StashKey[ReplaySession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replaytests", "replay conformance (replaytests)")
    group.addoption("--model", type=Path, default=DEFAULT_MODEL,
                    help="local Hugging Face model directory. Default: the embedded tiny Qwen2")
    group.addoption("--bank", type=Path, default=DEFAULT_BANK,
                    help="frozen prefix bank (JSONL with a .manifest.json beside it). Default: %(default)s")
    group.addoption("--contract", type=Path, default=DEFAULT_CONTRACT,
                    help="reproducibility contract (YAML). Default: %(default)s")
    group.addoption("--precision", choices=("bf16", "fp32", "both"), default="both",
                    help="precision(s) to audit. Default: %(default)r")
    group.addoption("--rows", default=None, help="a count N or a slice A:B of bank rows, for quick runs")
    group.addoption("--device", default=None, help="torch device; default: the contract's environment.device")
    group.addoption("--report-dir", type=Path, default=DEFAULT_REPORT_DIR,
                    help="where ledger.jsonl and summary.md are written. Default: %(default)s")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(LedgerCollector(config), "replaytests-ledger")


def replay_session(config: pytest.Config) -> ReplaySession:
    """The session's inputs, opened on first use; a bad input is a usage error, one line."""
    if session_key not in config.stash:
        options = Options(**{name: config.getoption(name) for name in DEFAULT_OPTIONS})
        try:
            config.stash[session_key] = ReplaySession.open(options)
        except ReplaytestsError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[session_key]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Validate every input before collection, so a bad one stops the run with one line.

    The plugin is installed for every pytest run in the environment: when the user gave no
    replaytests option and the embedded defaults do not resolve, an unrelated test run is left
    alone, and the error surfaces only if a conformance test is collected.
    """
    config = session.config
    try:
        replay_session(config)
    except pytest.UsageError:
        if any(config.getoption(name) != default for name, default in DEFAULT_OPTIONS.items()):
            raise


@pytest.fixture(scope="session")
def replay(request: pytest.FixtureRequest) -> ReplaySession:
    return replay_session(request.config)


@pytest.fixture
def record(replay: ReplaySession, request: pytest.FixtureRequest):
    """record(family, row, precision) -> the ledger record, attached to this test's report once."""

    def get(family: str, row, precision: str) -> dict:
        result, fresh = replay.record(family, row, precision)
        if fresh:
            request.node.user_properties.append((RECORD_PROPERTY, json.dumps(result)))
        return result

    return get


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize conformance tests by precision and bank row, with ids like `bf16-tiny-007`."""
    wanted = {"precision", "bank_row", "bridge_row"} & set(metafunc.fixturenames)
    if not wanted or "record" not in metafunc.fixturenames:
        return
    replay = replay_session(metafunc.config)
    if "precision" in wanted:
        metafunc.parametrize("precision", replay.options.precisions, scope="session")
    if "bank_row" in wanted:
        metafunc.parametrize("bank_row", replay.rows, ids=[r.id for r in replay.rows], scope="session")
    if "bridge_row" in wanted:
        panel = replay.bridge_panel()
        metafunc.parametrize("bridge_row", panel, ids=[r.id for r in panel], scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup`, keep every test of one (row, precision) on one worker,
    so each record is computed once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        params = getattr(item, "callspec", None) and item.callspec.params
        row = params and (params.get("bank_row") or params.get("bridge_row"))
        if row:
            item.add_marker(pytest.mark.xdist_group(f"{params.get('precision', '')}-{row.id}"))


class LedgerCollector:
    """Gathers records from test reports (local or from xdist workers) and writes the ledger."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.records += [json.loads(v) for n, v in report.user_properties if n == RECORD_PROPERTY]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.records = ledger.merge(self.records)
        if not self.records or hasattr(self.config, "workerinput"):
            return
        report_dir = self.config.getoption("report_dir")
        ledger.write_ledger(report_dir / "ledger.jsonl", self.records)
        header = header_fields(replay_session(self.config))
        write_atomic(report_dir / "summary.md", summary.markdown(self.records, header))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.records:
            return
        terminalreporter.write_sep("=", "replaytests summary")
        terminalreporter.write_line(summary.text_table(self.records))
        terminalreporter.write_line(f"ledger: {self.config.getoption('report_dir') / 'ledger.jsonl'}")


def header_fields(replay: ReplaySession) -> dict[str, str]:
    manifest = replay.manifest
    return {
        "model": f"{replay.options.model} (sha256 {manifest['model']['sha256'][:12]}… per bank manifest)",
        "bank": f"{replay.options.bank} ({len(replay.rows)} rows, sha256 {manifest['bank_sha256'][:12]}…)",
        "contract": f"{replay.contract.name} ({replay.options.contract})",
        "precision": ", ".join(replay.options.precisions),
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        replay = replay_session(config)
    except pytest.UsageError:
        return []
    return [f"replaytests {name}: {value}" for name, value in header_fields(replay).items()]
