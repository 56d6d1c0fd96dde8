"""The pytest plugin: options, markers, the session object, the ledger and the summary.

Registered through the `pytest11` entry point. State lives in one ReplaySession kept in
config.stash; records ride on report.user_properties so xdist workers hand them to the controller.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaytests import audit, environment, ledger, report, summary
from replaytests.errors import ReplaytestsError
from replaytests.files import write_atomic, write_json_atomic
from replaytests.integrity import ACCEPT_OPTION, OVERRIDES
from replaytests.session import DEFAULT_BANK, DEFAULT_CONTRACT, DEFAULT_MODEL, REPO, Options, ReplaySession

RECORD_PROPERTY = "replaytests_record"
AUDIT_PROPERTY = "replaytests_audit"
GPU_CONTRACT = REPO / "contracts" / "h200.yaml"
MARKERS = {
    "gpu": "conformance targets on a CUDA device (under -m gpu the default contract is contracts/h200.yaml)",
    "replica": "fidelity layer 1: replica stability",
    "token_identity": "fidelity layer 2: token identity",
    "fidelity": "fidelity layer 3: live-state fidelity",
    "causal": "fidelity layer 4: causal state sufficiency",
    "slow": "long-running conformance targets",
}
DEFAULT_OPTIONS = vars(Options())
session_key = pytest.StashKey[ReplaySession]()
metrics_key = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replaytests", "replay conformance (replaytests)")
    group.addoption("--model", type=Path, default=DEFAULT_MODEL,
                    help="local Hugging Face model directory. Default: the embedded tiny Qwen2")
    group.addoption("--bank", type=Path, default=DEFAULT_BANK,
                    help="frozen prefix bank (JSONL with a .manifest.json beside it). Default: %(default)s")
    group.addoption("--contract", type=Path, default=None,
                    help=f"reproducibility contract (YAML). Default: {DEFAULT_CONTRACT}, or under -m gpu "
                         f"{GPU_CONTRACT}")
    group.addoption("--precision", choices=("bf16", "fp32", "both"), default="both",
                    help="precision(s) to audit. Default: %(default)r")
    group.addoption("--rows", default=None, help="a count N or a slice A:B of bank rows, for quick runs")
    group.addoption("--device", default=None, help="torch device; default: the contract's environment.device")
    group.addoption("--report-dir", type=Path, default=DEFAULT_OPTIONS["report_dir"],
                    help="where ledger.jsonl, run.json and summary.md are written. Default: %(default)s")
    group.addoption("--baseline", type=Path, default=None,
                    help="a saved ledger (or a run directory holding ledger.jsonl) every selected row must "
                         "reproduce exactly. Default: the committed baseline, for the embedded default inputs")
    group.addoption("--shard", default=None,
                    help="i/N: run only the i-th of N deterministic shares of the rows (CI matrices, job arrays)")
    group.addoption("--replication-model", type=Path, default=None,
                    help="a later checkpoint to replicate the transplant on (SPEC §7.6), with the same bank. "
                         "Default: fixtures/models/tiny-qwen2-later, for the embedded default inputs")
    group.addoption("--strict-contract", action="store_true",
                    help="fail the run when the environment differs from the contract in any field it names")
    group.addoption(ACCEPT_OPTION, action="append", choices=OVERRIDES, default=None,
                    help="use a bank, model or tokenizer that changed since the bank was frozen (recorded in "
                         "the report); repeatable")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(LedgerCollector(config), "replaytests-ledger")


def selects_gpu(config: pytest.Config) -> bool:
    """Whether the -m expression asks for the gpu marker (and would not select the items without it)."""
    expression = config.getoption("markexpr", "") or ""
    if not expression:
        return False
    try:
        from _pytest.mark.expression import Expression

        compiled = Expression.compile(expression)
    except Exception:  # the private API moved, or a bad -m expression (pytest reports that itself)
        return "gpu" in expression.split()
    layers = set(MARKERS) - {"gpu"}
    return compiled.evaluate(lambda name, **_: name in layers | {"gpu"}) and not compiled.evaluate(
        lambda name, **_: name in layers)


def options(config: pytest.Config) -> Options:
    values = {name: config.getoption(name) for name in DEFAULT_OPTIONS}
    values["accept_changed"] = frozenset(values["accept_changed"] or ())
    if values["contract"] is None:
        values["contract"] = GPU_CONTRACT if selects_gpu(config) else DEFAULT_CONTRACT
    return Options(**values)


def replay_session(config: pytest.Config) -> ReplaySession:
    """The session's inputs, opened on first use; a bad input is a usage error, one line."""
    if session_key not in config.stash:
        try:
            config.stash[session_key] = ReplaySession.open(options(config))
        except ReplaytestsError as exc:
            raise pytest.UsageError(str(exc)) from None
    return config.stash[session_key]


