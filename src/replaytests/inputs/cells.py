"""Numeric cells (docs/contract.md "Cells"): the numbers a run computes with, declared by the contract.

A cell names its compute dtype, its numeric flags (TF32 and the like), its K/V cache format (native;
quantized by a library with bits, group size and a residual of recent tokens kept unquantized; or a
runtime's own, such as vLLM's fp8 caches) and its weight format (native, or weight-only int8 / int4
through a library). Which formats exist, and which backend runs each, the backends declare
(replaytests.backends): a cell is never run in another format than the one it names. The paper's two
precisions are the two cells `bf16` and `fp32`; this module is the only place of the package that
spells their names. Every other module iterates the contract's cells.

A record names its cell (the ledger's `precision` field holds the cell's name) and carries the digest
of its definition, so two runs whose cells share a name but not a definition are never compared as one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from replaytests.backends import NATIVE, declarations
from replaytests.errors import ConfigError, short
from replaytests.files import sha256_json
from replaytests.inputs.schema import Named, Value

# The paper's two cells: the only cells `precisions:` declares, and what `--precision both` selects.
PAPER = ("bf16", "fp32")
PAPER_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
PAPER_DIVERGENCE = {"bf16": True, "fp32": False}  # the paper's gates: BF16 suffixes may diverge, FP32 are exact
BANK_CELL = PAPER[0]  # a bank's boundaries are generated live in this cell, as the paper froze its prefixes
RECOMPUTE_CELL = PAPER[0]  # `rollouts check` recomputes in this cell: a trainer's forward usually runs in BF16
DTYPES = ("bfloat16", "float16", "float32")
NAME_PATTERN = r"[a-z0-9][a-z0-9._+-]{0,39}"  # a test id and a file name: no comma, no space, no '/'
SELECTORS = ("both", "all")  # --precision words that are not cell names
# A cell's name: what a contract may call a cell (`--precision` keeps its selectors' names).
CELL_NAMES = {"pattern": NAME_PATTERN,
              "expect": "lower-case letters, digits and '.', '_', '+', '-' (at most 40, a letter or digit first)",
              "reserved": {name: f"--precision {name} selects cells" for name in SELECTORS}}


def divergence_gate() -> Named:
    """A family's gate `suffix_divergence_allowed`: cell -> whether its suffixes may diverge (cells left out: filled
    in from the reference family's, inputs/contract.py)."""
    return Named("cell", Value(bool, default=None), **CELL_NAMES, default={})


# The K/V cache and weight formats a cell may name: native, and each backend's own (its Declaration's kv_formats
# and weight_formats: transformers' quantized cache through one of KV_LIBRARIES, vLLM's fp8 kv_cache_dtype,
# llama.cpp's f16 and q8_0 type_k/type_v; weights quantized at load through one of WEIGHT_LIBRARIES).
KV_FORMATS = (NATIVE, *dict.fromkeys(f for declared in declarations().values() for f in declared.kv_formats))
WEIGHT_FORMATS = (NATIVE, *dict.fromkeys(f for declared in declarations().values() for f in declared.weight_formats))
# library -> (the bits it offers, the group sizes it offers) for transformers' QuantizedCache
KV_LIBRARIES = {"hqq": ((1, 2, 3, 4, 8), (32, 64, 128)), "quanto": ((2, 4), (32, 64, 128))}
# library -> the weight formats it runs, and for int4 the group sizes it offers
WEIGHT_LIBRARIES = {"torchao": (("int8", "int4"), (32, 64, 128, 256))}


@dataclass(frozen=True)
class KVCache:
    """The K/V cache's format: native (the compute dtype), quantized (library, bits, group size, and the
    last `residual_length` tokens kept unquantized), or a runtime's own (fp8 variants)."""

    format: str = "native"
    library: str | None = None
    bits: int | None = None
    group_size: int | None = None
    residual_length: int | None = None

    @property
    def native(self) -> bool:
        return self.format == "native"

    def __str__(self) -> str:
        if self.format == "quantized":
            return (f"{self.library} int{self.bits} K/V (group {self.group_size}, residual {self.residual_length})")
        return f"{self.format} K/V"


@dataclass(frozen=True)
class Weights:
    """The weights' format: native (the compute dtype) or weight-only int8 / int4 through a library."""

    format: str = "native"
    library: str | None = None
    group_size: int | None = None

    @property
    def native(self) -> bool:
        return self.format == "native"

    def __str__(self) -> str:
        if self.native:
            return "native weights"
        group = f", group {self.group_size}" if self.group_size else ""
        return f"{self.library} {self.format} weights{group}"


