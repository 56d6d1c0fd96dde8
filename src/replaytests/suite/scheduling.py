"""Each (cell, row) group of tests on one pytest-xdist worker, on every pytest.

`--dist loadgroup` learns a test's group from a suffix its workers append to the test's node id. From
pytest 9.2 (structured node ids) that suffix no longer takes (pytest-dev/pytest-xdist#1386): every
test becomes its own group, two workers compute the same records, and `-n 2` is no faster than one.
Here each worker also writes the groups it collected (node id -> group, from the `xdist_group` marks)
to a file the controller named in its workerinput, before it sends its collection (the plugin's
pytest_collection_finish goes first), and the controller's scheduler reads them there; a test missing
from the file is grouped as xdist would group it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from replaytests.files import write_json_atomic
from replaytests.suite.planner import worker_group

GROUPS_KEY = "replaytests_groups"  # workerinput: the file the workers write their groups to


def loadgroup(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadgroup"


def make_scheduler(config: pytest.Config, log, path: Path):
    from xdist.scheduler import LoadGroupScheduling

    class RowGroupScheduling(LoadGroupScheduling):
        """loadgroup, with the groups the workers wrote (read once, when the collections are complete)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                if path.is_file():
                    self._groups = json.loads(path.read_text())
                else:
                    warnings.warn(f"replaytests: no worker wrote its xdist groups ({path}): every test is its own "
                                  "group, and a (cell, row) group may run on two workers", stacklevel=1)
                    self._groups = {}
            return self._groups.get(nodeid) or super()._split_scope(nodeid)

    return RowGroupScheduling(config, log)


def group_by_row(selected: list[pytest.Item]) -> None:
    """The xdist group of each selected target (planner.worker_group): one (cell, row) per group."""
    for item in selected:
        if group := worker_group(getattr(getattr(item, "callspec", None), "params", {})):
            item.add_marker(pytest.mark.xdist_group(group))


def publish(session: pytest.Session) -> None:
    """In a worker: write every collected test's group (its xdist_group mark) where the controller reads it."""
    path = getattr(session.config, "workerinput", {}).get(GROUPS_KEY)
    if not path:
        return
    groups = {}
    for item in session.items:
        names = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
        if names:
            groups[item.nodeid] = "_".join(names)
    write_json_atomic(Path(path), groups)
