"""The backend registry: every runtime the suite drives, by name, and what each declares of itself (no torch).

A runtime is one package under engine/ (or a package of its own) plus one line: an entry of REGISTRY here for a
built-in, an entry point in the `replaytests.backends` group for a plugin (`name = package.declaration:Class`).
The line names the runtime's `Declaration`: a class holding, before any runtime library loads, everything the
rest of the suite knows of that runtime. The contract reads its settings schema (`runtime.<name>`), the cells
read its K/V and weight formats, the platform reads its fields, the report reads its title and settings, and the
suite reads its capabilities and hooks. Every default is explicit on `Declaration`; a backend overrides what it
has. Its runtime class (`runtime`, "module:Class") subclasses its declaration, so both answer the same.

A declaration module imports only this module and replaytests.inputs.schema: the contract's schema is built
from the declarations when replaytests.inputs.contract is imported.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from replaytests.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

# name -> "module:Class" of its Declaration; plugins add theirs as entry points of this group
REGISTRY = {"hf": "replaytests.engine.hf.declaration:HF",
            "vllm": "replaytests.engine.vllm.declaration:VLLM",
            "llamacpp": "replaytests.engine.llamacpp.declaration:LlamaCpp"}
DEFAULT = "hf"  # the backend a run takes when it names none, and the one a record made before runs named theirs ran on
ENTRY_POINTS = "replaytests.backends"
NATIVE = "native"  # the format a cell names for K/V or weights in its compute dtype: every backend runs it


class CellProblem(NamedTuple):
    """Why a backend cannot run a cell: the cell's field and what is wrong. `missing_library`: the cell
    is one the backend runs, with a library that is not installed here (its tests are skipped, saying
    so); otherwise the backend never runs such a cell (an error before any model work)."""

    field: str
    message: str
    missing_library: bool = False


class Declaration:
    """What one backend declares of itself; every default here is the one a backend gets by saying nothing."""

    name: ClassVar[str]  # as --backend, the contract (runtime.<name>) and the records name it
    title: ClassVar[str] = ""  # as reports name the runtime ("vLLM"); the name where empty (`label`)
    docs: ClassVar[str] = "README.md"  # where a user reads about it, named in its errors and its report section
    runtime: ClassVar[str | None] = None  # "module:Class" of its runtime class; None: this class is the runtime
    capabilities: ClassVar[frozenset[str]] = frozenset()  # engine.backend.CAPABILITIES it serves
    # The K/V cache and weight formats of its own a cell may name (inputs/cells.py), beside native.
    kv_formats: ClassVar[tuple[str, ...]] = ()
    weight_formats: ClassVar[tuple[str, ...]] = ()
    # Its contract section `runtime.<name>`: field -> inputs.schema node (docs/contract.md); empty: no section.
    settings_schema: ClassVar[dict] = {}
    # The fields of a run's environment that decide its numbers beside every run's (inputs/platforms.py), by device
    # kind; a device kind it does not name gets none. Its describe() captures them.
    platform: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The fields a platform recorded by an earlier version of this backend holds that it no longer records: never
    # compared (docs/contract.md "Platforms").
    retired_platform: ClassVar[tuple[str, ...]] = ()
    # The settings its report section prints (the platform's `runtime.<name>`, where it declares settings).
    report_settings: ClassVar[str | None] = None

    @classmethod
    def label(cls) -> str:
        """How reports and errors name the runtime: its title, else its name."""
        return cls.title or cls.name

    @classmethod
    def check_settings(cls, settings: dict, error) -> None:
        """The rules relating its settings (`settings` validated, defaults filled in); `error(path, message)` makes
        the one-line error, the path relative to runtime.<name>. By default none."""

    @classmethod
    def inspect(cls, path: Path, contract, option: str):
        """What it reads of a model before loading its weights (engine.backend.ModelFacts). By default it cannot."""
        raise ConfigError(f"{option} {path}: backend {cls.name} declares no inspect (how it reads a model's "
                          "vocabulary and limits before loading it); its Declaration must define one")

    @classmethod
    def check_loadable(cls, path: Path) -> None:
        """Refuse, in one line, a model whose weights it cannot load, before a test runs. By default no check."""

    @classmethod
    def describe(cls, contract) -> dict:
        """What a run's environment records of this runtime (engine/environment.py): sections to merge into the
        captured environment, e.g. {"software": {"vllm": "0.32.0"}}. By default nothing."""
        return {}

    @classmethod
    def cell_problem(cls, cell) -> CellProblem | None:
        """What keeps it from running `cell` in the formats the cell names, or None: by default, a K/V or weight
        format it does not declare (another backend's own, named as such)."""
        for part, noun, formats in (("kv_cache", "K/V cache", cls.kv_formats),
                                    ("weights", "weight", cls.weight_formats)):
            wanted = getattr(cell, part).format
            if wanted != NATIVE and wanted not in formats:
                owners = [d.label() for d in declarations().values()
                          if wanted in (d.kv_formats if part == "kv_cache" else d.weight_formats)]
                whose = f"a {noun} format of {' and '.join(owners)}" if owners else f"a {noun} format no backend runs"
                return CellProblem(f"{part}.format", f"{wanted} is {whose}; backend {cls.name} runs "
                                                     f"{', '.join((NATIVE, *formats))}")
        return None

    @classmethod
    def cell_versions(cls, cell) -> dict[str, str]:
        """The versions of the libraries it runs `cell` through: part of the cell's digest. By default none."""
        return {}

    @classmethod
    def cell_libraries(cls, cell) -> dict[str, str]:
        """What run.json records of the libraries it runs `cell` through. By default their versions."""
        return cls.cell_versions(cell)

    @classmethod
    def build_of(cls, platform: dict | None) -> tuple | None:
        """Which build of its runtime a recorded platform ran on, where builds differ in numbers (a committed
        baseline is taken from a run on this venv's build first: inputs/options.py). By default builds are one."""
        return None

    @classmethod
    def build_here(cls) -> tuple | None:
        """`build_of` this venv's build, as a run here would record it. By default None."""
        return None

    @classmethod
    def platform_fields(cls, kind: str) -> tuple[str, ...]:
        """The fields it adds to a run's platform on a device of `kind`."""
        return cls.platform.get(kind, ())


def load(target: str, where: str) -> type:
    """The Declaration subclass `target` ("module:Class") names; `where` names its source in errors."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(f"{where}: expected module:Class, got {target!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}: cannot import {target}: {exc}") from None
    if not (isinstance(found, type) and issubclass(found, Declaration)):
        raise ConfigError(f"{where}: {target} is not a subclass of replaytests.backends.Declaration")
    return found


@functools.cache
def declarations() -> dict[str, type[Declaration]]:
    """Every registered backend's declaration, by name: the built-ins in REGISTRY's order, then the plugins'."""
    found = {name: load(target, f"backend {name} (replaytests.backends.REGISTRY)") for name, target in REGISTRY.items()}
    for point in sorted(metadata.entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        if point.name in found:
            raise ConfigError(f"entry point {point.name} = {point.value} ({ENTRY_POINTS}): backend {point.name} is "
                              "registered already")
        found[point.name] = load(point.value, f"entry point {point.name} ({ENTRY_POINTS})")
    for name, declared in found.items():
        if declared.name != name:
            raise ConfigError(f"backend {name}: its Declaration {declared.__qualname__} names itself {declared.name!r}")
    return found


def declared(name: str, option: str = "--backend") -> type[Declaration]:
    """The declaration of the backend `name`, or one line naming the registered ones."""
    found = declarations()
    if name not in found:
        raise ConfigError(f"{option} {name!r}: expected one of {', '.join(found)} (or module:Class)")
    return found[name]


def runtime_class(declaration: type[Declaration]) -> type:
    """The runtime class a declaration names (itself where it names none)."""
    if declaration.runtime is None:
        return declaration
    return load(declaration.runtime, f"backend {declaration.name}'s runtime")
