"""Whole runs of replaytests in child processes forked from a server that imported torch and transformers once.

A test that runs replaytests whole (`python -m pytest --pyargs replaytests.conformance ...`, `python -m
replaytests.cli ...`, a benchmark's script) starts a child process, and most of a short child's time is its
imports, torch and transformers' model code: a one-row run takes 5.7 s from a fresh interpreter and 2.1 s forked
from the server on the 2-core machines, and the test command starts about forty such runs. Here each test process
(each xdist worker) starts one server, which imports them and waits; each run is a child forked from it: a process
of its own, with its own working directory, environment, arguments, standard streams and exit status, ended by the
interpreter's own shutdown (atexit handlers, flushed streams), as `python -m MODULE` would be. What it shares
with the server is what the server imported, and nothing there has run a kernel: the CPU level a child's contract
pins, read when torch dispatches its first kernel, is the child's own, and replaytests reads it back
(inputs/cpu_isa.py), so a server that had dispatched one would stop every pinned child with one line, not pass
on other kernels.

What a child can tell: the modules the server imported are imported (a test of what a process imports starts its
own), and the warnings their imports gave are not given again (a fresh child under pytest lists torch's deprecation
warnings in its warnings summary; a forked one does not). Where a child would differ in more, `run` starts a fresh
interpreter instead (subprocess.run, as before): a command that is not `sys.executable -m MODULE` or
`sys.executable SCRIPT.py`, or an environment that differs from the server's in a variable other than those read
at run time (RUNTIME_VARIABLES: replaytests' own, the CPU level's, pytest's) and PYTHONPATH (whose entries go where
the interpreter's startup puts them, after the working directory or the script's). Tests that signal a child, or
feed it, start their own.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What the server imports (a child of the tiny model or of SmolLM2 imports each). Not replaytests, nor a pytest
# plugin: pytest rewrites the assertions of its plugins' modules as it imports them, in the child.
PRELOAD = ("torch", "safetensors.torch", "tokenizers", "yaml", "transformers",
           "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama")
# Variables a child reads when it runs, not when the server imported: a request may differ from the server in these
RUNTIME_VARIABLES = ("REPLAYTESTS_", "PYTEST_", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def _runtime(name: str) -> bool:
    return name.startswith(RUNTIME_VARIABLES) or name == "PYTHONPATH"


def _entries(env: dict) -> list[str]:
    return [os.path.abspath(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _child(request: dict, prefix: int) -> None:
    """In the forked child: become `python COMMAND` (`-m MODULE ARGS` or `SCRIPT ARGS`) in the request's directory,
    environment and files."""
    written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # first: what fails after it reaches the child's own stderr
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], written),
                            (2, request["stderr"], written)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own stdin, kept open)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    command = request["command"]
    sys.orig_argv = [sys.executable, *command]
    module = command[1] if command[0] == "-m" else None
    sys.argv = [module, *command[2:]] if module else list(command)
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(command[0]))
    sys.path[:prefix] = [first, *_entries(request["env"])]  # as the interpreter's startup and PYTHONPATH set them
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS (random reseeds itself)
        sys.modules["numpy"].random.seed()
    import runpy

    if module:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(command[0], run_name="__main__")
    raise SystemExit(0)


def _forget_plugins() -> None:
    """Drop from sys.modules the packages of pytest plugins that the imports brought in (anyio, through
    transformers' hub client): a child's pytest marks them for assertion rewriting before it loads them, and
    warns where one is already imported. The child imports them anew, as a fresh interpreter does; what the
    server's modules hold of them stays theirs."""
    from importlib.metadata import entry_points

    plugins = {entry.value.split(".")[0].split(":")[0] for entry in entry_points(group="pytest11")}
    for name in [name for name in sys.modules if name.split(".")[0] in plugins]:
        del sys.modules[name]


def serve() -> None:
    """The server: import PRELOAD, then fork one child per request line on stdin (JSON), answering its pid and
    then its exit status (as subprocess reports it: negative for a signal), a line each."""
    import gc

    for name in PRELOAD:
        importlib.import_module(name)
    _forget_plugins()
    gc.freeze()  # what the children share stays shared: their collector does not write to it
    reply = sys.stdout.fileno()
    prefix = 1 + len(_entries(os.environ))  # the script's directory, then PYTHONPATH's: where the child's own go
    while line := sys.stdin.buffer.readline():
        request = json.loads(line)
        if threading.active_count() != 1:
            raise RuntimeError("the fork server started a thread: it cannot fork")
        pid = os.fork()
        if pid == 0:
            _child(request, prefix)
        os.write(reply, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(reply, f"{os.waitstatus_to_exitcode(status)}\n".encode())


class Server:
    """One fork server of this process, started at its first run and ended with the process."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server lives) its imports' warnings
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, env=self.env,
                                        cwd=tempfile.gettempdir())
        self.lock = threading.Lock()
        self.pending = b""
        atexit.register(self.close)

    def serves(self, env: dict) -> bool:
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys if not _runtime(k))

    def _line(self, deadline: float | None) -> str | None:
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                self.log.seek(0)
                raise RuntimeError(f"the fork server ended (exit {self.process.wait()}):\n"
                                   f"{self.log.read().decode(errors='replace')[-3000:]}")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode()

    def run(self, argv: list[str], cwd: str, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="forkserver-") as scratch:
            out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
            request = {"command": argv[1:], "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err)}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            pid = int(self._line(None))
            status = self._line(None if timeout is None else time.monotonic() + timeout)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                self._line(None)
                raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"),
                                                err.read_text(errors="replace"))
            return subprocess.CompletedProcess(argv, int(status), out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


_server: Server | None = None


def run(argv: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False), its
    child forked from this process's server where argv is `sys.executable -m MODULE ...` or `sys.executable
    SCRIPT.py ...` and env differs from the server's only in variables read at run time; otherwise started fresh."""
    global _server
    env = dict(os.environ if env is None else env)
    cwd = str(Path.cwd() if cwd is None else cwd)
    forkable = len(argv) > 1 and argv[0] == sys.executable and ((argv[1] == "-m" and len(argv) > 2)
                                                                 or argv[1].endswith(".py"))
    if forkable and _server is None:
        _server = Server()
    if not forkable or not _server.serves(env):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return _server.run(argv, cwd, env, timeout)


if __name__ == "__main__":
    serve()
