"""A Hugging Face model directory as the session sees it before any weight is loaded: whole safetensors,
a config, a tokenizer that gives each delimiter as one token, and a vocabulary that holds them and the
contract's banned tokens (engine.backend.ModelFacts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replaytests.engine.backend import ModelFacts
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.protocol import Delimiters, Grammar
from replaytests.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from replaytests.inputs.contract import Contract


def inspect(path: Path, contract: Contract, option: str) -> ModelFacts:
    """Everything about a model directory that can be known before loading its weights; `option` names
    where the path came from (--model) in every error."""
    hf_adapter.check_model_dir(path)
    hf_adapter.check_weights(path)
    config = hf_adapter.load_config(path)  # first: the tokenizer's loader reads config.json too
    tokenizer = hf_adapter.load_tokenizer(path)
    try:
        delims = Delimiters.resolve(tokenizer, contract.delimiters)
    except ConfigError as exc:
        raise ConfigError(f"{path} ({option}) with contract {contract.path}: {exc}") from None
    if outside := [i for i in delims.all_ids if i >= config.vocab_size]:
        raise ConfigError(f"{path}/config.json: vocab_size {config.vocab_size} does not hold the delimiter ids "
                          f"{outside} of its own tokenizer ({option})")
    try:
        grammar = Grammar(delims, contract.caps, config.vocab_size, len(tokenizer), contract.banned_tokens)
    except ConfigError as exc:
        raise ConfigError(f"{contract.path}: {exc} of {path} ({option})") from None
    architecture = "/".join(getattr(config, "architectures", None) or ["?"])
    return ModelFacts(grammar, config.max_position_embeddings, hf_adapter.sliding_window(config),
                      f"{architecture}, {config.num_hidden_layers} layers", f"{path}/config.json")
