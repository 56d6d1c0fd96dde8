"""The platform of a run: the fields of its environment that decide its numbers (no torch).

Artifacts that hold numbers (a frozen bank, a baseline ledger, a run) record their platform, and a
check against one is a check only on the same platform (docs/contract.md, `environment.cpu_isa`).
"""

from __future__ import annotations

from replaytests.files import lookup
from replaytests.inputs.schema import show

# A serving engine's or llama.cpp's version and settings (runtime.*) are null for the Hugging Face backend.
PLATFORM = {"cpu": ("hardware.device_kind", "hardware.cpu", "environment.cpu_isa", "environment.cpu_threads",
                    "software.torch", "software.transformers", "software.vllm", "runtime.vllm",
                    "software.llama_cpp", "runtime.llamacpp"),
            "cuda": ("hardware.device_kind", "hardware.gpu_name", "hardware.compute_capability", "software.torch",
                     "software.transformers", "software.cuda", "software.vllm", "runtime.vllm")}


# Left out where null: a platform without that runtime.
RUNTIME_ONLY = ("software.vllm", "runtime.vllm", "software.llama_cpp", "runtime.llamacpp")


def platform_of(env: dict) -> dict:
    """The platform of a captured environment: its PLATFORM fields, keyed by their dotted paths."""
    kind = env["hardware"]["device_kind"] or env["environment"]["device"].split(":")[0]
    found = {path: lookup(env, *path.split(".")) for path in PLATFORM.get(kind, PLATFORM["cpu"])}
    return {path: value for path, value in found.items() if value is not None or path not in RUNTIME_ONLY}


def platform_differences(recorded: dict | None, here: dict, artifact: str, here_name: str = "here") -> list[str]:
    """One line per platform field where the artifact's recorded platform differs from this one
    (`artifact` and `here_name` name the two in the line); empty where they are the same. A section of
    settings (runtime.*) is named by the keys that differ, not printed whole."""
    if not isinstance(recorded, dict):
        return [f"{artifact} records no platform (made before replaytests recorded platforms)"]
    lines = []
    for path in sorted(recorded.keys() | here.keys()):
        theirs, mine = recorded.get(path), here.get(path)
        if theirs == mine:
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
