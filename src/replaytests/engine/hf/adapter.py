"""The one module that touches the Hugging Face model, cache and attention API.

A transformers upgrade that renames a cache attribute or a forward argument is a change here only.
Models load from local directories only, with SDPA attention, safetensors weights and no remote code.
"""

from __future__ import annotations

import copy
import importlib.metadata
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import torch

from replaytests.engine.backend import library_problem
from replaytests.engine.boundary import KV, cache_layers
from replaytests.errors import ConfigError, TransplantRefused
from replaytests.files import MAX_INPUT, regular_file
from replaytests.inputs.cells import KVCache
from replaytests.inputs.models import TOKENIZER_FILES
from replaytests.inputs.preparation import quiet as _quiet

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}



def check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise ConfigError(f"{path}: model directory not found")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path}: no config.json (expected a Hugging Face model directory)")
    if not sorted(path.glob("*.safetensors")):
        raise ConfigError(f"{path}: no *.safetensors weights (only safetensors are loaded, never pickle)")
    # What the tokenizer and config loaders read whole: a FIFO would block them, a huge file fill memory.
    for text in (found for kind in ("*.json", "*.txt", "*.model", "*.jinja") for found in sorted(path.glob(kind))):
        regular_file(text, "a tokenizer or config file", ConfigError, MAX_INPUT)
    for weights in sorted(path.glob("*.safetensors")):  # mapped, of any size; a FIFO would block the loader
        regular_file(weights, "weights", ConfigError)


def check_weights(path: Path) -> None:
    """Every weight file is a whole safetensors file whose tensors are all finite: its header parses and
    covers the file, and no floating-point tensor holds a NaN or an infinity (a truncated, foreign or
    poisoned file is refused here, before any model work, not in every test that loads it)."""
    from safetensors import SafetensorError, safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt") as handle:
                named = ((name, handle.get_tensor(name)) for name in handle.keys())  # noqa: SIM118 - not a dict
                if found := non_finite(named):
                    raise ConfigError(f"{weights}: tensor {found}; a checkpoint with non-finite weights cannot be "
                                      "replayed")
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"{weights}: not a readable safetensors file: {str(exc).splitlines()[0]}") from None


def non_finite(named) -> str | None:
    """'NAME holds N NaN and M infinite values of T' for the first floating-point tensor of (name, tensor)
    pairs that is not all finite, else None."""
    for name, tensor in named:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            nan = int(torch.isnan(tensor).sum())
            return (f"{name!r} holds {nan} NaN and {int(torch.isinf(tensor).sum())} infinite values of "
                    f"{tensor.numel()}")
    return None


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    check_model_dir(path)
    if not any((path / name).is_file() for name in TOKENIZER_FILES[:4]):
        raise ConfigError(f"{path}: no tokenizer ({', '.join(TOKENIZER_FILES[:4])})")
    try:
        with _quiet():
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # a user's files: whatever the tokenizer's loader raises is one line
        raise ConfigError(f"{path}: cannot load tokenizer: {str(exc).splitlines()[0]}") from None


def _from_pretrained(path: Path, **how):
    """The model and transformers' own account of its weight tensors; a tensor missing from the checkpoint,
    one the model does not use or one of another shape is refused in one line."""
    from transformers import AutoModelForCausalLM

    check_model_dir(path)
    try:
        with _quiet():  # transformers' load report goes to stderr only; what it says is checked below
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path), output_loading_info=True, local_files_only=True, trust_remote_code=False,
                use_safetensors=True, **how)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot load model: {str(exc).splitlines()[0]}") from None
    for kind, what in (("missing_keys", "missing from the checkpoint (transformers would initialize them at "
                                        "random)"), ("unexpected_keys", "not used by the model"),
                       ("mismatched_keys", "of another shape than the model's")):
        if names := sorted(str(n) for n in info.get(kind) or ()):
            raise ConfigError(f"{path}: {len(names)} weight tensor(s) {what}: {', '.join(names[:5])}"
                              f"{', ...' if len(names) > 5 else ''}")
    return model


def check_tensors(path: Path) -> None:
    """The checkpoint's weight tensors are the ones its model needs, checked before any model work: the
    model built on the meta device, so no weight is read (about 0.2 s after transformers' import)."""
    _from_pretrained(path, device_map="meta")


