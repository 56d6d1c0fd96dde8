"""Which llama.cpp build this venv holds: the record tools/install-llamacpp.sh writes beside the wheel it
installed (no llama_cpp import: its Declaration reads it to pick a committed baseline, its runtime to record it).

Two builds are committed against (docs/llamacpp.md "Two builds"): `avx2`, the instruction set fixed at build
time and llamafile's sgemm off, and `user`, the package's own defaults (`pip install llama-cpp-python`:
-march=native, llamafile on). A native build's code depends on the CPU it was built on, so its record names
that CPU (model name, a digest of /proc/cpuinfo's flags line) and the run's platform carries it (`build_cpu`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from replaytests.errors import ConfigError
from replaytests.files import read_json

BUILD_RECORD = "llamacpp-build.json"  # what tools/install-llamacpp.sh writes into the venv: version, ISA, flags


def record(prefix: Path | None = None) -> dict | None:
    """The build record of the venv at `prefix` (default: the running interpreter's), or None where there is
    none or it is not a JSON object."""
    path = Path(sys.prefix if prefix is None else prefix) / BUILD_RECORD
    try:
        found = read_json(path, "llama.cpp build record", ConfigError, 1 << 20)
    except ConfigError:
        return None
    return found if isinstance(found, dict) else None


def build_cpu(build: dict | None) -> str | None:
    """The CPU a native build was compiled for (`-march=native`), as its record names it; None for a build at a
    fixed instruction set (its code is the same on every CPU that has that set) or a record without it."""
    if not build or not build.get("native") or not build.get("cpu"):
        return None
    flags = build.get("cpu_flags_sha256")
    return f"{build['cpu']} (cpuinfo flags sha256 {flags})" if flags else str(build["cpu"])


def platform_settings(build: dict | None) -> dict:
    """What the run's platform (runtime.llamacpp) records of the build: its ISA, and for a native build the
    CPU it was built for (absent otherwise, so a fixed-ISA build's platform is what it was before)."""
    build = build or {}
    settings = {"build_isa": build.get("isa")}
    if (cpu := build_cpu(build)) is not None:
        settings["build_cpu"] = cpu
    return settings


def of_platform(platform: dict | None) -> tuple[str | None, str | None]:
    """(build_isa, build_cpu) of the llama.cpp build a recorded platform (a run.json's) ran on."""
    settings = (platform or {}).get("runtime.llamacpp")
    if not isinstance(settings, dict):
        return None, None
    return settings.get("build_isa"), settings.get("build_cpu")


def here() -> tuple[str | None, str | None]:
    """(build_isa, build_cpu) of this venv's build, as a run here would record it."""
    settings = platform_settings(record())
    return settings["build_isa"], settings.get("build_cpu")