@dataclass(frozen=True)
class Cell:
    """One numeric cell: everything that decides the numbers besides the model, the platform and the
    software versions (None: not pinned, torch's default)."""

    dtype: str
    tf32_matmul: bool = False
    cudnn_tf32: bool = False
    float32_matmul_precision: str = "highest"
    bf16_reduced_precision_reduction: bool | None = None
    sdpa_backend: str | None = None
    kv_cache: KVCache = field(default_factory=KVCache)
    weights: Weights = field(default_factory=Weights)
    name: str = ""

    def definition(self) -> dict:
        """The cell as data, without its name."""
        out = asdict(self)
        del out["name"]
        return out

    def digest(self, versions: dict[str, str] | None = None) -> str:
        """A record's cell identity: the first 16 hex digits of the sha256 of its definition and, for a
        cell run through a library (a quantized cache, quantized weights), that library's version."""
        return sha256_json({"cell": self.definition(), **({"versions": versions} if versions else {})})[:16]



def from_settings(name: str, settings: dict) -> Cell:
    """A cell from its validated contract mapping (every default filled in)."""
    flags = {key: value for key, value in settings.items() if key not in ("kv_cache", "weights")}
    return Cell(**flags, kv_cache=KVCache(**settings["kv_cache"]), weights=Weights(**settings["weights"]), name=name)


def check(name: str, settings: dict, error) -> None:
    """The rules of one cell that relate its fields (`error(path, message)` makes the one-line error)."""
    path = f"cells.{name}"
    kv = settings["kv_cache"]
    if kv["format"] == "quantized":
        library = kv["library"]
        if library is None:
            raise error(f"{path}.kv_cache.library", f"expected one of {', '.join(KV_LIBRARIES)} for a quantized "
                                                    "K/V cache, got null")
        if library not in KV_LIBRARIES:
            raise error(f"{path}.kv_cache.library", f"expected one of {', '.join(KV_LIBRARIES)}, got {short(library)}")
        bits, groups = KV_LIBRARIES[library]
        for key, offered in (("bits", bits), ("group_size", groups)):
            if kv[key] not in offered:
                raise error(f"{path}.kv_cache.{key}", f"expected one of {', '.join(map(str, offered))} ({library} "
                                                      f"offers these), got {short(kv[key])}")
        if kv["residual_length"] is None:
            raise error(f"{path}.kv_cache.residual_length", "expected the count of recent tokens kept unquantized "
                                                            "(0 or more), got null")
    elif any(kv[key] is not None for key in ("library", "bits", "group_size", "residual_length")):
        extra = next(key for key in ("library", "bits", "group_size", "residual_length") if kv[key] is not None)
        raise error(f"{path}.kv_cache.{extra}", f"expected null for a {kv['format']} K/V cache (only a quantized "
                                                f"cache names a library, bits, group size and residual)")
    weights = settings["weights"]
    if weights["format"] == "native":
        if weights["library"] is not None or weights["group_size"] is not None:
            raise error(f"{path}.weights", "expected no library or group_size for native weights")
        return
    library = weights["library"]
    if library not in WEIGHT_LIBRARIES:
        raise error(f"{path}.weights.library", f"expected one of {', '.join(WEIGHT_LIBRARIES)} for {weights['format']} "
                                               f"weights, got {short(library)}")
    formats, groups = WEIGHT_LIBRARIES[library]
    if weights["format"] not in formats:
        raise error(f"{path}.weights.format", f"expected one of {', '.join(formats)} ({library}), got "
                                              f"{short(weights['format'])}")
    if weights["format"] == "int4" and weights["group_size"] not in groups:
        raise error(f"{path}.weights.group_size", f"expected one of {', '.join(map(str, groups))} for int4 weights, "
                                                  f"got {short(weights['group_size'])}")
    if weights["format"] == "int8" and weights["group_size"] is not None:
        raise error(f"{path}.weights.group_size", "expected null for int8 weights (one scale per output channel)")


def select(spec: str, declared: dict[str, Cell], contract: object = "the contract") -> tuple[str, ...]:
    """The cells `--precision` selects: a cell name, a comma list of them, `both` (the paper's two
    cells, those of them the contract declares) or `all` (every cell it declares), in the contract's order."""
    names = list(declared)
    if spec == "all":
        return tuple(names)
    wanted = [c for c in PAPER if c in declared] if spec == "both" else [part.strip() for part in spec.split(",")]
    if spec == "both" and not wanted:
        raise ConfigError(f"--precision both: {contract} declares neither of the paper's cells {', '.join(PAPER)} "
                          f"(its cells: {', '.join(names)}); name its cells, or all")
    if not spec or not all(wanted):
        raise ConfigError(f"--precision: expected a cell name, a comma list of them, both or all; got {short(spec)}")
    if unknown := [name for name in wanted if name not in declared]:
        raise ConfigError(f"--precision {short(spec)}: cell {', '.join(map(short, unknown))} not declared by "
                          f"{contract} (its cells: {', '.join(names)})")
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"--precision {short(spec)}: a cell named twice")
    return tuple(name for name in names if name in wanted)


def paper_pairs(declared: dict[str, Cell]) -> list[list[str]]:
    """The reductions a contract that names none compares: the paper's, where it declares both cells."""
    return [list(PAPER)] if all(name in declared for name in PAPER) else []
