"""The one module that touches the Hugging Face model, cache and attention API.

A transformers upgrade that renames a cache attribute or a forward argument is a change here only.
Models load from local directories only, with SDPA attention, safetensors weights and no remote code.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from replaytests.engine.boundary import KV, cache_layers
from replaytests.errors import ConfigError
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


def new_cache(model, kind: str):
    """An empty cache of the class a contract names (blocks.CACHES): `dynamic` grows by concatenation,
    `offloaded` is dynamic with layers kept on the CPU between uses (CUDA only), `static` is
    preallocated for the model's whole context. Every static cache of a model has that one capacity:
    attention runs over the whole capacity (the hidden part masked), so constructions whose capacities
    differed would compute differently (measured: live and incremental then stop being bit-exact)."""
    from transformers import DynamicCache, StaticCache

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

    def __init__(self, model, cache: str = "dynamic") -> None:
        self.model, self.cache = model, cache
        self._cache_arg = _cache_kwarg(model)
        # SDPA reads a bool mask as "may attend"; eager attention adds the mask to the scores, so a bool
        # mask there would add 0 or 1 and hide nothing (found by engine.checks' mask property): it gets
        # the additive form, 0 where visible and the dtype's lowest value where hidden.
        self._additive = attention_implementation(model) != "sdpa"

    def new_cache(self):
        return new_cache(self.model, self.cache)

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """Return the last position's logits [batch, vocab]; the cache grows in place. A preallocated
        (static) cache attends over its whole capacity: the mask's keys are extended to it, hidden."""
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
            use_cache=True, logits_to_keep=1, **{self._cache_arg: cache},
        )
        return out.logits[:, -1, :]


def cache_from_layers(model, layers: list[KV], like):
    """A new cache of the same class and capacity as `like` whose tensors are storage-isolated copies
    of `layers`."""
    cache = new_cache(model, cache_kind(like))
    for index, (keys, values) in enumerate(layers):
        cache.update(keys.clone(), values.clone(), index)
    return cache


def clone_cache(model, cache):
    return cache_from_layers(model, cache_layers(cache), like=cache)


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
