"""replaytests as a guest: the commands that only read ledgers, and a pytest run that selects no replay
test, load neither torch nor transformers; every option has a namespaced spelling, and a short alias
another plugin or conftest registered stays theirs (one warning)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from replaytests.inputs.options import REPO

BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny"
HEAVY = "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))"


@pytest.mark.parametrize("argv", [
    pytest.param(["report", str(BASELINE), "--out", "out"], id="report"),
    pytest.param(["compare", str(BASELINE), str(BASELINE)], id="compare"),
    pytest.param(["history", "append", str(BASELINE), "--into", "history.jsonl"], id="history"),
])
def test_commands_that_read_ledgers_load_no_torch(argv, tmp_path):
    code = (f"import sys; from replaytests.cli import main; code = main({argv!r}); "
            f"assert code == 0, code; loaded = {HEAVY}; assert not loaded, loaded[:3]")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_pytest_run_without_replay_tests_loads_no_torch(pytester):
    pytester.makepyfile(test_plain=f"import sys\n\n\ndef test_one():\n    loaded = {HEAVY}\n"
                                   "    assert not loaded, loaded\n")
    result = pytester.runpytest_subprocess("test_plain.py", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]


def test_a_test_with_fixtures_named_like_the_plugins_is_left_alone(pytester):
    """A project's own fixtures named `record`, `replay` and `cell` (the conformance tests' names): its tests are
    neither parametrized nor marked by the plugin, a failure carries no replaytests rerun command, and torch is
    never loaded. The premise, that the names reach the plugin's hooks, is the control: the passing test sees them."""
    pytester.makeconftest("import pytest\n\n\n@pytest.fixture\ndef replay():\n    return 'mine'\n\n\n"
                          "@pytest.fixture\ndef record(replay):\n    return replay\n\n\n"
                          "@pytest.fixture\ndef cell():\n    return 'bf16'\n")
    pytester.makepyfile(test_mine=f"import sys\n\n\ndef test_mine(record, cell, request):\n"
                                  "    assert {'record', 'replay', 'cell'} <= set(request.fixturenames)\n"
                                  f"    assert (record, cell) == ('mine', 'bf16')\n    loaded = {HEAVY}\n"
                                  "    assert not loaded, loaded\n\n\n"
                                  "def test_failing(record):\n    assert record == 'theirs'\n")
    result = pytester.runpytest_subprocess("test_mine.py", "-p", "no:cacheprovider", "-v")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-2000:]
    result.assert_outcomes(passed=1, failed=1)
    assert "test_mine.py::test_mine PASSED" in out, f"the project's test was parametrized or renamed:\n{out[-2000:]}"
    assert "rerun it alone" not in out and "replaytests" not in out.split("= FAILURES =")[-1], out[-2000:]


def test_every_option_has_a_namespaced_spelling_and_a_short_alias(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--replay-model=*", "*--replay-precision=*", "*--replay-report-dir=*",
                                 "*--model=* alias of --replay-model", "*--bank=* alias of --replay-bank"])


def test_a_conftest_that_registers_a_short_name_keeps_it(pytester):
    pytester.makeconftest("def pytest_addoption(parser):\n"
                          "    parser.addoption('--model', default='mine')\n"
                          "    parser.addoption('--device', default='gpu0')\n")
    pytester.makepyfile(test_mine="def test_mine(request):\n"
                                  "    assert request.config.getoption('model') == 'theirs'\n"
                                  "    assert request.config.getoption('device') == 'gpu0'\n")
    result = pytester.runpytest_subprocess("test_mine.py", "-p", "no:cacheprovider", "--model", "theirs")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    warnings = [line for line in result.stdout.lines if "belong to another plugin or conftest" in line]
    assert len(warnings) == 1 and "--model, --device" in warnings[0] and "--replay-model, --replay-device" in \
        warnings[0], warnings
