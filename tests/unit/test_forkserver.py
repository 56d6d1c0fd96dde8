"""The fork server the tests start their whole runs from (forkserver.py): a forked child is the process a fresh
interpreter would be, in all a test reads of it, and the server has run no torch kernel a child's CPU pin needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import forkserver
import pytest

from replaytests.inputs import cpu_isa

PROBE = '''
import atexit, json, os, sys, time
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "path": sys.path[:2], "name": __name__,
                  "variable": os.environ.get("REPLAYTESTS_PROBE"), "torch imported": "torch" in sys.modules}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "capability":
    import torch
    print(torch.backends.cpu.get_cpu_capability())
elif sys.argv[1] == "sleep":
    time.sleep(60)
raise SystemExit(3)
'''


@pytest.fixture
def probe(tmp_path) -> tuple[list[str], dict]:
    """`python -m probe`, found through PYTHONPATH, in a directory of its own."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe.py").write_text(PROBE)
    (tmp_path / "cwd").mkdir()
    return [sys.executable, "-m", "probe"], os.environ | {"PYTHONPATH": str(tmp_path / "lib"), "REPLAYTESTS_PROBE": "x"}


def _report(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.splitlines()[0])


@pytest.mark.parametrize("how", ["module", "script"])
def test_a_forked_child_is_the_process_a_fresh_interpreter_is(probe, tmp_path, how):
    argv, env = probe
    if how == "script":
        argv = [sys.executable, str(tmp_path / "lib" / "probe.py")]
    fresh = subprocess.run([*argv, "plain", "a b"], cwd=tmp_path / "cwd", env=env, capture_output=True, text=True,
                           check=False)
    forked = forkserver.run([*argv, "plain", "a b"], cwd=tmp_path / "cwd", env=env)
    assert _report(forked).pop("torch imported") and not _report(fresh)["torch imported"], (
        "the child was not forked from the server (or the fresh one imported torch)")
    seen = [{"status": p.returncode, "stderr": p.stderr, "rest": p.stdout.splitlines()[1:],
             "report": {k: v for k, v in _report(p).items() if k != "torch imported"}} for p in (fresh, forked)]
    assert seen[0] == seen[1], f"fresh {seen[0]}\nforked {seen[1]}"
    assert seen[1]["status"] == 3 and seen[1]["rest"] == ["atexit ran"], seen[1]


def test_an_environment_read_at_import_starts_a_fresh_interpreter(probe, tmp_path):
    argv, env = probe
    proc = forkserver.run([*argv, "plain"], cwd=tmp_path / "cwd", env=env | {"CI": "probe"})  # transformers reads CI
    assert proc.returncode == 3 and not _report(proc)["torch imported"], proc.stdout


@pytest.mark.parametrize("level", ["DEFAULT", "AVX2"])
def test_a_forked_child_dispatches_at_the_level_its_environment_pins(probe, tmp_path, level):
    """The server imported torch and ran no kernel: the variables a child sets are read at its first one."""
    if not _has(cpu_isa.LEVELS[level]):
        pytest.skip(f"this CPU cannot run {level}")
    argv, env = probe
    pins = {cpu_isa.ATEN: cpu_isa.LEVELS[level].aten, cpu_isa.ONEDNN: cpu_isa.LEVELS[level].onednn}
    proc = forkserver.run([*argv, "capability"], cwd=tmp_path / "cwd", env=env | pins)
    assert _report(proc)["torch imported"], "the child was not forked from the server"
    assert proc.stdout.splitlines()[1] == level, f"pinned {level}, dispatched to {proc.stdout.splitlines()[1]}"


def _has(level: cpu_isa.Level) -> bool:
    flags = cpu_isa.cpu_flags()
    return flags is not None and all(flag in flags for flag in level.flags)


def test_a_child_past_its_timeout_is_killed_and_the_server_serves_on(probe, tmp_path):
    argv, env = probe
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([*argv, "sleep"], cwd=tmp_path / "cwd", env=env, timeout=2)
    proc = forkserver.run([*argv, "plain"], cwd=tmp_path / "cwd", env=env)
    assert proc.returncode == 3 and _report(proc)["torch imported"], proc.stdout


def test_a_child_pytest_warns_of_no_plugin_imported_before_it(tmp_path):
    """transformers' imports bring in anyio, a pytest plugin's package: a child's pytest would warn that it cannot
    rewrite its assertions, where a fresh interpreter's does not. (Its test passes where torch was imported before
    it: in a child of the server, not in a fresh interpreter, whose pytest imports no torch.)"""
    (tmp_path / "test_one.py").write_text("import sys\n\ndef test_one():\n    assert 'torch' in sys.modules\n")
    proc = forkserver.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_one.py"],
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "1 passed" in out, out[-2000:]
    assert "already imported" not in out, out[-2000:]
