"""Converters into the rollouts dump `replaytests.rollouts/1` from what RL frameworks and vLLM hold of a
rollout (docs/rollouts.md, "From other formats", names the file and class each mapping was read from).

Each reads a JSONL file of the framework's own objects, one per line, and gives dump rows; a line it cannot
map is a DumpError naming the file, the line and the field, and nothing is written (the output is written
whole and atomically, after every line converted). What none of them can recover is refused, not guessed: a
multi-turn response with tool tokens between the engine's (verl's response_mask, OpenRLHF's action_ranges).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from replaytests.errors import DumpError, short
from replaytests.files import dumps, jsonl_objects, read_text, write_atomic
from replaytests.inputs.rollouts import SCHEMA, FieldError, parse_row


def _get(value: dict, field: str, kind: type = list) -> object:
    if field not in value:
        raise FieldError(field, "missing (required)")
    if not isinstance(value[field], kind):
        raise FieldError(field, f"expected a {kind.__name__}, got {type(value[field]).__name__}")
    return value[field]


def _row(prompt: list, response: list, logprobs: list, row_id: str, engine: str, **meta) -> dict:
    return {"schema": SCHEMA, "id": row_id, "prompt_ids": prompt, "response_ids": response, "logprobs": logprobs,
            "engine": engine, **{name: value for name, value in meta.items() if value is not None}}


def from_verl(value: dict, line: int) -> Iterator[dict]:
    """One row of verl's batch (DataProto.batch, keys as verl/experimental/agent_loop/agent_loop.py's
    `_postprocess` names them), its tensors as lists: `prompts` left-padded, `responses` right-padded,
    `attention_mask` over both, `rollout_log_probs` (0.0 on padding), optional `response_mask`; its id the
    row's `request_id`, else its `uid` (non_tensor_batch) and its line: verl gives a prompt's n samples one uid
    (ray_trainer.py repeats the batch after assigning it)."""
    if "rollout_log_probs" not in value:
        raise FieldError("rollout_log_probs", "missing (required): verl records it only with "
                                              "actor_rollout_ref.rollout.calculate_log_probs=True (off by default)")
    prompts, responses = _get(value, "prompts"), _get(value, "responses")
    mask, logprobs = _get(value, "attention_mask"), _get(value, "rollout_log_probs")
    if len(mask) != len(prompts) + len(responses) or len(logprobs) != len(responses):
        raise FieldError("attention_mask", f"{len(mask)} entries for {len(prompts)} prompt and {len(responses)} "
                                           f"response positions, {len(logprobs)} rollout_log_probs")
    if (bad := next((bit for bit in mask if type(bit) is not int or bit not in (0, 1)), None)) is not None:
        raise FieldError("attention_mask", f"expected 0s and 1s, got {short(bad)}")
    kept = sum(mask[:len(prompts)])
    length = sum(mask[len(prompts):])
    response_mask = value.get("response_mask", [1] * length)
    if 0 in response_mask[:length]:
        raise FieldError("response_mask", f"0 at response position {response_mask.index(0)}: tokens the engine did not "
                                    "choose (a tool's) inside the response; multi-turn rows are not supported yet")
    row_id = value.get("request_id", f"{value['uid']}/line-{line}" if "uid" in value else f"line-{line}")
    yield _row(prompts[len(prompts) - kept:], responses[:length], logprobs[:length], str(row_id), "verl")


def from_trl(value: dict, line: int) -> Iterator[dict]:
    """One response of TRL's vLLM server (`trl vllm-serve`, POST /generate/, trl/scripts/vllm_serve.py; what
    trl/generation/vllm_client.py's VLLMClient.generate returns): `prompt_ids` per prompt, `completion_ids`
    per completion (n per prompt, in order), `logprobs` and `logprob_token_ids` [completion][position][k]
    sorted by rank; the chosen token's entry is the one whose id is the completion's token."""
    prompts, completions = _get(value, "prompt_ids"), _get(value, "completion_ids")
    logprobs, ids = _get(value, "logprobs"), _get(value, "logprob_token_ids")
    if not prompts or len(completions) % len(prompts) or not len(logprobs) == len(ids) == len(completions):
        raise FieldError("completion_ids", f"{len(completions)} completions for {len(prompts)} prompts with "
                                     f"{len(logprobs)} logprobs lists (n completions per prompt, one list each)")
    n = len(completions) // len(prompts)
    for index, completion in enumerate(completions):
        chosen = _chosen(logprobs[index], ids[index], completion, f"logprobs[{index}]")
        yield _row(prompts[index // n], completion, chosen, f"line-{line}/{index}", "trl")


def _chosen(logprobs: list, ids: list, completion: list, field: str) -> list:
    if len(logprobs) != len(completion) or len(ids) != len(completion):
        raise FieldError(field, f"{len(logprobs)} positions for {len(completion)} completion tokens")
    out = []
    for position, (values, tokens) in enumerate(zip(logprobs, ids, strict=True)):
        if not isinstance(values, list) or not isinstance(tokens, list) or len(values) != len(tokens):
            raise FieldError(f"{field}[{position}]", f"expected a list of one log-probability per id of "
                                                     f"logprob_token_ids, got {short(values)} for {short(tokens)}")
        if completion[position] not in tokens:
            raise FieldError(f"{field}[{position}]",
                             f"no log-probability of the chosen token {short(completion[position])}")
        out.append(values[tokens.index(completion[position])])
    return out


def from_openrlhf(value: dict, line: int) -> Iterator[dict]:
    """One response of OpenRLHF's agent executor (openrlhf/utils/agent.py, the dict its `execute` returns):
    `observation_tokens` (prompt + action), `action_ranges` [[start, end]], `rollout_log_probs` aligned with
    the observation (0.0 over the prompt)."""
    tokens, ranges = _get(value, "observation_tokens"), _get(value, "action_ranges")
    logprobs = _get(value, "rollout_log_probs")
    if len(ranges) != 1 or not isinstance(ranges[0], list) or len(ranges[0]) != 2:
        raise FieldError("action_ranges",
                         f"{short(ranges)}: one [start, end] range (multi-turn rows are not supported yet)")
    start, end = ranges[0]
    if len(logprobs) != len(tokens) or not 0 < start < end <= len(tokens):
        raise FieldError("action_ranges", f"[{start}, {end}] over {len(tokens)} observation tokens and {len(logprobs)} "
                                    "rollout_log_probs")
    yield _row(tokens[:start], tokens[start:end], logprobs[start:end], f"line-{line}", "openrlhf")


# What vLLM's OpenAI server writes for a log-probability of -inf (serving_completion.py: max(logprob, -9999.0))
VLLM_NO_PROBABILITY = -9999.0


def from_vllm(value: dict, line: int) -> Iterator[dict]:
    """One response of vLLM's OpenAI-compatible completions endpoint (CompletionResponse, vllm/entrypoints/
    openai/protocol.py) requested with `logprobs: 0` and `return_token_ids: true`: each choice's
    `prompt_token_ids`, `token_ids` and `logprobs.token_logprobs`."""
    for index, choice in enumerate(_get(value, "choices")):
        if not isinstance(choice, dict) or not isinstance(choice.get("logprobs"), dict):
            raise FieldError(f"choices[{index}].logprobs", "missing: request the completion with `logprobs: 0`")
        for field in ("prompt_token_ids", "token_ids"):
            if not isinstance(choice.get(field), list):
                raise FieldError(f"choices[{index}].{field}",
                                 "missing: request the completion with `return_token_ids: true`")
        logprobs = choice["logprobs"].get("token_logprobs")
        if isinstance(logprobs, list) and VLLM_NO_PROBABILITY in logprobs:
            raise FieldError(f"choices[{index}].logprobs.token_logprobs[{logprobs.index(VLLM_NO_PROBABILITY)}]",
                             f"{VLLM_NO_PROBABILITY} is the server's stand-in for -inf: the engine gave the chosen "
                             "token no probability (processed log-probabilities after a top-k/top-p cut?); serve "
                             "with the default --logprobs-mode raw_logprobs")
        yield _row(choice["prompt_token_ids"], choice["token_ids"], logprobs,
                   f"{value.get('id', f'line-{line}')}/{choice.get('index', index)}", "vllm", model=value.get("model"))


FORMATS: dict[str, Callable[[dict, int], Iterator[dict]]] = {
    "verl": from_verl, "trl": from_trl, "openrlhf": from_openrlhf, "vllm": from_vllm}


def convert(kind: str, source: Path, out: Path) -> int:
    """`source` (the framework's JSONL) as a dump at `out`, written whole; the rows written. The rows are then
    read as any dump is (a converted row that breaks the schema is refused, naming its source line)."""
    rows, lines = [], {}  # the line each id was converted from
    for line, value in jsonl_objects(source, read_text(source, f"a {kind} rollouts file", DumpError), DumpError):
        try:
            converted = list(FORMATS[kind](value, line))
        except (FieldError, TypeError, ValueError, AttributeError, LookupError, OverflowError) as exc:
            problem = exc if isinstance(exc, FieldError) else f"not {kind}'s layout ({short(str(exc))})"
            raise DumpError(f"{source}:{line}: {problem}") from None
        for row in converted:
            try:
                parse_row(row, line)
            except FieldError as exc:
                raise DumpError(f"{source}:{line}: converted to {SCHEMA}, {exc}") from None
            if row["id"] in lines:
                raise DumpError(f"{source}:{line}: converted to {SCHEMA}, field 'id': {short(row['id'])} is the id "
                                f"of a row of line {lines[row['id']]} already (a dump's ids name one row each)")
            lines[row["id"]] = line
        rows.extend(converted)
    write_atomic(out, "".join(dumps(row) + "\n" for row in rows))
    return len(rows)
