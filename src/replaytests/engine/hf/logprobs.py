"""Rollout log-probabilities on the Hugging Face backend (docs/rollouts.md): the trainer's recompute, one
prefill call over prompt + response, and, for the suite's own dumps, the engine's side, a live greedy decoder
that keeps each chosen token's log-probability.

Both read a log-probability the same way (`chosen_logprobs`): log-softmax of the step's logits in FP32 over the
full vocabulary, with no structural mask (a user's dump is not the protocol's grammar), at the token chosen.
Every call is one row (batch 1, no physical-batch copies) with an explicit 4D causal mask and explicit
positions, as every forward call of the suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.hf.forward import load_cell
from replaytests.engine.protocol import visibility_rows
from replaytests.errors import NonFinite
from replaytests.inputs.contract import Contract


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # embedding rows: the ids the model takes
    max_positions: int
    source: str  # the file they were read from, named in errors


def limits(model_dir: Path) -> ModelLimits:
    """What a dump is checked against, read from the model's config before its weights load."""
    hf_adapter.check_model_dir(model_dir)
    hf_adapter.check_weights(model_dir)
    config = hf_adapter.load_config(model_dir)
    return ModelLimits(config.vocab_size, config.max_position_embeddings, f"{model_dir}/config.json")


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor, where: str) -> torch.Tensor:
    """FP32 log-softmax of each row of `logits` [n, vocab] at `tokens` [n]: [n] float32. Non-finite logits fail
    closed (a NaN compares equal to nothing and would read as a mismatch of the dump)."""
    rows = logits.float()
    if not bool(torch.isfinite(rows).all()):
        raise NonFinite(f"{where} (logits): {int(torch.isnan(rows).sum())} NaN and {int(torch.isinf(rows).sum())} "
                        f"infinite values of {rows.numel()}")
    return torch.log_softmax(rows, dim=-1).gather(-1, tokens[:, None])[:, 0]


@dataclass
class Scorer:
    """One model at one of the contract's cells, scoring rollouts."""

    model: object
    device: torch.device
    cell: str

    @classmethod
    def load(cls, model_dir: Path, contract: Contract, cell: str, device: str | None = None) -> Scorer:
        _, device, model = load_cell(model_dir, contract, cell, device)
        return cls(model, torch.device(device), cell)

    def __post_init__(self) -> None:
        self._forward = hf_adapter.Forward(self.model)

    def _call(self, ids: list[int], start: int, cache, keep: int) -> torch.Tensor:
        """Logits [keep or len(ids), vocab] of `ids` at positions start.. on `cache`, every earlier key visible."""
        end = start + len(ids)
        roles = torch.zeros(end, dtype=torch.long, device=self.device)
        mask = visibility_rows(roles[start:], roles, start, "causal")[None, None]
        positions = torch.arange(start, end, device=self.device)[None]
        batch = torch.tensor([ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            return self._forward.logits(batch, mask, positions, cache, keep)[0]

    def recompute(self, prompt: list[int], response: list[int], where: str = "recompute") -> torch.Tensor:
        """The trainer's recompute: one prefill call over prompt + response, every position's logits (as a
        trainer's forward gives them); the log-probability of each response token from the position before
        it. [len(response)] float32."""
        logits = self._call(prompt + response, 0, self._forward.new_cache(), 0)
        chosen = torch.tensor(response, dtype=torch.long, device=self.device)
        return chosen_logprobs(logits[len(prompt) - 1:-1], chosen, where)

    def generate(self, prompt: list[int], length: int) -> tuple[list[int], list[float]]:
        """The engine's side: the prompt in one call, then one greedy token per call (the first maximal id over
        the full vocabulary), `length` tokens, each with its live log-probability."""
        cache = self._forward.new_cache()
        logits = self._call(prompt, 0, cache, 1)[-1]
        tokens, logprobs = [], []
        for step in range(length):
            token = int(logits.argmax())
            tokens.append(token)
            chosen = torch.tensor([token], dtype=torch.long, device=self.device)  # never via the logits' dtype
            logprobs.append(float(chosen_logprobs(logits[None], chosen, "live")[0]))
            if step + 1 < length:
                logits = self._call([token], len(prompt) + step, cache, 1)[-1]
        return tokens, logprobs
