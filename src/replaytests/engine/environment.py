"""The environment a run really executes in, and where it differs from its contract (drift).

`capture` records what every run shares: python's, torch's and CUDA's versions, the device, thread counts,
CUBLAS_WORKSPACE_CONFIG and each cell's numeric flags as torch reads them back once that cell's settings are
applied; given the attention implementation a model runs, that; given the verified inputs, their digests and
the bank's size. `capture_run` adds what the run's backend describes of its own runtime (its Declaration's
`describe`: transformers' version for the Hugging Face backend, vLLM's version and settings, llama.cpp's build),
so a llama.cpp run records no transformers version. Its sections mirror the contract's (docs/contract.md), so
`drift` compares field by field.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from replaytests.engine import numerics
from replaytests.files import lookup
from replaytests.inputs import cpu_isa
from replaytests.inputs.contract import Contract
from replaytests.inputs.schema import show

if TYPE_CHECKING:
    from replaytests.backends import Declaration
    from replaytests.inputs.integrity import Integrity


@dataclass(frozen=True)
class Drift:
    """One field the contract names whose real value differs."""

    field: str
    contract: object
    actual: object

    def __str__(self) -> str:
        return f"{self.field}: contract {show(self.contract)}, actual {show(self.actual)}"


def needs_cuda(contract: Contract, device: str | None = None) -> str | None:
    """A skip reason when the run is to use CUDA and this machine has none; else None."""
    device = device or contract.device
    if device.split(":")[0] != "cuda" or torch.cuda.is_available():
        return None
    return (f"contract {contract.name} ({contract.path}) runs on {device!r} but CUDA is not available here "
            f"(torch {torch.__version__})")


def capture(contract: Contract, device: str | None = None, attention: str | None = None,
            integrity: Integrity | None = None) -> dict:
    """The real environment (see the module docstring); `device` defaults to the contract's."""
    device = device or contract.device
    threads, cell_flags = _numeric_flags(contract)
    env = {
        "software": _software(),
        "hardware": _hardware(device),
        "environment": {"device": device, "cpu_threads": threads, "cpu_isa": cpu_isa.in_force(),
                        "interop_threads": torch.get_num_interop_threads(),
                        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG")},
        "precisions": cell_flags,  # the environment record's key
    }
    if attention is not None:
        env["environment"]["attention"] = attention
    if integrity is not None:
        env["bank"] = {"rows": integrity.manifest.get("rows"), "prefix_len": integrity.manifest.get("prefix_len")}
        env["inputs"] = {"bank_sha256": integrity.actual.get("bank"), "model_sha256": integrity.actual.get("model"),
                         "tokenizer_sha256": integrity.actual.get("tokenizer"),
                         "delimiter_ids": integrity.actual.get("delimiter_ids"), "overridden": integrity.overridden}
    return env


def capture_run(contract: Contract, backend: type[Declaration], device: str | None = None,
                integrity: Integrity | None = None, attention: str | None = None) -> dict:
    """The environment of a run on `backend`: `capture`, and what the backend describes of its own runtime."""
    env = capture(contract, device, attention, integrity)
    for section, values in backend.describe(contract).items():
        env.setdefault(section, {}).update(values)
    return env


def drift(contract: Contract, env: dict) -> list[Drift]:
    """Every field the contract names (not null) that `env` captured with another value, in schema order."""
    return list(_differences(contract.settings, env, ""))


def _differences(wanted: dict, actual: dict, path: str):
    for key, value in wanted.items():
        where = f"{path}.{key}" if path else key
        if value is None or key not in actual:
            continue
        if isinstance(value, dict):
            if isinstance(actual[key], dict):
                yield from _differences(value, actual[key], where)
        elif value != actual[key]:
            yield Drift(where, value, actual[key])


def describe(contract: Contract, env: dict) -> list[str]:
    """The environment beside the contract, one line per captured field, then one line per drift."""
    rows = [(path, lookup(contract.settings, *path.split(".")), value) for path, value in _leaves(env, "")]
    width = max(len(path) for path, _, _ in rows)
    lines = [f"contract {contract.name} ({contract.path}), sha256 {contract.digest[:12]}…",
             f"{'field':<{width}}  {'contract':<24}  actual"]
    lines += [f"{path:<{width}}  {'-' if wanted is None else show(wanted):<24}  {show(value)}"
              for path, wanted, value in rows]
    differences = drift(contract, env)
    if reason := needs_cuda(contract, env["environment"]["device"]):
        lines.append(f"note: {reason}")
    if not differences:
        return [*lines, f"no drift: every field contract {contract.name} names matches this environment"]
    return [*lines, f"drift: {len(differences)} field(s) differ from contract {contract.name}:",
            *(f"  {d}" for d in differences)]


def _leaves(tree: dict, path: str):
    for key, value in tree.items():
        where = f"{path}.{key}" if path else key
        if isinstance(value, dict):
            yield from _leaves(value, where)
        else:
            yield where, value


def _numeric_flags(contract: Contract) -> tuple[int, dict]:
    """The intra-op threads and each cell's numeric flags as read back after applying its settings;
    torch's state is restored afterwards."""
    saved = numerics.read_numeric_flags()
    try:
        readback = {}
        for name, flags in contract.cells.items():
            numerics.write_numeric_flags(numerics.numeric_settings(flags, contract.cpu_threads))
            readback[name] = numerics.read_numeric_flags()
            threads = readback[name].pop("cpu_threads")
        return threads, readback
    finally:
        numerics.write_numeric_flags(saved)


def _software() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": _cudnn_version(torch.backends.cudnn.version())}


def _cudnn_version(number: int | None) -> str | None:
    """cuDNN's integer version as MAJOR.MINOR.PATCH (9.x: M*10000 + m*100 + p; 8.x: M*1000 + m*100 + p)."""
    if number is None:
        return None
    major, rest = divmod(number, 10000 if number >= 90000 else 1000)
    return "{}.{}.{}".format(major, *divmod(rest, 100))


def _hardware(device: str) -> dict:
    kind = device.split(":")[0]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    hardware = {"device_kind": kind, "gpu_name": None, "compute_capability": None, "gpus": gpus,
                "driver": None, "tensor_parallel": 1, "cpu": cpu_isa.cpu_model(),
                # The vector ISA torch's CPU kernels dispatch to (e.g. AVX2, AVX512): it decides CPU numerics.
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "onednn_max_cpu_isa": os.environ.get(cpu_isa.ONEDNN)}
    if kind != "cuda":
        return hardware
    if not gpus:  # the contract's CUDA device is absent: the machine has a CPU only
        return hardware | {"device_kind": "cpu"}
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    return hardware | {"gpu_name": torch.cuda.get_device_name(index),
                       "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability(index)),
                       "driver": _nvidia_driver()}


def _nvidia_driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None