def user_gave_options(config: pytest.Config) -> bool:
    return any(config.getoption(name) not in (default, None, False) for name, default in DEFAULT_OPTIONS.items())


def pytest_sessionstart(session: pytest.Session) -> None:
    """Validate every input before collection, so a bad one stops the run with one line.

    The plugin is installed for every pytest run in the environment: when the user gave no
    replaytests option and the embedded defaults do not resolve, an unrelated test run is left
    alone, and the error surfaces only if a conformance test is collected.
    """
    try:
        replay = replay_session(session.config)
    except pytest.UsageError:
        if user_gave_options(session.config):
            raise
        return
    if replay.options.strict_contract and replay.drift:
        raise pytest.UsageError(f"--strict-contract: the environment differs from contract {replay.contract.name} "
                                f"in {len(replay.drift)} field(s): " + "; ".join(map(str, replay.drift)))


@pytest.fixture(scope="session")
def replay(request: pytest.FixtureRequest) -> ReplaySession:
    return replay_session(request.config)


@pytest.fixture
def record(replay: ReplaySession, request: pytest.FixtureRequest):
    """record(family, row, precision) -> the ledger record, attached to this test's report once."""

    def get(family: str, row, precision: str) -> dict:
        result = replay.record(family, row, precision)
        if replay.attach(result):
            request.node.user_properties.append((RECORD_PROPERTY, json.dumps(result)))
        request.node.stash.setdefault(metrics_key, []).append(summary.metrics(result))
        return result

    return get


@pytest.fixture
def audit_record(replay: ReplaySession, record, request: pytest.FixtureRequest):
    """audit_record(baseline) -> the Audit of that saved record against this run's recomputation."""

    def get(baseline: dict) -> audit.Audit:
        family, row, precision = ledger.key(baseline)
        result = audit.audit_record(baseline, record(family, replay.row(row), precision))
        request.node.user_properties.append((AUDIT_PROPERTY, json.dumps(
            {"key": [family, row, precision], "leaves": result.leaves, "changes": len(result.changes)})))
        return result

    return get


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize conformance tests by precision, bank row, panel row and baseline record,
    with ids like `bf16-tiny-007`."""
    if "record" not in metafunc.fixturenames:
        return
    replay = replay_session(metafunc.config)
    fixtures = set(metafunc.fixturenames)
    if "precision" in fixtures:
        metafunc.parametrize("precision", replay.options.precisions, scope="session")
    for name, family in ROW_FIXTURES.items():
        if name in fixtures:
            metafunc.parametrize(name, row_params(replay, family), scope="session")
    if "baseline_record" in fixtures:
        metafunc.parametrize("baseline_record", audit_params(replay))


# Row fixtures of the conformance tests, and the family whose rows each takes.
ROW_FIXTURES = {"bank_row": "crossing", "live_row": "live", "panel_row": "bridge", "transplant_row": "transplant",
                "replication_row": "replication"}
BF16_ONLY = ("transplant", "replication")  # families run on the BF16 crossing only


def _skipped(id_: str, reason: str) -> list:
    return [pytest.param(None, id=id_, marks=pytest.mark.skip(reason=reason))]


def row_params(replay: ReplaySession, family: str) -> list:
    if family in BF16_ONLY and "bf16" not in replay.options.precisions:
        return _skipped("no-bf16", f"{family} runs at BF16 only; --precision {replay.options.precision} excludes it")
    if family == "replication" and not replay.options.later_model:
        return _skipped("no-later-model", "no later checkpoint: pass --replication-model CKPT")
    return [pytest.param(row, id=row.id) for row in replay.family_rows(family)]


def audit_params(replay: ReplaySession) -> list:
    if replay.baseline_applies:
        return _skipped("no-baseline", replay.baseline_applies)
    return [pytest.param(r, id="-".join(ledger.key(r))) for r in replay.audited()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the conformance targets for the session's device; under `pytest -n N --dist loadgroup`,
    keep every test of one (row, precision) on one worker, so each record is computed once."""
    targets = [item for item in items if "record" in getattr(item, "fixturenames", ())]
    if not targets:
        return
    replay = replay_session(config)
    on_cuda = replay.device.startswith("cuda")
    no_cuda = environment.needs_cuda(replay.contract, replay.device)
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in targets:
        if on_cuda:
            item.add_marker(pytest.mark.gpu)
        if no_cuda:
            item.add_marker(pytest.mark.skip(reason=no_cuda), append=False)
        group = xdist and _row_group(getattr(item, "callspec", None))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def _row_group(callspec) -> str | None:
    """The xdist group of an item: the (precision, row) it reads, except that the whole BF16 crossing
    and the transplant share one group (the transplant panel is chosen from the whole BF16 crossing,
    so that worker computes it anyway)."""
    params = callspec.params if callspec else {}
    baseline = params.get("baseline_record") or {}
    precision = params.get("precision") or baseline.get("precision") or "bf16"
    if precision == "bf16" and (params.get("bank_row") or params.get("transplant_row")
                                or baseline.get("family") in ("crossing", "transplant")):
        return "bf16-crossing"
    row = baseline.get("row") or next((params[name].id for name in ROW_FIXTURES if params.get(name)), None)
    return row and f"{precision}-{row}"


