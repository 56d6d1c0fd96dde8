"""suite.scheduling: a worker's xdist groups are on file before the controller schedules by them."""

import json
import re
import warnings

import pytest

from replaytests.suite.scheduling import GROUPS_KEY, make_scheduler


class Announcer:
    """Stands in for xdist's WorkerInteractor, which a worker registers after the plugins it loaded (the replaytests
    plugin among them), so that pluggy calls its pytest_collection_finish first: there it sends the worker's
    collection to the controller, whose scheduler reads the groups file once every worker has sent one."""

    def __init__(self, path):
        self.path, self.on_file = path, None

    def pytest_collection_finish(self, session):
        self.on_file = self.path.is_file()


class Worker:
    """Makes the in-process run a worker's: its workerinput names the groups file (before the replaytests plugin
    configures), and the announcer is registered as late as xdist registers its own."""

    def __init__(self, announcer):
        self.announcer = announcer

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        config.workerinput = {GROUPS_KEY: str(self.announcer.path)}
        config.pluginmanager.register(self.announcer, "announcer")


def test_a_worker_writes_its_groups_before_it_announces_its_collection(pytester, tmp_path):
    """Written after the announcement, the file can be missing when the controller schedules: every test then is its
    own group, a (cell, row) group splits over the workers and both compute its records (a real checkpoint's
    crossing, set up once per worker, ran twice in the README command)."""
    pytester.makepyfile(test_grouped="""
        import pytest

        @pytest.mark.xdist_group("tiny-001")
        def test_one():
            pass
    """)
    announcer = Announcer(tmp_path / "groups.json")
    result = pytester.inline_run("--collect-only", "-p", "no:xdist", plugins=[Worker(announcer)])
    assert result.ret == 0, result.getreports()
    assert announcer.on_file, "the worker announced its collection before it wrote its groups"
    assert json.loads(announcer.path.read_text()) == {"test_grouped.py::test_one": "tiny-001"}


@pytest.mark.parametrize("written", [True, False], ids=["groups-on-file", "no-groups"])
def test_the_scheduler_groups_by_the_workers_file_and_says_where_there_is_none(pytester, tmp_path, written):
    """Without the file every test is its own group: only slower, so the scheduler says so rather than going on
    silently."""
    path = tmp_path / "groups.json"
    if written:
        path.write_text(json.dumps({"test_a.py::test_one": "tiny-001"}))
    scheduler = make_scheduler(pytester.parseconfig("--tx", "2*popen", "--dist", "loadgroup"), None, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scope = scheduler._split_scope("test_a.py::test_one")
    said = [str(w.message) for w in caught if "no worker wrote its xdist groups" in str(w.message)]
    assert (scope, len(said)) == (("tiny-001", 0) if written else ("test_a.py::test_one", 1)), (scope, said)


GROUPED = """
    import pytest

    @pytest.mark.parametrize("n", range(6))
    @pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xdist_group(g)) for g in "ab"])
    def test_in(group, n):
        pass
"""


def test_a_project_that_opts_in_keeps_its_groups_under_loadgroup(pytester):
    """A project's own tests (no replay run) keep their xdist groups under `--dist loadgroup` where its ini sets
    replaytests_xdist_groups: each group on one worker (pytest 9.2 broke xdist's own grouping: every test its own)."""
    pytester.makeini("[pytest]\nreplaytests_xdist_groups = true\n")
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    ran = re.findall(r"^\[(gw\d)\] .*PASSED .*test_in\[(a|b)-", result.stdout.str(), re.MULTILINE)
    on = {group: {worker for worker, g in ran if g == group} for group in "ab"}
    assert len(ran) == 12 and all(len(workers) == 1 for workers in on.values()), on
