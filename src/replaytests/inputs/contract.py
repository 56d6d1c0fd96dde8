"""Reproducibility contracts (docs/protocol.md §9): the promise a run is judged against, loaded from YAML.

SCHEMA below declares every key, in inputs/schema.py's nodes: its type, default and allowed values
(docs/contract.md explains each). Loading merges the `extends:` chain, checks the merged mapping against
SCHEMA, checks the fields that depend on each other and fills in the defaults. Every error is one line,
`FILE: dotted.path: what was expected`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.backends import declarations
from replaytests.errors import CONTROLS, ConfigError, short
from replaytests.families import registry
from replaytests.files import sha256_json
from replaytests.inputs import cells
from replaytests.inputs.blocks import CACHES, DELIMITER_NAMES, Caps
from replaytests.inputs.cells import Cell
from replaytests.inputs.cpu_isa import LEVELS
from replaytests.inputs.gates import Gates
from replaytests.inputs.schema import (
    MAX_BATCH,
    MAX_COUNT,
    MAX_DEVICES,
    NUMBER,
    Checker,
    KeyedBy,
    ListOf,
    Named,
    Section,
    Value,
    pin,
    read_yaml,
    show,
)

SCHEMA_ID = "replaytests.contract/1"
BOUNDARY_CHECKS = ("token_ids", "role_ids", "visibility", "positions", "cache_positions", "padding",
                   "cache_seq_length", "tensor_metadata")
SDPA_BACKENDS = ("math", "flash", "efficient", "cudnn")
VISIBILITY_MODES = ("roles", "causal")  # engine.protocol.VISIBILITIES

_GREEDY = "(the engine decodes greedily only)"
_CELL = Section({
    "dtype": Value(str, choices=cells.DTYPES),
    "tf32_matmul": Value(bool, default=False),
    "cudnn_tf32": Value(bool, default=False),
    "float32_matmul_precision": pin(choices=("highest", "high", "medium")),
    "bf16_reduced_precision_reduction": pin(bool),
    "sdpa_backend": pin(choices=SDPA_BACKENDS),
    "kv_cache": Section({
        "format": Value(str, default="native", choices=cells.KV_FORMATS),
        "library": pin(),
        "bits": pin(int, low=1, high=16),
        "group_size": pin(int, low=1, high=MAX_COUNT),
        "residual_length": pin(int, low=0, high=MAX_COUNT),
    }, default={}),
    "weights": Section({
        "format": Value(str, default="native", choices=cells.WEIGHT_FORMATS),
        "library": pin(),
        "group_size": pin(int, low=1, high=MAX_COUNT),
    }, default={}),
})

SCHEMA = Section({
    "schema": Value(str, default=SCHEMA_ID, choices=(SCHEMA_ID,)),
    "extends": pin(),  # resolved before validation; listed so that a misspelling gets a suggestion
    "name": Value(str, pattern=rf"[^{CONTROLS}]{{1,200}}", expect="1 to 200 characters, none a control character"),
    "description": Value(str, default="", pattern=r"[^\x00-\x08\x0b-\x1f\x7f-\x9f]*",
                         expect="text without control characters (newlines and tabs allowed)"),
    "software": Section({key: pin() for key in ("python", "torch", "transformers", "cuda", "cudnn")}, default={}),
    "hardware": Section({
        "device_kind": pin(choices=("cpu", "cuda")),
        "gpu_name": pin(),
        "compute_capability": pin(pattern=r"\d+\.\d+", expect='MAJOR.MINOR in quotes, e.g. "9.0"'),
        "gpus": pin(int, low=1, high=MAX_DEVICES),
        "tensor_parallel": Value(int, default=1, choices=(1,), expect="1 (the engine runs the model on one device)"),
    }, default={}),
    "environment": Section({
        "device": Value(str, pattern=r"cpu|cuda(:\d+)?|mps", expect="cpu, cuda, cuda:N or mps"),
        "cpu_threads": Value(int, low=1, high=MAX_DEVICES),
        "cpu_isa": pin(choices=tuple(LEVELS)),
        "attention": Value(str, default="sdpa", choices=("sdpa", "eager")),
        "cache": Value(str, default="dynamic", choices=CACHES),
        "inference_mode": Value(str, default="eager", choices=("eager",),
                                expect="eager (forward calls run op by op under torch.inference_mode)"),
        "compile": Value(bool, default=False, choices=(False,), expect="false (the engine never uses torch.compile)"),
    }),
    # The paper's two cells under their old key, and any others under `cells:` (inputs/cells.py).
    "precisions": KeyedBy(cells.PAPER, "precision", _CELL, default={}),
    "cells": Named("cell", _CELL, **cells.CELL_NAMES, default={}),
    # Pairs of cells compared paired, row by row (the paper's reduction bf16 -> fp32; a quantized cell
    # against its native cell: the amplification).
    # Default (left out or empty): the paper's pair, where both are declared.
    "cell_pairs": ListOf(ListOf(Value(str, pattern=cells.NAME_PATTERN, expect="a cell name")), default=[]),
    "decoding": Section({
        "greedy": Value(bool, default=True, choices=(True,), expect=f"true {_GREEDY}"),
        "temperature": Value(NUMBER, default=0, choices=(0,), expect=f"0 {_GREEDY}"),
        "top_p": Value(NUMBER, default=1, choices=(1,), expect=f"1 {_GREEDY}"),
        "top_k": Value(int, default=0, choices=(0,), expect=f"0 {_GREEDY}"),
        # 2 at least: its copies are compared with each other, and the batch family's pair with a singleton (a
        # batch of 1 would compare each construction with itself, a check with nothing in it)
        "physical_batch": Value(int, low=2, high=MAX_BATCH, expect=f"an integer from 2 to {MAX_BATCH} (the "
                                "identical copies compared in every forward call; 1 would compare nothing)"),
    }),
    "protocol": Section({"visibility": Value(str, default="roles", choices=VISIBILITY_MODES)}, default={}),
    # Each backend's own settings, under its name (its Declaration's `settings`; replaytests.backends).
    "runtime": Section({name: Section(declared.settings_schema, default={})
                        for name, declared in declarations().items() if declared.settings_schema}, default={}),
    "caps": Section({key: Value(int, low=1, high=MAX_COUNT) for key in ("branch", "merge", "answer")}),
    "delimiters": KeyedBy(DELIMITER_NAMES, "delimiter", Value(str), default={}),
    "banned_tokens": ListOf(Value(int, low=0, high=MAX_COUNT), default=[]),
    "boundary_checks": ListOf(Value(str, choices=BOUNDARY_CHECKS), default=list(BOUNDARY_CHECKS)),
    "bank": Section({
        "rows": pin(int, low=1, high=MAX_COUNT),
        "prefix_len": Section({"min": pin(int, low=1, high=MAX_COUNT), "max": pin(int, low=1, high=MAX_COUNT)},
                              default={}),
    }, default={}),
    # Each family's contract sections (its registry record: families/registry.py): its panel's size under `panels:`,
    # its settings (the section its `run` takes) and its gates under `gates:`; `gates.audit` is the ledger audit's.
    "panels": Section(registry.declared("panels"), default={}),
    **registry.declared("settings"),
    "gates": Section(registry.declared("gates") | {"audit": Section({"reproduce": Value(bool, default=True)},
                                                                    default={})}),
})
_DIVERGENCE = "suffix_divergence_allowed"
_REFERENCE = registry.DIVERGENCE_REFERENCE
# The gate sections that say whether a cell's suffixes may diverge, the reference family's first: its value per cell is
# the contract's (Contract.may_diverge) and every other's default.
_DIVERGENCE_GATES = (_REFERENCE, *(name for name, node in SCHEMA.keys["gates"].keys.items()
                                   if _DIVERGENCE in node.keys and name != _REFERENCE))
# Each family's `gates:` section (its registry record's gate_section), which Gates judges it by.
_GATE_SECTIONS = {family.name: family.gate_section for family in registry.FAMILIES.values()}
_CONTROLS = {family.name: family.control[:2] for family in registry.FAMILIES.values() if family.control}


@dataclass(frozen=True)
class Contract:
    name: str
    path: Path
    device: str
    cpu_threads: int
    attention: str
    physical_batch: int
    caps: Caps
    cells: dict[str, Cell]  # in the contract's order: `precisions:` first, then `cells:`
    suffix_divergence_allowed: dict[str, bool]
    delimiters: dict[str, str] = field(default_factory=dict)
    banned_tokens: tuple[int, ...] = ()
    raw: dict = field(default_factory=dict, repr=False)  # the merged YAML, as written
    settings: dict = field(default_factory=dict, repr=False)  # validated, every default filled in

    @property
    def digest(self) -> str:
        return sha256_json(self.raw)

    def cell(self, name: str) -> Cell:
        """The declared cell `name`; one that is not declared is one line naming the contract."""
        if name not in self.cells:
            raise ConfigError(f"{self.path}: cell {short(name)} is not declared by contract {self.name} (its cells: "
                              f"{', '.join(self.cells)})")
        return self.cells[name]

    def runtime(self, backend: str) -> dict:
        """The settings of `backend` (runtime.<name>, its Declaration's schema), every default filled in; a backend
        that is not registered (a module:Class) has none, in one line."""
        if backend not in self.settings["runtime"]:
            raise ConfigError(f"{self.path}: runtime.{backend}: no such section: backend {backend} declares no "
                              "settings, or is not registered (replaytests.backends: a REGISTRY line or an entry "
                              "point)")
        return self.settings["runtime"][backend]

    def may_diverge(self, name: str) -> bool:
        """Whether the reference family's suffixes (the crossing's) may diverge at cell `name`: where the transplant
        and the replication run."""
        return self.suffix_divergence_allowed[name]

    # Sections of `settings`, each a dict shaped as in docs/contract.md.
    software = property(lambda self: self.settings["software"])
    hardware = property(lambda self: self.settings["hardware"])
    decoding = property(lambda self: self.settings["decoding"])
    bank = property(lambda self: self.settings["bank"])
    panels = property(lambda self: self.settings["panels"])
    gates = functools.cached_property(lambda self: Gates.from_settings(self.settings["gates"], _GATE_SECTIONS,
                                                                       _REFERENCE, _CONTROLS))
    cpu_isa = property(lambda self: self.settings["environment"]["cpu_isa"])
    cache = property(lambda self: self.settings["environment"]["cache"])
    visibility = property(lambda self: self.settings["protocol"]["visibility"])
    cell_pairs = property(lambda self: [tuple(pair) for pair in self.settings["cell_pairs"]])
    inference_mode = property(lambda self: self.settings["environment"]["inference_mode"])
    compile = property(lambda self: self.settings["environment"]["compile"])


def _check_together(s: dict, fields: Checker) -> None:
    """The rules that relate two fields; fills in the defaults that depend on another field."""
    declared = _cells(s, fields)
    for name, flags in declared.items():
        path = f"{'precisions' if name in s['precisions'] else 'cells'}.{name}"
        cells.check(name, flags, lambda where, message, path=path, name=name: fields.error(
            where.replace(f"cells.{name}", path, 1), message))
        # torch ties the two: TF32 matmul is on exactly when the float32 matmul precision is not "highest".
        tf32, precision = flags["tf32_matmul"], flags["float32_matmul_precision"]
        if precision is None:
            flags["float32_matmul_precision"] = "high" if tf32 else "highest"
        elif (precision != "highest") != tf32:
            raise fields.error(f"{path}.float32_matmul_precision",
                               f"expected {'high or medium' if tf32 else 'highest'} with tf32_matmul {show(tf32)} "
                               f"(torch enables TF32 matmul exactly when this is not 'highest'), got {precision!r}")
    for index, pair in enumerate(s["cell_pairs"]):
        if len(pair) != 2 or pair[0] == pair[1]:
            raise fields.error(f"cell_pairs[{index}]", f"expected two different cell names [A, B], got {pair}")
        for name in pair:
            if name not in declared:
                raise fields.unknown(f"cell_pairs[{index}]", "cell", name, list(declared))
    s["cell_pairs"] = s["cell_pairs"] or cells.paper_pairs(declared)
    kind, device = s["hardware"]["device_kind"], s["environment"]["device"]
    if kind is not None and kind != device.split(":")[0]:
        raise fields.error("hardware.device_kind", f"expected {device.split(':')[0]} to match environment.device "
                                                   f"{device!r}, got {kind!r}")
    low, high = s["bank"]["prefix_len"]["min"], s["bank"]["prefix_len"]["max"]
    if low is not None and high is not None and low > high:
        raise fields.error("bank.prefix_len", f"expected min <= max, got min {low} and max {high}")
    if sorted(s["boundary_checks"]) != sorted(BOUNDARY_CHECKS):
        raise fields.error("boundary_checks", f"expected each of {', '.join(BOUNDARY_CHECKS)} once (the engine "
                                              f"always runs every boundary check), got {s['boundary_checks']}")
    for name, settings in s["runtime"].items():
        declarations()[name].check_settings(settings, lambda where, message, name=name: fields.error(
            f"runtime.{name}.{where}", message))
    for family in registry.FAMILIES.values():
        if family.check_settings is not None:
            family.check_settings(s[family.settings], lambda where, message, section=family.settings: fields.error(
                f"{section}.{where}", message))
    _fill_divergence(s["gates"], list(declared), fields)


def _cells(s: dict, fields: Checker) -> dict[str, dict]:
    """Every declared cell's settings, `precisions:` first, then `cells:`; at least one, each name once."""
    if both := sorted(s["precisions"].keys() & s["cells"].keys()):
        raise fields.error(f"cells.{both[0]}", "declared under precisions too: a cell is declared once")
    for name, flags in s["precisions"].items():
        if flags["dtype"] != cells.PAPER_DTYPES[name]:
            raise fields.error(f"precisions.{name}.dtype", f"expected {cells.PAPER_DTYPES[name]} for precision {name}, "
                                                           f"got {flags['dtype']!r}")
    declared = s["precisions"] | s["cells"]
    if not declared:
        raise fields.error("cells", f"expected at least one cell (or precisions: {', '.join(cells.PAPER)})")
    return declared


