"""Reproducibility contracts (docs/protocol.md §9): the promise a run is judged against, loaded from YAML.

SCHEMA below declares every key: its type, default and allowed values (docs/contract.md explains
each). Loading merges the `extends:` chain, validates the merged mapping against SCHEMA, checks the
fields that depend on each other and fills in the defaults. Every error is one line,
`FILE: dotted.path: what was expected`.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from replaytests.errors import CONTROLS, ConfigError, short
from replaytests.files import read_text, sha256_json
from replaytests.inputs import cells
from replaytests.inputs.blocks import CACHES, DELIMITER_NAMES, Caps
from replaytests.inputs.cells import Cell
from replaytests.inputs.cpu_isa import LEVELS
from replaytests.inputs.gates import Gates

SCHEMA_ID = "replaytests.contract/1"
BOUNDARY_CHECKS = ("token_ids", "role_ids", "visibility", "positions", "cache_positions", "padding",
                   "cache_seq_length", "tensor_metadata")
SDPA_BACKENDS = ("math", "flash", "efficient", "cudnn")
VISIBILITY_MODES = ("roles", "causal")  # engine.protocol.VISIBILITIES
_REQUIRED = object()
# Upper bounds: a count past them is a typo, not a setting (threads and GPUs of one machine, the
# copies of one physical batch, rows, tokens and panel sizes).
MAX_DEVICES, MAX_BATCH, MAX_COUNT = 1024, 64, 1_000_000


@dataclass(frozen=True)
class Value:
    """A leaf. A default of None means "not pinned": null is then allowed too."""

    kind: type | tuple[type, ...]
    default: object = _REQUIRED
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    pattern: str | None = None
    expect: str = ""  # how an allowed value reads in an error, where choices or range do not say it


@dataclass(frozen=True)
class Section:
    """A mapping with fixed keys; a default of {} makes it optional, with its keys' defaults."""

    keys: dict
    default: object = _REQUIRED


@dataclass(frozen=True)
class KeyedBy:
    """A mapping whose keys come from a vocabulary (`noun`s), each holding a `value`; names left
    out take the value's default where it has one."""

    names: tuple[str, ...]
    noun: str
    value: Value | Section
    default: object = _REQUIRED


@dataclass(frozen=True)
class Named:
    """A mapping whose keys are names the contract itself chooses (its cells), each matching
    `pattern` and holding a `value`."""

    noun: str
    value: Value | Section
    pattern: str
    default: object = _REQUIRED


@dataclass(frozen=True)
class ListOf:
    item: Value
    default: object = _REQUIRED


def _pin(kind: type = str, **kw) -> Value:
    return Value(kind, default=None, **kw)


def _divergence() -> Named:
    """cell -> whether its suffixes may diverge (cells left out: filled in by _fill_divergence)."""
    return Named("cell", Value(bool, default=None), cells.NAME_PATTERN, default={})


_GREEDY = "(the engine decodes greedily only)"
_CELL = Section({
    "dtype": Value(str, choices=cells.DTYPES),
    "tf32_matmul": Value(bool, default=False),
    "cudnn_tf32": Value(bool, default=False),
    "float32_matmul_precision": _pin(choices=("highest", "high", "medium")),
    "bf16_reduced_precision_reduction": _pin(bool),
    "sdpa_backend": _pin(choices=SDPA_BACKENDS),
    "kv_cache": Section({
        "format": Value(str, default="native", choices=cells.KV_FORMATS),
        "library": _pin(),
        "bits": _pin(int, low=1, high=16),
        "group_size": _pin(int, low=1, high=MAX_COUNT),
        "residual_length": _pin(int, low=0, high=MAX_COUNT),
    }, default={}),
    "weights": Section({
        "format": Value(str, default="native", choices=cells.WEIGHT_FORMATS),
        "library": _pin(),
        "group_size": _pin(int, low=1, high=MAX_COUNT),
    }, default={}),
})
_NUMBER = (int, float)

