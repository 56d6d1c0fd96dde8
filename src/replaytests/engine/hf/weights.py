"""Weight-only quantization at load (a cell's `weights:`, inputs/cells.py), through torchao.

int8: one scale per output channel (torchao's Int8WeightOnlyConfig). int4: torchao's
IntxWeightOnlyConfig with int4 values in groups of `group_size` along the input dimension (its
Int4WeightOnlyConfig needs CUDA or the `mslk` kernels, which do not run on a CPU). Both compute in the
cell's dtype on dequantized weights. As transformers' TorchAoConfig does, a linear layer whose weight is
tied to the input embedding (the LM head of a model with tied embeddings) keeps its native weight.
After quantizing, every other linear layer's weight must be a quantized tensor: a cell is never run in
another format than the one it names.
"""

from __future__ import annotations

import importlib.metadata
import json

import torch

from replaytests.engine.backend import library_problem
from replaytests.errors import ConfigError
from replaytests.inputs.cells import Weights

LIBRARY = "torchao"


def problem() -> str | None:
    """Why the weight quantization library cannot run here (engine.backend.library_problem), or None."""
    return library_problem(LIBRARY, "pip install 'replaytests[cells]'")


def version() -> str:
    return importlib.metadata.version(LIBRARY)


def _config(weights: Weights):
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup

    if weights.format == "int8":
        return Int8WeightOnlyConfig()
    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(weights.group_size))


def describe(weights: Weights) -> str:
    """The library's own full description of the configuration (part of run.json)."""
    from torchao.core.config import config_to_dict

    return json.dumps(config_to_dict(_config(weights)), sort_keys=True)


def _tied(model) -> set[int]:
    embeddings = model.get_input_embeddings()
    return {id(embeddings.weight)} if embeddings is not None else set()


def quantize(model, weights: Weights, where: str) -> None:
    """Quantize the model's linear layers in place, then check that each one's weight is quantized."""
    from torchao.quantization import quantize_
    from torchao.utils import TorchAOBaseTensor

    tied = _tied(model)
    linear = {name: module for name, module in model.named_modules()
              if isinstance(module, torch.nn.Linear) and id(module.weight) not in tied}
    if not linear:
        raise ConfigError(f"{where}: the model has no linear layer to quantize to {weights.format}")
    quantize_(model, _config(weights), filter_fn=lambda module, name: name in linear and module is linear[name])
    if native := [name for name, module in linear.items() if not isinstance(module.weight, TorchAOBaseTensor)]:
        raise ConfigError(f"{where}: {len(native)} linear weight(s) stayed native after {LIBRARY} {weights.format} "
                          f"quantization ({', '.join(native[:3])}); refused: the cell would not run in its format")