def _fill_divergence(gates: dict, declared: list[str], fields: Checker) -> None:
    """Every declared cell gets a divergence gate in each family's section that has one: a cell the reference family
    (the crossing) leaves unnamed is exact (false), and every other family takes its value where it names none. A gate
    naming a cell the contract does not declare is an error."""
    for section in _DIVERGENCE_GATES:
        allowed = gates[section][_DIVERGENCE]
        for name in allowed:  # the paper's cells may be named undeclared (a contract declaring one of them)
            if name not in declared and name not in cells.PAPER:
                raise fields.unknown(f"gates.{section}.{_DIVERGENCE}", "cell", name, declared)
    reference = gates[_REFERENCE][_DIVERGENCE]
    reference |= {name: False for name in declared if reference.get(name) is None}
    for section in _DIVERGENCE_GATES[1:]:
        allowed = gates[section][_DIVERGENCE]
        allowed |= {name: value for name, value in reference.items() if allowed.get(name) is None}


def default_gates() -> Gates:
    """The gates `compare` judges by without a contract: every default, over the paper's two cells with
    the paper's divergence gates (bf16 may diverge, fp32 is exact)."""
    fields = Checker("(contract defaults)")
    gates = fields.check(SCHEMA.keys["gates"], {_REFERENCE: {_DIVERGENCE: cells.PAPER_DIVERGENCE}})
    _fill_divergence(gates, list(cells.PAPER), fields)
    return Gates.from_settings(gates, _GATE_SECTIONS, _REFERENCE, _CONTROLS)