def load_model(path: Path, dtype: str, device: str, attention: str = "sdpa"):
    model = _from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=attention)
    model.to(device).eval()
    if torch.device(device).type == "cpu":
        # Copied out of the files' memory maps: what runs is what was read (and verified) at load time,
        # whatever later happens to the files.
        for tensor in (*model.parameters(), *model.buffers()):
            tensor.data = tensor.data.clone()
    if found := non_finite(model.named_parameters()):
        raise ConfigError(f"{path}: weight {found} as loaded at {dtype}; a model with non-finite weights cannot be "
                          "replayed")
    return model


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def attention_implementation(model) -> str:
    return model.config._attn_implementation


def vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def max_positions(model) -> int:
    return int(model.config.max_position_embeddings)


def sliding_window(config) -> int | None:
    """The attention window some layer of the model applies (Mistral, Gemma 2/3, Qwen2 with
    `use_sliding_window`), or None where every layer attends to the whole sequence."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or (types is not None and "sliding_attention" not in types):
        return None
    return int(window)


def _cache_kwarg(model) -> str:
    """transformers 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# transformers' quantized K/V cache (QuantizedCache): library -> (module, distribution, pinned install).
QUANTIZED_CACHE_PACKAGES = {"hqq": "hqq==0.2.8.post1", "quanto": "optimum-quanto==0.2.7"}
_QUANTIZED_MODULES = {"hqq": ("hqq", "hqq"), "quanto": ("optimum.quanto", "optimum-quanto")}
# The axis each library groups along, chosen so that a group never spans two copies of the physical batch:
# HQQ's default axis 0 groups across the whole tensor, batch included (measured: changing one copy's
# tokens changed the other copy's logits); its axis 1 and quanto's axis 0 group each token's head_dim.
_QUANTIZED_AXIS = {"hqq": 1, "quanto": 0}


def quantized_cache_problem(library: str) -> str | None:
    """Why the quantized cache's library cannot run here (engine.backend.library_problem), or None."""
    return library_problem(_QUANTIZED_MODULES[library][0], f"pip install {QUANTIZED_CACHE_PACKAGES[library]}")


def quantized_cache_version(library: str) -> str:
    return importlib.metadata.version(_QUANTIZED_MODULES[library][1])


def new_cache(model, kind: str, kv: KVCache | None = None):
    """An empty cache of the class a contract names (blocks.CACHES): `dynamic` grows by concatenation,
    `offloaded` is dynamic with layers kept on the CPU between uses (CUDA only), `static` is
    preallocated for the model's whole context. Every static cache of a model has that one capacity:
    attention runs over the whole capacity (the hidden part masked), so constructions whose capacities
    differed would compute differently (measured: live and incremental then stop being bit-exact).
    A cell with a quantized K/V format gets transformers' QuantizedCache: a call over several tokens
    attends over their unquantized K/V, then quantizes all of them; decoded tokens stay unquantized
    until `residual_length` of them are held, when the whole history is quantized again."""
    from transformers import DynamicCache, StaticCache

    if kv is not None and kv.format == "quantized":
        from transformers import QuantizedCache

        axis = _QUANTIZED_AXIS[kv.library]
        return QuantizedCache(kv.library, model.config, nbits=kv.bits, axis_key=axis, axis_value=axis,
                              q_group_size=kv.group_size, residual_length=kv.residual_length)
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=max_positions(model))
    return DynamicCache(config=model.config, offloading=kind == "offloaded")


def cache_kind(cache) -> str:
    """The class of a cache as new_cache names it."""
    from transformers import StaticCache

    if isinstance(cache, StaticCache):
        return "static"
    return "offloaded" if getattr(cache, "offloading", False) else "dynamic"