SCHEMA = Section({
    "schema": Value(str, default=SCHEMA_ID, choices=(SCHEMA_ID,)),
    "extends": _pin(),  # resolved before validation; listed so that a misspelling gets a suggestion
    "name": Value(str, pattern=rf"[^{CONTROLS}]{{1,200}}", expect="1 to 200 characters, none a control character"),
    "description": Value(str, default="", pattern=r"[^\x00-\x08\x0b-\x1f\x7f-\x9f]*",
                         expect="text without control characters (newlines and tabs allowed)"),
    "software": Section({key: _pin() for key in ("python", "torch", "transformers", "cuda", "cudnn")}, default={}),
    "hardware": Section({
        "device_kind": _pin(choices=("cpu", "cuda")),
        "gpu_name": _pin(),
        "compute_capability": _pin(pattern=r"\d+\.\d+", expect='MAJOR.MINOR in quotes, e.g. "9.0"'),
        "gpus": _pin(int, low=1, high=MAX_DEVICES),
        "tensor_parallel": Value(int, default=1, choices=(1,), expect="1 (the engine runs the model on one device)"),
    }, default={}),
    "environment": Section({
        "device": Value(str, pattern=r"cpu|cuda(:\d+)?|mps", expect="cpu, cuda, cuda:N or mps"),
        "cpu_threads": Value(int, low=1, high=MAX_DEVICES),
        "cpu_isa": _pin(choices=tuple(LEVELS)),
        "attention": Value(str, default="sdpa", choices=("sdpa", "eager")),
        "cache": Value(str, default="dynamic", choices=CACHES),
        "inference_mode": Value(str, default="eager", choices=("eager",),
                                expect="eager (forward calls run op by op under torch.inference_mode)"),
        "compile": Value(bool, default=False, choices=(False,), expect="false (the engine never uses torch.compile)"),
    }),
    # The paper's two cells under their old key, and any others under `cells:` (inputs/cells.py).
    "precisions": KeyedBy(cells.PAPER, "precision", _CELL, default={}),
    "cells": Named("cell", _CELL, cells.NAME_PATTERN, default={}),
    # Pairs of cells compared paired, row by row (the paper's reduction bf16 -> fp32; a quantized cell
    # against its native cell: the amplification).
    # Default (left out or empty): the paper's pair, where both are declared.
    "cell_pairs": ListOf(ListOf(Value(str, pattern=cells.NAME_PATTERN, expect="a cell name")), default=[]),
    "decoding": Section({
        "greedy": Value(bool, default=True, choices=(True,), expect=f"true {_GREEDY}"),
        "temperature": Value(_NUMBER, default=0, choices=(0,), expect=f"0 {_GREEDY}"),
        "top_p": Value(_NUMBER, default=1, choices=(1,), expect=f"1 {_GREEDY}"),
        "top_k": Value(int, default=0, choices=(0,), expect=f"0 {_GREEDY}"),
        "physical_batch": Value(int, low=1, high=MAX_BATCH),
    }),
    "protocol": Section({"visibility": Value(str, default="roles", choices=VISIBILITY_MODES)}, default={}),
    # The settings of a serving engine under test (read by its backend only; docs/vllm.md).
    "runtime": Section({"vllm": Section({
        "version": _pin(),
        "attention_backend": _pin(),
        "block_size": Value(int, default=32, low=1, high=MAX_COUNT),
        "enforce_eager": Value(bool, default=True),
        "prefix_caching": Value(bool, default=True, choices=(True,),
                                expect="true (the prefix_hit construction reads the engine's prefix cache)"),
        "chunk_budget": Value(int, default=32, low=1, high=MAX_COUNT),
        "max_num_seqs": Value(int, default=4, low=1, high=MAX_BATCH),
        "kv_cache_gib": Value(int, default=1, low=1, high=MAX_DEVICES),
        "logprobs": Value(int, default=8, low=2, high=20),
    }, default={}), "llamacpp": Section({
        "version": _pin(),
        "n_ctx": Value(int, default=1024, low=16, high=MAX_COUNT),
        "chunk": Value(int, default=64, low=1, high=MAX_COUNT),
        "flash_attention": Value(bool, default=False),
    }, default={})}, default={}),
    "caps": Section({key: Value(int, low=1, high=MAX_COUNT) for key in ("branch", "merge", "answer")}),
    "delimiters": KeyedBy(DELIMITER_NAMES, "delimiter", Value(str), default={}),
    "banned_tokens": ListOf(Value(int, low=0, high=MAX_COUNT), default=[]),
    "boundary_checks": ListOf(Value(str, choices=BOUNDARY_CHECKS), default=list(BOUNDARY_CHECKS)),
    "bank": Section({
        "rows": _pin(int, low=1, high=MAX_COUNT),
        "prefix_len": Section({"min": _pin(int, low=1, high=MAX_COUNT), "max": _pin(int, low=1, high=MAX_COUNT)},
                              default={}),
    }, default={}),
    "panels": Section({
        "live": _pin(int, low=1, high=MAX_COUNT),
        "bridge": Value(int, default=12, low=1, high=MAX_COUNT),
        "transplant": Section({
            "divergent": Value(int, default=24, low=1, high=MAX_COUNT),
            "exact_controls": Value(int, default=8, low=1, high=MAX_COUNT),
            "layers": Value(str, default="all", choices=("all",)),
            "directions": Value(str, default="both", choices=("both",)),
        }, default={}),
        "replication": Section({
            "rows": Value(int, default=48, low=1, high=MAX_COUNT),
            "min_exact_controls": Value(int, default=6, low=1, high=MAX_COUNT),
        }, default={}),
    }, default={}),
    "gates": Section({
        "crossing": Section({"replicas_exact": Value(bool, default=True),
                             "suffix_divergence_allowed": _divergence()}, default={}),
        "live": Section({"replicas_exact": Value(bool, default=True),
                         "suffix_divergence_allowed": _divergence()}, default={}),
        "batch": Section({"suffix_divergence_allowed": _divergence()}, default={}),
        "serving": Section({"replicas_exact": Value(bool, default=True),
                            "suffix_divergence_allowed": _divergence()}, default={}),
        "bridge": Section({"exact": Value(bool, default=True)}, default={}),
        "transplant": Section({"donor_recovery": Value(_NUMBER, default=1.0, low=0, high=1),
                               "controls_third_trajectory": Value(int, default=0, low=0, high=MAX_COUNT)},
                              default={}),
        "audit": Section({"reproduce": Value(bool, default=True)}, default={}),
    }),
})


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

    def may_diverge(self, name: str) -> bool:
        """Whether the crossing of cell `name` may diverge: where the transplant and the replication run."""
        return self.suffix_divergence_allowed[name]

    # Sections of `settings`, each a dict shaped as in docs/contract.md.
    software = property(lambda self: self.settings["software"])
    hardware = property(lambda self: self.settings["hardware"])
    decoding = property(lambda self: self.settings["decoding"])
    bank = property(lambda self: self.settings["bank"])
    panels = property(lambda self: self.settings["panels"])
    gates = functools.cached_property(lambda self: Gates.from_settings(self.settings["gates"]))
    cpu_isa = property(lambda self: self.settings["environment"]["cpu_isa"])
    cache = property(lambda self: self.settings["environment"]["cache"])
    visibility = property(lambda self: self.settings["protocol"]["visibility"])
    vllm = property(lambda self: self.settings["runtime"]["vllm"])
    llamacpp = property(lambda self: self.settings["runtime"]["llamacpp"])
    cell_pairs = property(lambda self: [tuple(pair) for pair in self.settings["cell_pairs"]])
    inference_mode = property(lambda self: self.settings["environment"]["inference_mode"])
    compile = property(lambda self: self.settings["environment"]["compile"])


