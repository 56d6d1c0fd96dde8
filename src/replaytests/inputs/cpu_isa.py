"""The CPU instruction set torch's kernels dispatch to, pinned by the contract before torch starts.

torch picks its CPU kernels by the machine: ATen's vectorised kernels (AVX2 or AVX-512) and oneDNN's
(whose BF16 matmul exists only from AVX-512 up), and BF16 trajectories differ between them. A CPU
contract therefore pins a level (`environment.cpu_isa`, in torch's capability names), applied through
ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA; both are read once, when torch dispatches its first
kernel, so `pin` runs before that and `in_force` reads the level back afterwards.

Environment variables a user set are respected (they are how a user plays another machine): the
contract's level is then not applied and the difference is drift. Variables that replaytests set in
a parent process (marked in REPLAYTESTS_CPU_ISA) are re-pinned by the child's own contract. This
module imports torch only inside `in_force`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from replaytests.errors import ConfigError

ATEN, ONEDNN, MARK = "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "REPLAYTESTS_CPU_ISA"


@dataclass(frozen=True)
class Level:
    aten: str  # ATEN_CPU_CAPABILITY
    onednn: str  # ONEDNN_MAX_CPU_ISA: the level's own cap, so that every machine above it runs the same kernels
    flags: tuple[str, ...]  # /proc/cpuinfo flags the level needs (ATen's own test for it)
    onednn_bf16: bool  # whether oneDNN's BF16 kernels exist under that cap


LEVELS = {
    "DEFAULT": Level("default", "SSE41", (), False),
    "AVX2": Level("avx2", "AVX2", ("avx2", "fma"), False),
    "AVX512": Level("avx512", "AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"), True),
}
X86 = ("x86_64", "amd64")
# The values torch and oneDNN read (torch compares ATEN_CPU_CAPABILITY case-sensitively and ignores any
# other value with a warning, dispatching by the machine instead: a typo would silently drop the pin).
ATEN_VALUES = ("default", "avx2", "avx512", "vsx", "zvector", "sve128", "sve256", "sve512")
ONEDNN_VALUES = ("DEFAULT", "ALL", "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                 "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX",
                 "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16")


@dataclass(frozen=True)
class Pin:
    """What `pin` did: the contract's level, whether it was applied, and why not where it was not."""

    level: str | None
    applied: bool
    note: str = ""

    @property
    def how_to_run(self) -> str:
        level = LEVELS[self.level]
        return f"{ATEN}={level.aten} {ONEDNN}={level.onednn}"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags, or None where the machine does not say (not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.partition(":")[2].split()}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (the first `model name` line), or the processor platform.processor() names
    where the machine does not list one. Part of a CPU platform: the same dispatch level still runs
    other kernels on another CPU (MKL's FP32 GEMM changed every FP32 digest between an AMD EPYC and an
    Intel Xeon, both pinned to AVX2)."""
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as lines:
            names = [line.partition(":")[2].strip() for line in lines if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or None


def _inherited() -> bool:
    """Whether the dispatch variables are exactly what replaytests set in a parent process."""
    level = LEVELS.get(os.environ.get(MARK, ""))
    return level is not None and (os.environ.get(ATEN), os.environ.get(ONEDNN)) == (level.aten, level.onednn)


def _clear() -> None:
    for name in (ATEN, ONEDNN, MARK):
        os.environ.pop(name, None)


def check_variables() -> None:
    """A ConfigError, one line, for a dispatch variable torch or oneDNN would not understand: they would
    ignore it and dispatch by the machine, and the run would pass on kernels nobody chose."""
    for name, values in ((ATEN, ATEN_VALUES), (ONEDNN, ONEDNN_VALUES)):
        if name in os.environ and os.environ[name] not in values:
            raise ConfigError(f"{name}={os.environ[name]!r} in the environment: torch would ignore it and dispatch by "
                              f"the machine; expected one of {', '.join(values)} (or unset it)")


def pin(level: str | None, flags: set[str] | None = None, machine: str | None = None) -> Pin:
    """Set the dispatch variables for `level` (a key of LEVELS; None: not pinned) unless the user set
    them or this CPU cannot run that level. Call it before torch dispatches its first kernel. A value
    the user set that torch would not understand is refused (check_variables)."""
    if _inherited():
        _clear()
    check_variables()
    user = {name: os.environ[name] for name in (ATEN, ONEDNN) if name in os.environ}
    if level is None:
        return Pin(None, False, "the contract does not pin the CPU instruction set")
    if user:
        return Pin(level, False, "set in the environment: " + " ".join(f"{k}={v}" for k, v in user.items()))
    machine = (machine or platform.machine()).lower()
    if machine not in X86:
        return Pin(level, False, f"this machine is {machine}, not x86-64")
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return Pin(level, False, "this machine does not list its CPU flags (/proc/cpuinfo)")
    if missing := [flag for flag in LEVELS[level].flags if flag not in flags]:
        return Pin(level, False, f"this CPU lacks {', '.join(missing)}")
    os.environ.update({ATEN: LEVELS[level].aten, ONEDNN: LEVELS[level].onednn, MARK: level})
    return Pin(level, True)


def in_force() -> str:
    """The level torch's kernels dispatch to, read back from torch: ATen's capability, qualified where
    oneDNN's BF16 kernels are on while that level has none, or the other way round (e.g. 'AVX2 (oneDNN
    BF16 kernels on)': oneDNN was not capped with it)."""
    import torch

    aten = torch.backends.cpu.get_cpu_capability()
    level = LEVELS.get(aten)
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if level is None or supported is None or (bf16 := bool(supported())) == level.onednn_bf16:
        return aten
    return f"{aten} (oneDNN BF16 kernels {'on' if bf16 else 'off'})"


def platform_line() -> str:
    """The CPU model and the level in force, as a command's header and its report name the platform."""
    return f"{cpu_model() or 'CPU model not listed'}, kernels at {in_force()}"


def check_applied(pinned: Pin, where: str) -> str | None:
    """The one-line error when replaytests applied a level but torch reads back another (torch had
    dispatched a kernel before the contract was read); None when all is well."""
    if not pinned.applied or (actual := in_force()) == pinned.level:
        return None
    return (f"{where} pins cpu_isa {pinned.level}, but torch already dispatches its CPU kernels to {actual} (torch "
            f"ran before replaytests read the contract); run again with {pinned.how_to_run} set in the environment")


def apply(level: str | None, where: str, pinned: Pin | None = None) -> Pin:
    """Pin `level` (unless `pinned` already did) and read it back: a ConfigError, one line, where torch
    ran with another level before it was pinned."""
    if pinned is None or pinned.level != level:
        pinned = pin(level)
    if error := check_applied(pinned, where):
        raise ConfigError(error)
    return pinned