class Forward:
    """Calls a causal LM with an explicit 4D mask, explicit positions and a caller-owned cache."""

    def __init__(self, model, cache: str = "dynamic", kv: KVCache | None = None) -> None:
        self.model, self.cache, self.kv = model, cache, kv
        self._cache_arg = _cache_kwarg(model)
        # SDPA reads a bool mask as "may attend"; eager attention adds the mask to the scores, so a bool
        # mask there would add 0 or 1 and hide nothing (found by engine.checks' mask property): it gets
        # the additive form, 0 where visible and the dtype's lowest value where hidden.
        self._additive = attention_implementation(model) != "sdpa"

    def new_cache(self):
        return new_cache(self.model, self.cache, self.kv)

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Return the last position's logits [batch, vocab]; the cache grows in place."""
        return self.logits(input_ids, mask, positions, cache, 1)[:, -1, :]

    def logits(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache,
               keep: int) -> torch.Tensor:
        """The logits of the last `keep` positions (0: every position), [batch, keep, vocab]; the cache grows in
        place. A preallocated (static) cache attends over its whole capacity: the mask's keys are extended to
        it, hidden."""
        capacity = int(cache.get_max_length()) if self.cache == "static" else 0
        if capacity > mask.shape[-1]:
            padded = mask.new_zeros(*mask.shape[:-1], capacity)
            padded[..., : mask.shape[-1]] = mask
            mask = padded
        if self._additive:
            dtype = self.model.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions,
            use_cache=True, logits_to_keep=keep, **{self._cache_arg: cache},
        )
        return out.logits


def cache_from_layers(model, layers: list[KV], like):
    """A new cache of the same class and capacity as `like` whose tensors are storage-isolated copies
    of `layers`."""
    cache = new_cache(model, cache_kind(like))
    for index, (keys, values) in enumerate(layers):
        cache.update(keys.clone(), values.clone(), index)
    return cache


# ---- quantized caches: what the model reads, what is stored ----

_STORED = {"k": ("keys", "_quantized_keys"), "v": ("values", "_quantized_values")}  # part -> (residual, stored)


