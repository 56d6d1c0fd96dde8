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
_MISSING = object()


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


class _Fields:
    """Typed access to one mapping of the contract; every error names FILE: dotted.path."""

    def __init__(self, data: object, path: str, file: str) -> None:
        self.path, self.file = path, file
        if not isinstance(data, dict):
            raise self.error("", f"expected a mapping, got {type(data).__name__} {data!r}")
        self.data = data

    def error(self, key: str, message: str) -> ConfigError:
        where = ".".join(part for part in (self.path, key) if part)
        return ConfigError(f"{self.file}: {where + ': ' if where else ''}{message}")

    def get(self, key: str, kind: type, default=_MISSING):
        if key not in self.data:
            if default is _MISSING:
                raise self.error("", f"missing required field {key!r}")
            return default
        value = self.data[key]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise self.error(key, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
        return value

    def positive(self, key: str) -> int:
        value = self.get(key, int)
        if value <= 0:
            raise self.error(key, f"expected a positive integer, got {value}")
        return value

    def section(self, key: str, default=_MISSING) -> _Fields:
        value = self.get(key, dict, default)
        return _Fields(value, ".".join(p for p in (self.path, key) if p), self.file)


def _precision(name: str, section: _Fields) -> PrecisionFlags:
    if name not in PRECISIONS:
        raise section.error("", f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    flags = section.section(name)
    known = list(PrecisionFlags.__dataclass_fields__)
    unknown = sorted(set(flags.data) - set(known))
    if unknown:
        raise flags.error("", f"unknown field {unknown[0]!r}; expected one of {known}")
    dtype = flags.get("dtype", str)
    if dtype not in ("bfloat16", "float32"):
        raise flags.error("dtype", f"expected bfloat16 or float32, got {dtype!r}")
    return PrecisionFlags(
        dtype=dtype,
        tf32_matmul=flags.get("tf32_matmul", bool, False),
        cudnn_tf32=flags.get("cudnn_tf32", bool, False),
        float32_matmul_precision=flags.get("float32_matmul_precision", str, "highest"),
        bf16_reduced_precision_reduction=flags.get("bf16_reduced_precision_reduction", bool, None),
    )


def _read_yaml(path: Path) -> object:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read contract: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{line}: {getattr(exc, 'problem', exc)}") from None


def load_contract(path: Path) -> Contract:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    top = _Fields(data, "", str(path))
    env, decoding, caps = top.section("environment"), top.section("decoding"), top.section("caps")
    precisions = top.section("precisions")
    gates = top.section("gates").section("crossing", {}).section("suffix_divergence_allowed", {})
    delimiters = top.section("delimiters", {})
    for name in delimiters.data:
        if name not in DELIMITER_NAMES:
            raise delimiters.error("", f"unknown delimiter {name!r}; expected one of {DELIMITER_NAMES}")
        delimiters.get(name, str)
    banned = top.get("banned_tokens", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in banned):
        raise top.error("banned_tokens", f"expected a list of non-negative token ids, got {banned!r}")
    return Contract(
        name=top.get("name", str),
        path=Path(path),
        device=env.get("device", str),
        cpu_threads=env.positive("cpu_threads"),
        attention=env.get("attention", str, "sdpa"),
        physical_batch=decoding.positive("physical_batch"),
        caps=Caps(*(caps.positive(k) for k in ("branch", "merge", "answer"))),
        precisions={name: _precision(name, precisions) for name in precisions.data},
        suffix_divergence_allowed={p: gates.get(p, bool, False) for p in PRECISIONS},
        delimiters=dict(delimiters.data),
        banned_tokens=tuple(banned),
        raw=data,
    )
