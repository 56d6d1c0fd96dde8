"""The pytest plugin's hooks (the `pytest11` entry point); each hands its work to the module of its concept:
command_line (the options, what the arguments select), state (the run's state in one RunState in
config.stash, and its session), lifecycle (the run's start and end), parameters (the conformance tests'
parameters), fixtures (registered as a plugin of its own), collector (outcomes, progress, the run's verdict
and final files) and scheduling (xdist worker groups).

The plugin is imported into every pytest run of an environment where replaytests is installed, so
neither it nor those modules import torch at module level, and a run that is not a replay run is left
alone. Before any conftest is imported it pins the CPU instruction set the run's contract names
(cpu_isa), so that torch dispatches its first kernel at that level. Each process appends the records it
computes to the run's records file; a test's report carries only their key facts; at the end the
controller writes the ledger, run.json and the report from that file, each starting with the verdict.
"""

from __future__ import annotations

import contextlib

import pytest

from replaytests.errors import RecordNotKept, ReplaytestsError
from replaytests.families.registry import MARKERS, check_plugins
from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import load_contract
from replaytests.suite import collector, command_line, fixtures, lifecycle, parameters, rerun, scheduling
from replaytests.suite.command_line import GROUPS_INI, selects_conformance, user_gave_options
from replaytests.suite.state import replay_session, run_state


def pytest_addoption(parser: pytest.Parser) -> None:
    command_line.register(parser)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Before any conftest (or test module) imports torch: pin the contract's CPU instruction set, in a
    replay run only (command_line.early_contract). After the initial conftests registered their
    options: the short aliases nobody else took."""
    contract = command_line.early_contract(early_config, args)
    if contract is not None:
        with contextlib.suppress(ReplaytestsError):  # a bad contract is reported once the session opens
            run_state(early_config).pin = cpu_isa.pin(load_contract(contract).cpu_isa)
    result = yield
    command_line.add_short_aliases(early_config, parser)
    return result


def pytest_configure(config: pytest.Config) -> None:
    try:
        check_plugins()  # a bad family entry point: one line, before anything runs
    except ReplaytestsError as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(fixtures, "replaytests-fixtures")  # pytest reads fixtures from plugins
    config.pluginmanager.register(collector.LedgerCollector(config), "replaytests-ledger")
    if (scheduling.loadgroup(config) and not hasattr(config, "workerinput")
            and (selects_conformance(config) or user_gave_options(config) or config.getini(GROUPS_INI))):
        lifecycle.make_groups_file(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    lifecycle.remove_temporary(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `--dist loadgroup` in a replay run (or a project's that sets `replaytests_xdist_groups`): loadgroup that
    keeps each group on one worker on every pytest (suite.scheduling)."""
    path = run_state(config).groups_file
    return None if path is None else scheduling.make_scheduler(config, log, path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    lifecycle.hand_to_worker(node)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker's groups on file before its collection reaches the controller: xdist's worker sends it in its own
    pytest_collection_finish, which pluggy calls before this plugin's (registered earlier) unless this one goes
    first; the controller schedules as soon as every worker has sent one, and found no file, it split every group."""
    scheduling.publish(session)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Validate every input before collection, so a bad one stops the run with one line: in a replay run
    (one that selects the conformance tests, or names a replaytests option). The plugin is installed
    for every pytest run in the environment, and any other run is left alone: it loads neither torch
    nor transformers, and a test that asks for the `replay` fixture opens the session then."""
    if selects_conformance(session.config) or user_gave_options(session.config):
        lifecycle.start(session)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize conformance tests by cell, bank row, panel row and baseline record,
    with ids like `bf16-tiny-007` (suite.parameters)."""
    if "record" in metafunc.fixturenames and command_line.is_replay_test(metafunc.definition, metafunc.fixturenames):
        parameters.parametrize(metafunc, replay_session(metafunc.config))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    try:
        return (yield)
    except RecordNotKept as exc:
        lifecycle.record_not_kept(item, exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    try:
        return (yield)
    except RecordNotKept as exc:
        lifecycle.record_not_kept(item, exc)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Mark the conformance targets for the session's device; under `pytest -n N --dist loadgroup`,
    keep every test of one (row, cell) on one worker (the marks reach xdist's scheduler through
    suite.scheduling; a record another row's test reads is shared through suite.claims). The device
    marks go on before any other plugin looks (`-m gpu` selects by them); the worker groups and the
    order of skipped targets after all of them (the groups follow the final selection; pytest's own
    reordering by parameter would undo the order)."""
    targets = [item for item in items if command_line.is_replay_test(item, getattr(item, "fixturenames", ()))]
    if not targets:
        return (yield)
    from replaytests.engine import environment

    replay = replay_session(config)
    on_cuda = replay.device.startswith("cuda")
    no_cuda = environment.needs_cuda(replay.contract, replay.device)
    for item in targets:
        if on_cuda:
            item.add_marker(pytest.mark.gpu)
        if no_cuda:
            item.add_marker(pytest.mark.skip(reason=no_cuda), append=False)
    yield
    if config.pluginmanager.hasplugin("xdist"):
        kept = set(items)
        scheduling.group_by_row([item for item in targets if item in kept])
    if no_cuda:  # nothing runs: file by file, so the skips print as one line per file, not one per row
        chosen = set(targets)
        slots = [n for n, item in enumerate(items) if item in chosen]  # the targets still selected
        for n, item in zip(slots, sorted((items[n] for n in slots), key=lambda i: str(i.path)), strict=True):
            items[n] = item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing conformance test's report carries the command that reruns it alone (suite.rerun)."""
    report = yield
    if report.failed and call.when == "call" and command_line.is_replay_test(item, getattr(item, "fixturenames", ())):
        replay = replay_session(item.config)
        report.sections.append(("rerun it alone", rerun.for_item(item, replay.options, replay.rows)))
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_json_runtest_metadata(item: pytest.Item, call: pytest.CallInfo) -> dict:
    """With pytest-json-report installed, each test's report carries the metrics it judged."""
    if call.when != "call" or fixtures.METRICS_KEY not in item.stash:
        return {}
    return {"replaytests": item.stash[fixtures.METRICS_KEY]}


def pytest_report_header(config: pytest.Config) -> list[str]:
    replay = run_state(config).session
    if replay is None:  # not a replay run
        return []
    from replaytests.suite.artifacts import header_fields

    return [f"replaytests {name}: {value}" for name, value in header_fields(replay).items()]
