"""The state of a replay run in one pytest process, in one place: a RunState kept in config.stash,
made on first use (the early CPU pin, before options are parsed, may be the first). The xdist
controller hands a worker what it needs of it in the worker's workerinput (RECORDS_KEY, CLAIMS_KEY,
scheduling.GROUPS_KEY); a worker's session reads them when it opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from replaytests.errors import ReplaytestsError
from replaytests.suite import command_line

if TYPE_CHECKING:
    from replaytests.inputs import cpu_isa
    from replaytests.outputs import rundir
    from replaytests.suite.session import ReplaySession

RECORDS_KEY = "replaytests_records"  # workerinput: the run's records file, which every worker appends to
CLAIMS_KEY = "replaytests_claims"  # workerinput: the run's directory of claimed records (suite.claims)


@dataclass
class RunState:
    pin: cpu_isa.Pin | None = None  # the contract's CPU instruction set, pinned before any conftest
    session: ReplaySession | None = None  # the session's inputs (replay_session), in a replay run only
    root: rundir.Root | None = None  # the controller's report root, checked (and locked by a conformance run)
    run_dir: Path | None = None  # the run's directory, made when the run starts (the controller's)
    claims_dir: Path | None = None  # the controller's directory of claims, removed when the run ends
    groups_file: Path | None = None  # the controller's file of xdist groups (suite.scheduling)


_key = pytest.StashKey[RunState]()


def run_state(config: pytest.Config) -> RunState:
    return config.stash.setdefault(_key, RunState())


def replay_session(config: pytest.Config) -> ReplaySession:
    """The session's inputs, opened on first use; a bad input is a usage error, one line. A worker's
    session appends to the run's records file and shares records through the run's claims."""
    state = run_state(config)
    if state.session is None:
        from replaytests.suite.session import ReplaySession

        try:
            state.session = ReplaySession.open(command_line.options(config), state.pin)
        except ReplaytestsError as exc:
            raise pytest.UsageError(str(exc)) from None
        workerinput = getattr(config, "workerinput", {})
        if RECORDS_KEY in workerinput:
            from replaytests.suite.claims import Claims

            state.session.sink = Path(workerinput[RECORDS_KEY])
            state.session.claims = Claims(Path(workerinput[CLAIMS_KEY]), state.session.sink)
    return state.session
