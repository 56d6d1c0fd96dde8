"""What a replay process loads once and keeps: torch's and transformers' modules, imported when the session
opens, and each cell's model, loaded at its first record. Hundreds of thousands of objects that every full pass
of Python's cyclic garbage collector would walk again, each time the youngest generations overflow while they
are made, and once more at interpreter exit. While they are made the collector waits; once made they are
frozen out of its passes (gc.freeze, as vLLM's engine does after its startup). What a run makes later (records,
tensors) is collected as before. Numbers are unchanged: the collector frees memory, it computes nothing.

Measured on a one-row run (`benchmarks/short_run.py`): the fixed cost of a replay process, most of a short run's
time, falls by about a third.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def kept_for_the_run() -> Iterator[None]:
    """Whatever is made inside lives as long as the process: collected neither while it is made nor after.
    The collector's state (enabled or not) is restored; nested uses freeze once each."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
