"""Reproducibility contracts (SPEC §9): the promise a run is judged against, loaded from YAML.

This module validates the fields the engine uses; unknown keys are kept for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from replaytests.errors import ConfigError
from replaytests.files import sha256_json
from replaytests.protocol import DELIMITER_NAMES, Caps

PRECISIONS = ("bf16", "fp32")


@dataclass(frozen=True)
class PrecisionFlags:
    """Numeric settings applied before any model work at one precision."""

    dtype: str
    tf32_matmul: bool = False
    cudnn_tf32: bool = False
    float32_matmul_precision: str = "highest"
    bf16_reduced_precision_reduction: bool | None = None


@dataclass(frozen=True)
class Contract:
    name: str
    path: Path
    device: str
    cpu_threads: int
    attention: str
    physical_batch: int
    caps: Caps
    precisions: dict[str, PrecisionFlags]
    suffix_divergence_allowed: dict[str, bool]
    delimiters: dict[str, str] = field(default_factory=dict)
    banned_tokens: tuple[int, ...] = ()
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def digest(self) -> str:
        return sha256_json(self.raw)


def _require(data: dict, key: str, kind: type | tuple, where: str):
    if key not in data:
        raise ConfigError(f"{where}: missing required field {key!r}")
    value = data[key]
    if isinstance(value, bool) and kind in (int, (int, float)):
        raise ConfigError(f"{where}.{key}: expected {getattr(kind, '__name__', 'a number')}, got {value!r}")
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{key}: expected {name}, got {type(value).__name__} {value!r}")
    return value


def _positive(data: dict, key: str, where: str) -> int:
    value = _require(data, key, int, where)
    if value <= 0:
        raise ConfigError(f"{where}.{key}: expected a positive integer, got {value}")
    return value


def _precision(name: str, data: object, where: str) -> PrecisionFlags:
    if name not in PRECISIONS:
        raise ConfigError(f"{where}: unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    if not isinstance(data, dict):
        raise ConfigError(f"{where}.{name}: expected a mapping of numeric flags")
    known = set(PrecisionFlags.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}.{name}: unknown field {unknown[0]!r}; expected {sorted(known)}")
    flags = PrecisionFlags(**data)
    if flags.dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"{where}.{name}.dtype: expected bfloat16 or float32, got {flags.dtype!r}")
    return flags


def load_contract(path: Path) -> Contract:
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read contract: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}: malformed YAML{line}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a YAML mapping at the top level")
    env = _require(data, "environment", dict, where)
    decoding = _require(data, "decoding", dict, where)
    caps = _require(data, "caps", dict, where)
    precisions = _require(data, "precisions", dict, where)
    gates = _require(data, "gates", dict, where).get("crossing", {})
    delimiters = data.get("delimiters") or {}
    for name in delimiters:
        if name not in DELIMITER_NAMES:
            raise ConfigError(f"{where}.delimiters: unknown delimiter {name!r}; expected one of {DELIMITER_NAMES}")
    allowed = gates.get("suffix_divergence_allowed", {})
    return Contract(
        name=_require(data, "name", str, where),
        path=Path(path),
        device=_require(env, "device", str, f"{where}: environment"),
        cpu_threads=_positive(env, "cpu_threads", f"{where}: environment"),
        attention=env.get("attention", "sdpa"),
        physical_batch=_positive(decoding, "physical_batch", f"{where}: decoding"),
        caps=Caps(*(_positive(caps, k, f"{where}: caps") for k in ("branch", "merge", "answer"))),
        precisions={n: _precision(n, f, f"{where}: precisions") for n, f in precisions.items()},
        suffix_divergence_allowed={p: bool(allowed.get(p, False)) for p in PRECISIONS},
        delimiters=dict(delimiters),
        banned_tokens=tuple(data.get("banned_tokens") or ()),
        raw=data,
    )
