"""The platform of a run: the fields of its environment that decide its numbers (no torch).

Artifacts that hold numbers (a frozen bank, a baseline ledger, a run) record their platform, and a
check against one is a check only on the same platform (docs/contract.md, `environment.cpu_isa`). Which
fields decide a run's numbers depends on its backend: each declares its own (replaytests.backends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaytests.backends import declarations
from replaytests.files import lookup
from replaytests.inputs.schema import show

if TYPE_CHECKING:
    from replaytests.backends import Declaration

# Every run's platform fields, by device kind; its backend adds its own (its Declaration's `platform`:
# transformers' version, a serving engine's or llama.cpp's version and settings), left out where null.
BASE = {"cpu": ("hardware.device_kind", "hardware.cpu", "environment.cpu_isa", "environment.cpu_threads",
                "software.torch"),
        "cuda": ("hardware.device_kind", "hardware.gpu_name", "hardware.compute_capability", "software.torch",
                 "software.cuda")}


def platform_of(env: dict, backend: type[Declaration]) -> dict:
    """The platform of a run on `backend` from its captured environment: its fields, keyed by their dotted paths."""
    kind = env["hardware"]["device_kind"] or env["environment"]["device"].split(":")[0]
    kind = kind if kind in BASE else "cpu"
    found = {path: lookup(env, *path.split(".")) for path in BASE[kind]}
    own = {path: lookup(env, *path.split(".")) for path in backend.platform_fields(kind)}
    return found | {path: value for path, value in own.items() if value is not None}


def retired(backend: str | None) -> tuple[str, ...]:
    """The platform fields the registered backend `backend` no longer records (none for one not registered here)."""
    declared = declarations().get(backend or "")
    return declared.retired_platform if declared else ()


def platform_differences(recorded: dict | None, here: dict, artifact: str, here_name: str = "here",
                         retired_fields: tuple[str, ...] = ()) -> list[str]:
    """One line per platform field where the artifact's recorded platform differs from this one
    (`artifact` and `here_name` name the two in the line); empty where they are the same. A section of
    settings (runtime.*) is named by the keys that differ, not printed whole. A field this run's backend
    retired (`retired_fields`) and does not record is not compared: an artifact an earlier version made
    recorded it (docs/contract.md "Platforms")."""
    if not isinstance(recorded, dict):
        return [f"{artifact} records no platform (made before replaytests recorded platforms)"]
    lines = []
    for path in sorted(recorded.keys() | here.keys()):
        theirs, mine = recorded.get(path), here.get(path)
        if theirs == mine or (path in retired_fields and path not in here):
            continue
        if isinstance(theirs, dict) and isinstance(mine, dict):
            lines += [f"{path}.{key} {show(theirs.get(key))} ({artifact}) vs {show(mine.get(key))} ({here_name})"
                      for key in sorted(theirs.keys() | mine.keys()) if theirs.get(key) != mine.get(key)]
        else:
            lines.append(f"{path} {_section(theirs)} ({artifact}) vs {_section(mine)} ({here_name})")
    return lines


def _section(value: object) -> str:
    """A field's value in a line; a whole section of settings as the keys it holds."""
    return f"{{{', '.join(sorted(value))}}}" if isinstance(value, dict) else show(value)
