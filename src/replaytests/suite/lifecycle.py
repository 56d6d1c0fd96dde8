"""A replay run's start and end: before collection the inputs are checked and, in the controller, the
report root checked and locked and the run's directory made; the xdist workers are handed what they
share (the records file, the claims directory, the groups file); Ctrl-C and SIGTERM stop the run with
its finished records written; a record that could not be kept stops it; the temporary directories go
when it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from replaytests.engine import stop
from replaytests.errors import RecordNotKept, ReplaytestsError
from replaytests.outputs import rundir
from replaytests.suite import scheduling
from replaytests.suite.command_line import selects_conformance
from replaytests.suite.state import CLAIMS_KEY, RECORDS_KEY, replay_session, run_state

if TYPE_CHECKING:
    from replaytests.suite.session import ReplaySession

RECORDS = rundir.RECORDS


def make_groups_file(config: pytest.Config) -> None:
    """The file the workers write their xdist groups to (suite.scheduling), in a directory of its own."""
    run_state(config).groups_file = Path(tempfile.mkdtemp(prefix="replaytests-groups-")) / "groups.json"


def start(session: pytest.Session) -> None:
    """Every input checked (a bad one is a usage error, one line); in the controller (or the one
    process), the report root checked, the run's directory made when the run selects conformance tests,
    and the signals that stop the run gracefully."""
    stop.clear()  # a stop asked for in an earlier in-process run (pytester) is not this run's
    replay = replay_session(session.config)
    if replay.options.strict_contract and replay.drift:
        raise pytest.UsageError(f"--strict-contract: the environment differs from contract {replay.contract.name} "
                                f"in {len(replay.drift)} field(s): " + "; ".join(map(str, replay.drift)))
    if not hasattr(session.config, "workerinput"):
        state = run_state(session.config)
        root = state.root = open_root(replay, session.config)
        if selects_conformance(session.config):  # records reach the run's directory as they are computed
            run = state.run_dir = root.new_run(replay.options.run_name)
            replay.sink = run / RECORDS
        if session.config.pluginmanager.hasplugin("dsession"):  # the xdist controller
            interrupt_workers_too()
        else:  # one process (a worker keeps Python's default: it stops at once)
            stop_gracefully_on_interrupt(session)
        terminate_like_interrupt()


def hand_to_worker(node) -> None:
    """What an xdist worker shares with the run, in its workerinput: the groups file, the run's records
    file and the directory of claims (made for the first worker)."""
    state = run_state(node.config)
    if state.groups_file is not None:
        node.workerinput[scheduling.GROUPS_KEY] = str(state.groups_file)
    if state.run_dir is not None:
        node.workerinput[RECORDS_KEY] = str(state.run_dir / RECORDS)
        if state.claims_dir is None:
            state.claims_dir = Path(tempfile.mkdtemp(prefix="replaytests-claims-"))
        node.workerinput[CLAIMS_KEY] = str(state.claims_dir)


def remove_temporary(config: pytest.Config) -> None:
    """The groups file's directory and the claims directory, once the run ended."""
    state = run_state(config)
    for directory in (state.groups_file and state.groups_file.parent, state.claims_dir):
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def stop_gracefully_on_interrupt(session: pytest.Session) -> None:
    """A first Ctrl-C stops the run at the next forward call (engine.stop: the record being computed is
    abandoned, the finished ones are written, marked interrupted); a second one stops at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)

    def interrupt(signum, frame) -> None:
        name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        session.shouldstop = (f"interrupted ({name}): the records finished so far are written; a second signal "
                              "stops at once")
        stop.request(f"interrupted ({name}): the records finished so far are written")  # at the next forward call
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, interrupt)


def interrupt_workers_too() -> None:
    """Under xdist, a Ctrl-C or SIGTERM that reaches the controller alone (the audit forwards it to its child
    pytest, a CI runner signals one process) reaches the workers too: else each one computes its row until
    execnet kills it 10 s later, and the run takes 10-16 s to stop. The controller then stops as xdist does on
    Ctrl-C (KeyboardInterrupt), and writes what the workers finished (a record appended whole, or a torn line
    that is left out)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum, frame) -> None:
        for pid in _children():  # SIGTERM: execnet's workers ignore SIGINT; a row cut short is not a record
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)


def _children() -> list[int]:
    """The pids of this process's children (Linux /proc; none elsewhere)."""
    me, found = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(entry.path, "stat").read_text()
                    if int(stat[stat.rfind(")") + 2:].split()[1]) == me:
                        found.append(int(entry.name))
    return found


def terminate_like_interrupt() -> None:
    """SIGTERM (what CI runners and `timeout` send first) does what Ctrl-C does: the first stops
    the run gracefully, its finished records written and marked interrupted (under xdist, pytest's own
    KeyboardInterrupt path, which stops the workers); SIGKILL remains for a stop at once."""
    if threading.current_thread() is not threading.main_thread():
        return

    def terminate(signum, frame) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGTERM, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)


def open_root(replay: ReplaySession, config: pytest.Config) -> rundir.Root:
    """The report root, checked (not an input, a root or empty, writable) before any model work, and
    locked when the run selects conformance tests (a run of unit tests alone never waits for it)."""
    try:
        rundir.check_root(replay.options.report_dir, replay.inputs)
        rundir.check_name(replay.options.report_dir, replay.options.run_name)
        root = rundir.Root(replay.options.report_dir)
        if selects_conformance(config):
            root.lock()
            root.check_latest()
        return root
    except ReplaytestsError as exc:
        raise pytest.UsageError(str(exc)) from None


def record_not_kept(item: pytest.Item, exc: RecordNotKept):
    """A record that could not be kept (a full disk) fails its test in one line and stops the run: every
    test after it would fail the same way, each with a traceback. Records are computed in fixtures (setup)
    and in tests (call)."""
    item.session.shouldstop = str(exc)
    pytest.fail(str(exc), pytrace=False)