def show(value: object) -> str:
    """A value as the YAML would spell it (true, null, 9.0)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def suggest(key: object, known: list[str]) -> str:
    """'did you mean 'x'?' for the closest known name (ignoring case; a known name the key begins, like
    tf32 for tf32_matmul, counts as close), else the list of known names."""
    lowered = {k.lower(): k for k in known}
    key = str(key).lower()
    close = [k for k in lowered if k.startswith(key)][:1] or difflib.get_close_matches(key, list(lowered), n=1)
    return f"did you mean {lowered[close[0]]!r}?" if close else f"expected one of {', '.join(known)}"


def _one_of(choices: tuple) -> str:
    words = [show(c) for c in choices]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Fields:
    """Checks a value against a schema node; every error names FILE: dotted.path."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {path + ': ' if path else ''}{message}")

    def check(self, node: Value | Section | KeyedBy | Named | ListOf, value: object, path: str = ""):
        if isinstance(node, Value):
            return self.leaf(node, value, path)
        if isinstance(node, ListOf):
            items = self.typed(value, list, path)
            return [self.check(node.item, item, f"{path}[{index}]") for index, item in enumerate(items)]
        mapping = self.typed(value, dict, path)
        if isinstance(node, Named):
            for key in mapping:
                if not isinstance(key, str) or not re.fullmatch(node.pattern, key):
                    raise self.error(path, f"{node.noun} name {short(key)}: expected lower-case letters, digits and "
                                           f"'.', '_', '+', '-' (at most 40, a letter or digit first)")
                if key in cells.SELECTORS:
                    raise self.error(path, f"{node.noun} name {key!r} is reserved (--precision {key} selects cells)")
            return {key: self.check(node.value, child, _join(path, key)) for key, child in mapping.items()}
        known = node.keys if isinstance(node, Section) else dict.fromkeys(node.names, node.value)
        noun = "field" if isinstance(node, Section) else node.noun
        for key in mapping:
            if key not in known:
                raise self.unknown(path, noun, key, list(known))
        out = {}
        for key, child in known.items():
            if key in mapping or child.default is not _REQUIRED:
                out[key] = self.check(child, mapping.get(key, child.default), _join(path, key))
            elif isinstance(node, Section):
                raise self.error(path, f"missing required field {key!r}")
        return out

    def typed(self, value: object, kind: type, path: str):
        return self.leaf(Value(kind), value, path)

    def leaf(self, node: Value, value: object, path: str):
        if value is None and node.default is None:
            return None
        kinds = node.kind if isinstance(node.kind, tuple) else (node.kind,)
        if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
            wanted = " or ".join(k.__name__ for k in kinds) + (" or null" if node.default is None else "")
            quote = " (write it in quotes)" if str in kinds and isinstance(value, float) else ""
            got = "null" if value is None else f"{type(value).__name__} {short(value)}"
            raise self.error(path, f"expected {wanted}, got {got}{quote}")
        if node.choices and value not in node.choices:
            raise self.error(path, f"expected {node.expect or _one_of(node.choices)}, got {short(value)}")
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
            wanted = node.expect or (_range(node) if node.low is not None else "a finite number")
            raise self.error(path, f"expected {wanted}, got {short(value)}")
        if (node.low is not None and value < node.low) or (node.high is not None and value > node.high):
            raise self.error(path, f"expected {node.expect or _range(node)}, got {short(value)}")
        if node.pattern and not re.fullmatch(node.pattern, value):
            raise self.error(path, f"expected {node.expect}, got {short(value)}")
        return value

    def unknown(self, path: str, noun: str, key: object, known: list[str]) -> ConfigError:
        return self.error(path, f"unknown {noun} {short(key)}; {suggest(key, known)}")


