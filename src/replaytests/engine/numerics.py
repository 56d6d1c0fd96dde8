"""A cell's numeric flags as torch holds them (threads, TF32, matmul precision, reduced-precision reductions, the
SDPA backends): read, written, and applied with a read-back check. Every backend's runs record them
(engine/environment.py); the Hugging Face backend applies them before each forward call."""

from __future__ import annotations

import operator

import torch

from replaytests.errors import ConfigError
from replaytests.inputs.cells import Cell
from replaytests.inputs.contract import SDPA_BACKENDS

_SDP = {"math": "math", "flash": "flash", "efficient": "mem_efficient", "cudnn": "cudnn"}  # torch's names


def _sdpa_backends() -> str:
    """The SDPA backends torch may pick, '+'-joined in SDPA_BACKENDS order ('math' when pinned to math)."""
    return "+".join(name for name in SDPA_BACKENDS if getattr(torch.backends.cuda, f"{_SDP[name]}_sdp_enabled")())


def _set_sdpa_backends(joined: str) -> None:
    for name in SDPA_BACKENDS:
        getattr(torch.backends.cuda, f"enable_{_SDP[name]}_sdp")(name in joined.split("+"))


def _switch(owner: str, name: str) -> tuple:
    """(read, write) of torch.<owner>.<name>, looked up at each call (so a monkeypatched torch is seen)."""
    get_owner = operator.attrgetter(owner)
    return lambda: getattr(get_owner(torch), name), lambda on: setattr(get_owner(torch), name, on)


# name -> (read, write), written in this order: float32_matmul_precision overrides tf32_matmul in torch.
_NUMERIC = {
    "cpu_threads": (lambda: torch.get_num_threads(), lambda n: torch.set_num_threads(n)),
    "tf32_matmul": _switch("backends.cuda.matmul", "allow_tf32"),
    "cudnn_tf32": _switch("backends.cudnn", "allow_tf32"),
    "float32_matmul_precision": (lambda: torch.get_float32_matmul_precision(),
                                 lambda value: torch.set_float32_matmul_precision(value)),
    "bf16_reduced_precision_reduction": _switch("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    "sdpa_backend": (_sdpa_backends, _set_sdpa_backends),
}


def read_numeric_flags() -> dict:
    """Every numeric setting as torch reports it now."""
    return {name: read() for name, (read, _) in _NUMERIC.items()}


# A setting the contract leaves unpinned (null) goes back to torch's default, so that it does not
# keep what another cell's runtime pinned.
_TORCH_DEFAULTS = read_numeric_flags()


def numeric_settings(flags: Cell, threads: int) -> dict:
    """Every numeric setting as one cell of the contract asks for it."""
    wanted = {"cpu_threads": threads, "tf32_matmul": flags.tf32_matmul, "cudnn_tf32": flags.cudnn_tf32,
              "float32_matmul_precision": flags.float32_matmul_precision,
              "bf16_reduced_precision_reduction": flags.bf16_reduced_precision_reduction,
              "sdpa_backend": flags.sdpa_backend}
    return {name: _TORCH_DEFAULTS[name] if value is None else value for name, value in wanted.items()}


def write_numeric_flags(settings: dict) -> None:
    """Set each named setting (as read_numeric_flags spells it)."""
    for name, (_, write) in _NUMERIC.items():
        if name in settings:
            write(settings[name])


def apply_numeric_flags(flags: Cell, threads: int) -> dict:
    """Apply the contract's numeric settings, then read them back: a flag that did not take is an error.
    Returns the read-back settings."""
    wanted = numeric_settings(flags, threads)
    write_numeric_flags(wanted)
    actual = read_numeric_flags()
    for name, value in wanted.items():
        if actual[name] != value:
            raise ConfigError(f"numeric flag {name}: set {value!r} but it reads back {actual[name]!r}")
    return actual
