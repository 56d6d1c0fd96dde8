"""Rollouts on the vLLM backend (engine/rollout.py), each arm one request on the runtime's rollout engine.

- live: z as one prompt, then `length` tokens decoded one per step, greedy (temperature 0) or sampled
  (temperature 1, top_p 1, top_k off, `SamplingParams.seed` the row's seed); one step more, so that the
  state after z + response is in hand (`end`). No structural mask: the model's own distribution.
- incremental: z as one prompt, then the live tokens forced one decode step each (mask.py, without a
  grammar), then the same step more: the live schedule, teacher-forced.
- prefill: z + response as one prompt (the trainer's recompute); the response's log-probabilities are the
  request's `prompt_logprobs`, the end state its one sampling step.

The rollout engine runs `logprobs_mode` raw_logprobs: vLLM's sampler computes `log_softmax(dim=-1,
dtype=float32)` of the step's logits before any logits processor, temperature or top-k/top-p (v1/sample/
sampler.py), so a forced step reports the forced token's raw log-probability; prompt log-probabilities are
the same function of the prompt positions' logits (gpu_model_runner.py, `_get_prompt_logprobs_dict`). No
number counts before it is checked against the suite's definition (`check`): the logits layer of the
engine's model is tapped (a forward hook), and every reported value must equal, bit for bit, FP32
log-softmax over the full vocabulary of the logits that step computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaytests.engine.boundary import Boundary
from replaytests.engine.protocol import Cursor
from replaytests.engine.rollout import Rollout
from replaytests.errors import ConfigError, FailClosed

LOGPROBS_MODE = "raw_logprobs"  # the only vLLM mode that is the suite's definition on a forced step too
ARG = "replaytests"  # SamplingParams.extra_args key the structural mask reads (mask.ARG, without importing vllm)


class LogprobsUnchecked(FailClosed):
    """A log-probability vLLM reported is not FP32 log-softmax over the full vocabulary of the logits its
    step computed (another logprobs mode, a processed value, a step the tap did not see), or the request
    did not compute every token itself: no number of the row counts."""


class Tap:
    """The logits every `compute_logits` call of an engine's model returned, as float32 copies, while armed
    (a forward hook on the model's logits layer, which runs in this process: the engine core is in-process)."""

    def __init__(self, engine) -> None:
        self.rows: list[torch.Tensor] = []
        self.armed = False
        if not all(engine.apply_model(self._install)):
            raise ConfigError("--backend vllm: the model has no logits layer (logits_processor) to tap; its rollout "
                              "log-probabilities could not be checked")

    def _install(self, model) -> bool:
        layer = getattr(model, "logits_processor", None)
        if layer is None:
            return False
        layer.register_forward_hook(self._hook)
        return True

    def _hook(self, module, args, output) -> None:
        if self.armed and output is not None:
            self.rows.append(output.detach().to(torch.float32, copy=True))

    def start(self) -> None:
        self.rows, self.armed = [], True

    def stop(self) -> list[torch.Tensor]:
        self.armed = False
        rows, self.rows = self.rows, []
        return rows


@dataclass(frozen=True)
class Step:
    """One step's log-probabilities as vLLM reported them: the chosen (or prompt) token's, and the
    top-ranked ids with theirs."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # by vLLM's rank, best first


def steps(entries: list[dict], tokens: list[int]) -> list[Step]:
    """vLLM's per-position `{id: Logprob}` dicts, at each position's token."""
    out = []
    for token, entry in zip(tokens, entries, strict=True):
        ranked = sorted(entry.items(), key=lambda item: item[1].rank)
        out.append(Step(token, entry[token].logprob, [(t, lp.logprob) for t, lp in ranked if lp.rank <= 2][:2]))
    return out


def _bits(value: float) -> str:
    return float(value).hex()


def check(reported: list[Step], logits: torch.Tensor, vocab: int, where: str) -> None:
    """Fail closed unless each step's reported log-probability of its token and its top-2 values equal, bit
    for bit, `torch.log_softmax(row.float(), -1)` of the logits `row` its step computed ([steps, vocab]; the
    model's full vocabulary): the suite's definition (engine/hf/rollout.py, `_scored`)."""
    if logits.shape != (len(reported), vocab):
        raise LogprobsUnchecked(f"{where}: the tapped logits are {tuple(logits.shape)}, expected "
                                f"({len(reported)}, {vocab}) (one full-vocabulary row per step)")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logprobs, 2, dim=-1).values.tolist()
    chosen = logprobs.gather(-1, torch.tensor([s.token for s in reported])[:, None])[:, 0].tolist()
    for index, (step, want, best) in enumerate(zip(reported, chosen, top, strict=True)):
        got = [step.logprob, *(value for _, value in step.top)]
        expected = [want, *best[:len(step.top)]]
        if len(step.top) < 2 or [_bits(v) for v in got] != [_bits(v) for v in expected]:
            raise LogprobsUnchecked(f"{where}: step {index}: vLLM reported log-probability {step.logprob!r} for "
                                    f"token {step.token} and top-2 {[v for _, v in step.top]}, FP32 log-softmax of "
                                    f"the step's logits gives {want!r} and {best}")


def roles(grammar, z: list[int], where: str, length: int) -> list[int]:
    """z's roles, then the role a response token takes after z (the open block's content role, as the
    Hugging Face decoder gives it)."""
    cursor = Cursor()
    for token in z:
        cursor.advance(token, grammar)
    return grammar.parse(z, where) + [cursor.role_of_next()] * length


def params(vllm, length: int, logprobs: int, seed: int | None = None, forced: list[int] | None = None,
           prompt_logprobs: int | None = None):
    """One rollout request's sampling: greedy (temperature 0) unless a seed is given, then temperature 1,
    top_p 1, top_k off with that seed; never stopped early (ignore_eos), `length` tokens; `logprobs` top-k
    per step (and per prompt position where `prompt_logprobs`)."""
    sampled = seed is not None
    return vllm.SamplingParams(
        temperature=1.0 if sampled else 0.0, top_p=1.0, top_k=0, min_p=0.0, seed=seed if sampled else 0,
        max_tokens=length, logprobs=logprobs, prompt_logprobs=prompt_logprobs, ignore_eos=True, detokenize=False,
        extra_args={ARG: {"forced": forced}} if forced else None)


def rollout(construction: str, z: list[int], reported: list[Step], end: torch.Tensor, grammar, mode: str,
            where: str) -> Rollout:
    """The Rollout of the response steps `reported`, its end the state after z + response with the next
    step's tapped logits as its logit row (float32, the full vocabulary; no K/V)."""
    tokens = [s.token for s in reported]
    top2 = [tuple(t for t, _ in s.top) for s in reported]
    margins = [s.top[0][1] - s.top[1][1] for s in reported]
    boundary = Boundary(construction, list(z) + tokens, roles(grammar, z, where, len(tokens)), None, end)
    return Rollout(construction, tokens, [s.logprob for s in reported], top2, margins, boundary, f"vllm:{mode}")