def _is_quantized(cache) -> bool:
    """A QuantizedCache (its layers hold a stored quantized part), told without importing it: transformers
    releases before it have none."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and hasattr(layers[0], "_quantized_keys")


def _clone_stored(stored):
    """A storage-isolated copy of one stored quantized tensor: HQQ's (codes, meta) or quanto's QBits tensor."""
    if stored is None:
        return None
    if isinstance(stored, tuple):
        codes, meta = stored
        return codes.clone(), {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in meta.items()}
    from optimum.quanto.tensor.packed import PackedTensor
    from optimum.quanto.tensor.weights.qbits import WeightQBitsTensor

    packed = stored._data
    data = PackedTensor(packed._data.clone(), packed._bits, packed.size(), packed.stride())
    return WeightQBitsTensor(stored.qtype, stored.axis, stored._group_size, stored.size(), stored.stride(), data,
                             stored._scale.clone(), stored._shift.clone())


def _stored_tensors(stored) -> list[torch.Tensor]:
    """The plain tensors of one stored quantized tensor: packed codes, scale, zero point (or shift)."""
    if stored is None:
        return []
    if isinstance(stored, tuple):
        return [stored[0], stored[1]["scale"], stored[1]["zero"]]
    return [stored._data._data, stored._scale, stored._shift]


def _copy_part(target, source, part: str) -> None:
    residual, stored = _STORED[part]
    setattr(target, residual, getattr(source, residual).clone())
    setattr(target, stored, _clone_stored(getattr(source, stored)))


def _clone_quantized(cache):
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        twin = copy.copy(layer)  # shares only its settings and stateless helpers (the quantizer)
        for part in _STORED:
            _copy_part(twin, layer, part)
        out.layers.append(twin)
    return out


@dataclass
class _Layer:
    keys: torch.Tensor
    values: torch.Tensor


def _read(layer, residual: str, stored: str) -> torch.Tensor:
    """One part (K or V) of a quantized layer as attention reads it: dequantized stored tokens, then the
    unquantized residual (empty, shape (0,), right after a quantization)."""
    parts = [] if getattr(layer, stored) is None else [layer._dequantize(getattr(layer, stored))]
    recent = getattr(layer, residual)
    return torch.cat([*parts, *([recent] if recent.dim() == 4 else [])], dim=-2)


@dataclass
class QuantizedKV:
    """A boundary's quantized cache as the families see it: `layers[i].keys` / `.values` hold what
    attention reads (the dequantized stored tokens, then the unquantized residual), computed once, and
    `stored_tensors()` what is stored (codes, scales, zero points, and the residual). `inner` is the
    transformers cache itself, which only this module touches."""

    inner: object
    layers: list[_Layer] = field(init=False)

    def __post_init__(self) -> None:
        self.layers = [_Layer(*(_read(layer, residual, stored) for residual, stored in _STORED.values()))
                       for layer in self.inner.layers]

    def get_seq_length(self) -> int:
        return int(self.inner.get_seq_length())

    def stored_tensors(self) -> list[torch.Tensor]:
        return [tensor for layer in self.inner.layers for residual, stored in _STORED.values()
                for tensor in (*_stored_tensors(getattr(layer, stored)), getattr(layer, residual))]


@dataclass
class FrozenKV:
    """A read-only view of K/V tensors (a physical batch's first copy of a quantized cache): compared and
    fingerprinted, never decoded from."""

    layers: list[_Layer]
    length: int

    def get_seq_length(self) -> int:
        return self.length


def boundary_cache(cache):
    """The cache a boundary holds: a quantized one wrapped (QuantizedKV), any other as it is."""
    return QuantizedKV(cache) if _is_quantized(cache) else cache


def clone_cache(model, cache):
    """A storage-isolated copy to decode from (a quantized cache with its whole stored state)."""
    if isinstance(cache, QuantizedKV):
        return _clone_quantized(cache.inner)
    return cache_from_layers(model, cache_layers(cache), like=cache)


def first_copy(model, cache):
    """The first copy of a physical batch, storage-isolated (a quantized one as a read-only view)."""
    layers = [(keys[:1], values[:1]) for keys, values in cache_layers(cache)]
    if isinstance(cache, QuantizedKV):
        return FrozenKV([_Layer(k.clone(), v.clone()) for k, v in layers], cache.get_seq_length())
    return cache_from_layers(model, layers, like=cache)


def transplanted_cache(model, recipient, donor, layers: list[int], parts: tuple[str, ...]):
    """The recipient's cache with the selected layers' K and/or V state copied from the donor, every
    tensor storage-isolated; for a quantized cache the whole stored state moves (codes, scales, zero
    points and the unquantized residual)."""
    if isinstance(recipient, QuantizedKV):
        out = _clone_quantized(recipient.inner)
        for index in layers:
            for part in parts:
                _copy_part(out.layers[index], donor.inner.layers[index], part)
        return QuantizedKV(out)
    own, theirs = cache_layers(recipient), cache_layers(donor)
    mixed = [tuple((theirs if index in layers and part in parts else own)[index][p]
                   for p, part in enumerate(_STORED)) for index in range(len(own))]
    return cache_from_layers(model, mixed, like=recipient)


def spliced_cache(model, recipient, donor, end: int):
    """The recipient's cache with every layer's K and V over positions [0, end) copied from the donor, every tensor
    storage-isolated. A quantized cache is refused: its stored codes quantize positions together (and only the
    residual's are its own), so no position range of it can be moved alone."""
    if isinstance(recipient, QuantizedKV) or isinstance(donor, QuantizedKV):
        raise TransplantRefused("a position splice of a quantized K/V cache is not defined (its stored codes "
                                "quantize positions together); run the conversation transplant on a native cache")
    mixed = [tuple(torch.cat([theirs[p][:, :, :end], own[p][:, :, end:]], dim=2) for p in range(2))
             for own, theirs in zip(cache_layers(recipient), cache_layers(donor), strict=True)]
    return cache_from_layers(model, mixed, like=recipient)


def load_config(path: Path):
    """The model's config alone (no weights): enough to validate a bank before any model work."""
    from transformers import AutoConfig

    check_model_dir(path)
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise ConfigError(f"{path}/config.json: cannot load config: {' '.join(lines[:2])[:300]}") from None
    check_config(config, path / "config.json")
    return config


SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "max_position_embeddings", "intermediate_size")


def check_config(config, where: Path) -> None:
    """The sizes a forward call divides and allocates by are positive integers that fit together (a
    config that passes transformers' own checks can still fail every test with a traceback)."""
    for name in SIZES:
        value = getattr(config, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{where}: {name} is {value!r}; expected a positive integer")
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None)
    if getattr(config, "head_dim", None) is None and config.hidden_size % heads:
        raise ConfigError(f"{where}: hidden_size {config.hidden_size} is not a multiple of num_attention_heads {heads}")
    if kv and heads % kv:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