def _merge(base: dict, child: dict) -> dict:
    """Mappings merge key by key (the child wins); anything else, lists included, is replaced."""
    return base | {key: _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict)
                   else value for key, value in child.items()}


MAX_EXTENDS = 32  # contracts in one extends chain


def _resolve(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The mapping at `path` with its `extends:` chain merged in."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected str (a contract path relative to this file), "
                          f"got {type(base).__name__} {base!r}")
    chain, target = (*chain, path), path.parent / base
    if len(chain) > MAX_EXTENDS:
        raise ConfigError(f"{chain[0]}: extends chain longer than {MAX_EXTENDS} contracts (at {path.name})")
    if target.resolve() in {link.resolve() for link in chain}:
        raise ConfigError(f"{chain[0]}: extends cycle: {' -> '.join(link.name for link in (*chain, target))}")
    if not target.is_file():
        raise ConfigError(f"{path}: extends: no contract file {target}")
    return _merge(_resolve(target, chain), data)


def load_contract(path: Path) -> Contract:
    path = Path(path)
    raw = _resolve(path)
    fields = Checker(str(path))
    s = fields.check(SCHEMA, raw)
    _check_together(s, fields)
    del s["extends"]
    env = s["environment"]
    return Contract(
        name=s["name"],
        path=path,
        device=env["device"],
        cpu_threads=env["cpu_threads"],
        attention=env["attention"],
        physical_batch=s["decoding"]["physical_batch"],
        caps=Caps(**s["caps"]),
        cells={name: cells.from_settings(name, flags) for name, flags in (s["precisions"] | s["cells"]).items()},
        suffix_divergence_allowed=s["gates"][_REFERENCE][_DIVERGENCE],
        delimiters=s["delimiters"],
        banned_tokens=tuple(s["banned_tokens"]),
        raw=raw,
        settings=s,
    )
