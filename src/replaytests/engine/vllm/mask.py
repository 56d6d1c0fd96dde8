"""The structural logits mask inside vLLM: a logits processor that runs the protocol's grammar cursor
over each request's tokens, and forces the tokens of a teacher-forced (incremental) construction.

vLLM instantiates the class itself, in this process (the backend turns its multiprocessing off), so
the grammar reaches it through GRAMMARS, keyed by the request's `extra_args`. A request that names no grammar
(a rollout's teacher forcing: the model's own distribution, no structural mask) is only forced. A request that
names a conversation `turn` (engine/vllm/conversation.py) decodes an assistant turn: its forced tokens first, then
greedy over the grammar's content tokens and the turn's closer, only the closer at the cap.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from replaytests.engine.protocol import Cursor, Grammar

GRAMMARS: dict[str, Grammar] = {}  # key -> the grammar of one backend
ARG = "replaytests"  # the key of SamplingParams.extra_args this processor reads


class StructuralMask(AdapterLogitsProcessor):
    """Greedy choice under the grammar: every token outside the eligible set goes to -inf; where the
    request forces its next tokens (`forced`), only the forced one stays; past them, a request without a
    grammar is left as the model made it."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the argmax: vLLM must apply it under greedy decoding

    def new_req_logits_processor(self, params):
        args = (params.extra_args or {}).get(ARG)
        if args is None:
            return None
        grammar = args.get("grammar")
        if (turn := args.get("turn")) is not None:
            return _Turn(GRAMMARS[grammar], tuple(args.get("forced", ())), turn["closer"], turn["cap"])
        return _Request(None if grammar is None else GRAMMARS[grammar], tuple(args.get("forced", ())))


class _Request:
    """One request's cursor, advanced over the tokens it decoded since the last step."""

    def __init__(self, grammar: Grammar | None, forced: tuple[int, ...]) -> None:
        self.grammar, self.forced = grammar, forced
        self.cursor: Cursor | None = None
        self.seen = 0

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.grammar is None:
            if len(output_ids) >= len(self.forced):
                return logits
            keep = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
            keep[self.forced[len(output_ids)]] = True
            return logits.masked_fill(~keep, float("-inf"))
        if self.cursor is None:
            self.cursor = Cursor()
            for token in prompt_ids:
                self.cursor.advance(token, self.grammar)
        for token in output_ids[self.seen:]:
            self.cursor.advance(token, self.grammar)
        self.seen = len(output_ids)
        if self.seen < len(self.forced):
            keep = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
            keep[self.forced[self.seen]] = True
        else:
            keep = self.grammar.eligible(self.cursor)[: logits.shape[0]]
        return logits.masked_fill(~keep, float("-inf"))


class _Turn:
    """An assistant turn of a conversation (engine/conversation.py), as the Hugging Face backend decodes it: the
    forced tokens first (an incremental construction's history, one decode step each), then any content token or
    the closer, only the closer once the turn holds `cap` content tokens (every earlier choice past the forced
    ones was content: the closer ends the turn)."""

    def __init__(self, grammar: Grammar, forced: tuple[int, ...], closer: int, cap: int) -> None:
        self.forced, self.cap = forced, cap
        self.closer_only = torch.zeros_like(grammar.content)
        self.closer_only[closer] = True
        self.either = grammar.content | self.closer_only

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        step = len(output_ids)
        if step < len(self.forced):
            keep = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
            keep[self.forced[step]] = True
        else:
            keep = (self.either if step - len(self.forced) < self.cap else self.closer_only)[: logits.shape[0]]
            keep = keep.to(logits.device)
        return logits.masked_fill(~keep, float("-inf"))
