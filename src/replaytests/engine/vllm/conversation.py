"""Conversations on the vLLM backend (engine/conversation.py): every turn one request on the main engine, token in
(the prompt is token ids, never text), the assistant turn decoded by the engine greedily under the structural
mask's `turn` rule (engine/vllm/mask.py: content tokens or the closer, the closer forced at the cap).

- session: the turns as a chat server with prefix caching answers them, in sequence on one engine: turn k's prompt
  is the session's token history so far (the user segments and the assistant turns it decoded, each with its
  closer) and user segment k. The prefix cache is emptied before turn 1 only; turn k >= 2 reads from it what the
  requests before it left. Its `served.cached_tokens` is the engine's own count of the prompt tokens it read, and
  `served.prompt_block_tokens` the tokens of the full blocks that turn k-1 computed by prefill: a hit is a
  session's only where it reaches past them, into a block written while turn k-1 decoded (families/serving.py's
  `prefix_hit`); else it is vacuous (the gates say so, never counting it).
- replay, rerendered: one request over each turn's history on an emptied prefix cache (a cold prefill).
- incremental: one request over each turn's history on an emptied prefix cache, its first token the prompt and
  every later one forced, one decode step each (one token per call, as the rollout's incremental), then the
  assistant turn.
vLLM shows no K/V: a turn's state is the top-k logits of the step that chooses the assistant's first token (after
the mask, as every construction of this backend), and the engine's counters (`Served`).
"""

from __future__ import annotations

from replaytests.engine.boundary import Boundary, Suffix, steps_digest
from replaytests.engine.conversation import ONE_CALL, TurnState
from replaytests.errors import BoundaryMismatch, ConfigError
from replaytests.inputs.blocks import PROMPT

ROLE = PROMPT  # every conversation token: plain causal attention (engine/conversation.py)
ARG = "replaytests"  # SamplingParams.extra_args key the structural mask reads (mask.ARG, without importing vllm)


def _params(runtime, cap: int, closer: int, forced: list[int]):
    """A turn's sampling: greedy, at most the forced tokens, `cap` content tokens and the closer. A session or
    one-call request stops at the closer; one with forced tokens (whose history holds earlier closers, which
    vLLM would stop at) runs its full length, cut at the first closer after them."""
    return runtime._vllm.SamplingParams(
        temperature=0.0, max_tokens=len(forced) + cap + 1, logprobs=runtime.settings["logprobs"], ignore_eos=True,
        stop_token_ids=[] if forced else [closer], detokenize=False, seed=0,
        extra_args={ARG: {"grammar": runtime._key, "forced": list(forced), "turn": {"closer": closer, "cap": cap}}})


def _turn(runtime, construction: str, turn: int, history: list[int], prompt: list[int], cap: int, closer: int,
          reset: bool, prompt_block_tokens: int) -> TurnState:
    """One request: `prompt`, then history's later tokens forced, then the assistant turn; its state over `history`."""
    from replaytests.engine.vllm.runtime import Served

    where = f"vllm conversation {construction} turn {turn} ({runtime.cell})"
    forced = history[len(prompt):]
    out, prefill_steps = runtime._submit([prompt], [_params(runtime, cap, closer, forced)], runtime.engine, reset)
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    if tokens[:len(forced)] != forced:
        raise BoundaryMismatch(f"{where}: the forced decode chose other tokens than the history's")
    answer = tokens[len(forced):]
    if closer not in answer:
        raise BoundaryMismatch(f"{where}: the request ended by {completion.finish_reason} after {len(answer)} tokens "
                               f"of the assistant turn, before its closer {closer}")
    answer = answer[:answer.index(closer) + 1]
    steps = [sorted(((t, lp.logprob) for t, lp in step.items()), key=lambda item: -item[1])
             for step in completion.logprobs[len(forced):len(forced) + len(answer)]]
    if any(len(step) < 2 for step in steps):
        raise ConfigError(f"{where}: runtime.vllm.logprobs: a margin needs the top 2 logits of each step")
    suffix = Suffix(answer, [s[0][1] - s[1][1] for s in steps], runtime.tokenizer.decode(answer[:-1]),
                    [s[0][1] for s in steps])
    served = Served(out.num_cached_tokens or 0, prompt_block_tokens, prefill_steps, steps_digest(steps), suffix,
                    tuple(tuple(step) for step in steps))
    boundary = Boundary(construction, list(history), [ROLE] * len(history), None, runtime._logits(steps[0]), served)
    return TurnState(construction, turn, boundary, suffix)


def session(runtime, users: list[list[int]], cap: int, closer: int, construction: str = "session") -> list[TurnState]:
    """The session: turn k's request over the token history so far and user segment k, on the cache the requests
    before it left (emptied before turn 1 only)."""
    block = runtime.settings["block_size"]
    turns: list[TurnState] = []
    history: list[int] = []
    for turn, user in enumerate(users, start=1):
        # the tokens of full blocks the previous turn computed by prefill (its prompt): a hit past them reads a
        # block written while that turn decoded
        computed = len(turns[-1].boundary.tokens) // block * block if turns else 0
        prompt = history + list(user)
        state = _turn(runtime, construction, turn, prompt, prompt, cap, closer, turn == 1, computed)
        turns.append(state)
        history = prompt + list(state.answer.tokens)
    return turns


def replayed(runtime, construction: str, histories: list[list[int]], cap: int, closer: int) -> list[TurnState]:
    """`replay` or `rerendered` (one request over each turn's history) or `incremental` (its first token the
    prompt, every later one forced one decode step each), or a `*_replica`: each on an emptied prefix cache."""
    base = construction.removesuffix("_replica")
    if base not in (*ONE_CALL, "incremental"):
        raise ConfigError(f"vllm: unknown conversation construction {construction!r} (expected replay, rerendered "
                          "or incremental, or a *_replica)")
    return [_turn(runtime, construction, turn, list(history), list(history) if base in ONE_CALL else list(history[:1]),
                  cap, closer, True, 0) for turn, history in enumerate(histories, start=1)]


def render(runtime, template: str, messages: list[dict], generation_prompt: bool) -> str:
    """The messages through the chat template, as text (what a server tokenizes for a client's messages)."""
    return runtime.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