@pytest.hookimpl(optionalhook=True)
def pytest_json_runtest_metadata(item: pytest.Item, call: pytest.CallInfo) -> dict:
    """With pytest-json-report installed, each test's report carries the metrics it judged."""
    if call.when != "call" or metrics_key not in item.stash:
        return {}
    return {"replaytests": item.stash[metrics_key]}


class LedgerCollector:
    """Gathers records from test reports (local or from xdist workers) and writes the ledger."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[dict] = []
        self.audits: list[dict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.records += [json.loads(v) for n, v in report.user_properties if n == RECORD_PROPERTY]
            self.audits += [json.loads(v) for n, v in report.user_properties if n == AUDIT_PROPERTY]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.records = ledger.merge(self.records)
        if not self.records or hasattr(self.config, "workerinput"):
            return
        replay = replay_session(self.config)
        report_dir = self.config.getoption("report_dir")
        meta = run_metadata(replay) | ({"audit": summary.audit_line(self.audits)} if self.audits else {})
        ledger.write_ledger(report_dir / "ledger.jsonl", self.records)
        write_json_atomic(report_dir / "run.json", meta)
        write_atomic(report_dir / "summary.md", summary.markdown(self.records, header_fields(replay), self.audits,
                                                                 self.causal_lines()))
        report.write_report(report_dir, self.records, report.run_meta(meta))

    def causal_lines(self) -> list[str]:
        minimum = replay_session(self.config).contract.panels["replication"]["min_exact_controls"]
        return summary.causal_lines(self.records, minimum)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.records:
            return
        terminalreporter.write_sep("=", "replaytests summary")
        terminalreporter.write_line(summary.text_table(self.records))
        for line in self.causal_lines():
            terminalreporter.write_line(line)
        if self.audits:
            terminalreporter.write_line(summary.audit_line(self.audits))
        terminalreporter.write_line(f"ledger: {self.config.getoption('report_dir') / 'ledger.jsonl'}")


def run_metadata(replay: ReplaySession) -> dict:
    """What a report needs besides the records: the inputs, their digests and the environment."""
    return {
        "options": {name: str(value) if isinstance(value, Path) else sorted(value) if isinstance(value, frozenset)
                    else value for name, value in vars(replay.options).items()},
        "contract": {"name": replay.contract.name, "path": str(replay.contract.path), "sha256": replay.contract.digest},
        "panels": replay.contract.panels,
        "manifest": replay.manifest,
        "environment": replay.environment,
        "drift": [str(d) for d in replay.drift],
        "overridden": replay.integrity.overridden,
        # Only when the transplant ran: its panel, and the divergent rows it could not test.
        **({"transplant_panel": replay.transplant_panel._asdict()} if "transplant_panel" in vars(replay) else {}),
    }


def header_fields(replay: ReplaySession) -> dict[str, str]:
    manifest = replay.manifest
    return {
        "model": f"{replay.options.model} (sha256 {manifest['model']['sha256'][:12]}… per bank manifest)",
        "bank": f"{replay.options.bank} ({len(replay.rows)} rows, sha256 {manifest['bank_sha256'][:12]}…)",
        "contract": f"{replay.contract.name} ({replay.options.contract})",
        "device": replay.device,
        "precision": ", ".join(replay.options.precisions),
        "baseline": replay.baseline_applies or str(replay.options.baseline_ledger),
        "drift": (f"{len(replay.drift)} field(s) differ from the contract: " + "; ".join(map(str, replay.drift))
                  if replay.drift else "none: the environment matches every field the contract names"),
        **({"overridden": "; ".join(replay.integrity.overridden)} if replay.integrity.overridden else {}),
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        replay = replay_session(config)
    except pytest.UsageError:
        return []
    return [f"replaytests {name}: {value}" for name, value in header_fields(replay).items()]


