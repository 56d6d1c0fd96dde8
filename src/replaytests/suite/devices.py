"""The torch device a run computes on: --device checked against what this machine has, and one GPU per
xdist worker."""

from __future__ import annotations

import torch

from replaytests.errors import ConfigError, short


def pinned_device(device: str, worker: str | None) -> str:
    """Under pytest-xdist each worker gets one GPU: worker gwK takes visible device K mod count
    (a restarted worker takes a fresh K, and still lands on a visible device)."""
    if device != "cuda" or not worker or not torch.cuda.is_available():
        return device
    return f"cuda:{int(worker.removeprefix('gw')) % torch.cuda.device_count()}"


def check_device(device: str | None) -> None:
    """--device names a torch device this machine has (CUDA absent is a skip, not an error)."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"--device {short(device)}: expected cpu, cuda, cuda:N or mps") from None
    if parsed.type not in ("cpu", "cuda", "mps") or (parsed.type == "cpu" and parsed.index not in (None, 0)):
        raise ConfigError(f"--device {device}: expected cpu, cuda, cuda:N or mps")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if parsed.type == "cuda" and gpus and (parsed.index or 0) >= gpus:
        raise ConfigError(f"--device {device}: this machine has {gpus} CUDA device(s), cuda:0 to cuda:{gpus - 1}")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {device}: this machine has no MPS device (Apple silicon, a torch built for it)")
