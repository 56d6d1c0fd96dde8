"""A stop asked for by a signal, honoured between two forward calls.

A first Ctrl-C or SIGTERM (suite.lifecycle) lets pytest stop after the running test, but one test may
compute many records (the transplant's panel reads the whole BF16 crossing): measured, a stop 40 s into
a one-process audit ended 35.7 s later, past the few seconds CI runners leave before SIGKILL. Each
backend calls `check()` before each forward call it makes, so the record being computed is abandoned
(it was never appended) and the run ends as interrupted with every finished record kept.
"""

from __future__ import annotations

import threading

_requested: list[str] = []  # why the stop was asked for; empty: no stop asked
_lock = threading.Lock()


def request(why: str) -> None:
    with _lock:
        if not _requested:
            _requested.append(why)


def clear() -> None:
    with _lock:
        _requested.clear()


def check() -> None:
    """Raise KeyboardInterrupt (pytest's path for a stopped run: exit 2, the finished records written,
    marked interrupted) if a stop was asked for."""
    if _requested:
        raise KeyboardInterrupt(f"{_requested[0]} (stopped between two forward calls)")