def _range(node: Value) -> str:
    kind = "an integer" if node.kind is int else "a number"
    return f"{kind} from {show(node.low)} to {show(node.high)}"


def _check_together(s: dict, fields: _Fields) -> None:
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
    vllm = s["runtime"]["vllm"]
    if vllm["chunk_budget"] < vllm["max_num_seqs"]:
        raise fields.error("runtime.vllm.chunk_budget",
                           f"expected at least max_num_seqs ({vllm['max_num_seqs']}): vLLM refuses a smaller token "
                           f"budget, got {vllm['chunk_budget']}")
    _fill_divergence(s["gates"], list(declared), fields)


def _cells(s: dict, fields: _Fields) -> dict[str, dict]:
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


_DIVERGENCE_FAMILIES = ("crossing", "live", "batch", "serving")


def _fill_divergence(gates: dict, declared: list[str], fields: _Fields) -> None:
    """Every declared cell gets a divergence gate in each family: a cell the crossing leaves unnamed is
    exact (false), and live, batch and serving take the crossing's value where they name none. A gate
    naming a cell the contract does not declare is an error."""
    for family in _DIVERGENCE_FAMILIES:
        allowed = gates[family]["suffix_divergence_allowed"]
        for name in allowed:  # the paper's cells may be named undeclared (a contract declaring one of them)
            if name not in declared and name not in cells.PAPER:
                raise fields.unknown(f"gates.{family}.suffix_divergence_allowed", "cell", name, declared)
    crossing = gates["crossing"]["suffix_divergence_allowed"]
    crossing |= {name: False for name in declared if crossing.get(name) is None}
    for family in _DIVERGENCE_FAMILIES[1:]:
        allowed = gates[family]["suffix_divergence_allowed"]
        allowed |= {name: value for name, value in crossing.items() if allowed.get(name) is None}


def default_gates() -> Gates:
    """The gates `compare` judges by without a contract: every default, over the paper's two cells with
    the paper's divergence gates (bf16 may diverge, fp32 is exact)."""
    fields = _Fields("(contract defaults)")
    gates = fields.check(SCHEMA.keys["gates"], {"crossing": {"suffix_divergence_allowed": cells.PAPER_DIVERGENCE}})
    _fill_divergence(gates, list(cells.PAPER), fields)
    return Gates.from_settings(gates)


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key written twice in one mapping (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges another mapping (its keys may be overridden)
                continue
            key = self.construct_object(key_node, deep=deep)
            if key != "<<" and isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {short(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, what: str = "contract") -> object:
    """The plain data of a YAML file (safe loading, duplicate keys refused); bad YAML is one ConfigError line."""
    text = read_text(path, what, ConfigError)
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: plain data only, never objects
    except RecursionError:
        raise ConfigError(f"{path}: malformed YAML: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise ConfigError(f"{path}: malformed YAML: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{line}: {getattr(exc, 'problem', exc)}") from None


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
    fields = _Fields(str(path))
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
        suffix_divergence_allowed=s["gates"]["crossing"]["suffix_divergence_allowed"],
        delimiters=s["delimiters"],
        banned_tokens=tuple(s["banned_tokens"]),
        raw=raw,
        settings=s,
    )
