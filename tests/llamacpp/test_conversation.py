"""The conversation family on llama.cpp (docs/llamacpp.md, "Conversations"), on the embedded tiny model converted to
a bf16 GGUF by llama.cpp's converter, the tiny causal bank and its conversations (tiny-causal.conversations.jsonl)
under contracts/cpu-tiny-llamacpp.yaml: the session's reuse of its context proven by llama.cpp's own count of the
tokens it evaluated, the one-call and one-token-per-call constructions, the family's records on two conversations,
and the must-fail control (a session whose cache is dropped between turns is reported as vacuous).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

if os.environ.get("REPLAYTESTS_REQUIRE_LLAMACPP") != "1":
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed here (bash tools/install-llamacpp.sh)")

from replaytests.engine.llamacpp import conversation as llamacpp_conversation
from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.families import conversation as family
from replaytests.inputs.bank import read_bank
from replaytests.inputs.contract import load_contract
from replaytests.inputs.conversations import path_for

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "models" / "tiny-qwen2"
BANK = REPO / "fixtures" / "banks" / "tiny-causal.jsonl"
SMOLLM2_CONTRACT = REPO / "contracts" / "cpu-smollm2-llamacpp.yaml"
SMOLLM2_BANK = REPO / "fixtures" / "banks" / "smollm2-causal.jsonl"
ROWS = 2  # conversations run end to end
EXACT_PAIRS = ("session~session_replica", "replay~replay_replica", "rerendered~rerendered_replica",
               "incremental~incremental_replica", "session~replay", "session~incremental")


@pytest.fixture(scope="module")
def rows(rows):
    """The first ROWS rows of the tiny causal bank (tests/llamacpp/conftest.py)."""
    return rows[:ROWS]


@pytest.fixture(scope="module")
def settings(contract) -> dict:
    return contract.settings["conversation"] | {"bank": path_for(BANK)}


class Chat(NamedTuple):
    template: str
    texts: list[str]  # the user turns as text
    closer: int
    users: list[list[int]]  # each user turn's segment as a session appends it


def chat_of(runtime, settings, row) -> Chat:
    conversation, template = family._bank(settings["bank"], len(runtime.grammar.content), settings["cap"])[row.id]
    texts = [t.user for t in conversation.turns]
    closer, users = family.chat(runtime, template, texts, row.id)
    return Chat(template, texts, closer, users)


@pytest.fixture(scope="module")
def records(runtime, rows, settings):
    return [family.run(runtime, row, settings) for row in rows]


def smollm2_conversations() -> Path:
    """SmolLM2's conversations beside its causal bank; the tests that read them skip, naming the command that
    writes them, until the bank is committed (fixtures/make_conversations.py smollm2, then
    fixtures/causal_conversations.py smollm2)."""
    path = path_for(SMOLLM2_BANK)
    if not path.is_file():
        pytest.skip(f"no {path.name} (PYTHONPATH=src python fixtures/causal_conversations.py smollm2)")
    return path


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_a_causal_banks_conversations_are_its_models(model):
    """<model>-causal.jsonl holds <model>.jsonl's problems under the same ids, and a conversation's tokens all take
    the prompt's role: the conversations beside it are the same file (fixtures/causal_conversations.py copies it),
    which drifts from the other only by mistake."""
    banks = BANK.parent
    causal = smollm2_conversations() if model == "smollm2" else path_for(BANK)
    assert causal.read_bytes() == path_for(banks / f"{model}.jsonl").read_bytes()


def test_the_chat_template_renders_as_transformers_renders_it(runtime, rows, settings):
    """llama-cpp-python's own chat formatter (what its server renders a GGUF's template with) gives the text
    transformers' apply_chat_template gives, for every prefix of the conversation, with and without the
    generation prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    chat = chat_of(runtime, settings, rows[0])
    answers = ["42", "\ufffdx"]
    for turn in range(1, len(chat.texts) + 1):
        messages = [m for k, text in enumerate(chat.texts[:turn]) for m in
                    [{"role": "user", "content": text}] + ([{"role": "assistant", "content": answers[k]}]
                                                           if k < turn - 1 else [])]
        for prompt in (True, False):
            ours = runtime.render(chat.template, messages, prompt)
            theirs = tokenizer.apply_chat_template(messages, chat_template=chat.template, tokenize=False,
                                                   add_generation_prompt=prompt)
            assert ours == theirs, f"turn {turn}, generation prompt {prompt}: {ours!r} vs {theirs!r}"


def test_a_session_reads_every_earlier_turn_from_its_context(runtime, rows, settings):
    """The session's turn k > 1 is one llama_decode call over the previous closer and user turn k: llama.cpp
    counted exactly those tokens evaluated, so the rest of the history (the earlier turns, the assistant tokens it
    decoded included) was read from the context it kept."""
    chat = chat_of(runtime, settings, rows[0])
    turns = runtime.session(chat.users, settings["cap"], chat.closer)
    assert [t.turn for t in turns] == list(range(1, len(chat.users) + 1))
    first = turns[0].boundary.state
    assert (first.evaluated, first.prefill_steps) == (len(chat.users[0]), 1), first
    for before, now, user in zip(turns, turns[1:], chat.users[1:], strict=False):
        saved, decoded = now.boundary.state, len(before.boundary.tokens) + len(before.answer.tokens) - 1
        assert saved.prefill_steps == 1, f"turn {now.turn}: {saved.prefill_steps} calls for the request"
        assert saved.evaluated == 1 + len(user), \
            f"turn {now.turn}: llama.cpp evaluated {saved.evaluated} tokens, not the closer and the user turn's"
        assert saved.cached_tokens == decoded, (now.turn, saved.cached_tokens, decoded)
        assert now.boundary.tokens == before.boundary.tokens + before.answer.tokens + user


def test_a_replay_is_one_call_per_turn_and_incremental_one_token_per_call(runtime, rows, settings):
    chat = chat_of(runtime, settings, rows[0])
    histories = [t.boundary.tokens for t in runtime.session(chat.users, settings["cap"], chat.closer)]
    replay = runtime.replayed("replay", histories, settings["cap"], chat.closer)
    incremental = runtime.replayed("incremental", histories, settings["cap"], chat.closer)
    assert [(t.boundary.state.prefill_steps, t.boundary.state.evaluated) for t in replay] == \
        [(1, len(h)) for h in histories], [t.boundary.state for t in replay]
    assert [(t.boundary.state.prefill_steps, t.boundary.state.evaluated) for t in incremental] == \
        [(len(h), len(h)) for h in histories], [t.boundary.state for t in incremental]


@pytest.mark.parametrize("index", range(ROWS))
def test_the_family_records_every_turn_with_the_reuse_counted(records, index):
    """Two conversations end to end: every turn's session reused the earlier turns by llama.cpp's count (each
    session arm), and on this build (f32 K/V, flash attention off: batch-invariant, docs/llamacpp.md) every
    construction of the token history reached the session's state bit for bit, K/V and logits, and decoded the
    same assistant turn."""
    record = records[index]
    assert record.ok, record.reason
    assert len(record.turns) == 3, len(record.turns)
    assert record.turns[0].prefix_hit is None and all(t.prefix_hit.covers_decode for t in record.turns[1:]), \
        [t.prefix_hit for t in record.turns]
    for before, turn in zip(record.turns, record.turns[1:], strict=False):
        for arm in ("session", "session_replica"):
            decoded = before.history_len + len(before.arms[arm].suffix) - 1  # the closer is chosen, not fed
            served = turn.arms[arm].served
            assert (served.cached_tokens, served.prompt_block_tokens) == (decoded, before.history_len), \
                (turn.turn, arm, served)
    for turn in record.turns:
        inexact = {pair: c for pair in EXACT_PAIRS if not ((c := turn.comparisons[pair]).cache_exact
                                                           and c.logits_exact and c.suffix_equal)}
        assert not inexact, f"{record.row} turn {turn.turn}: not bit-exact: {inexact}"


def test_the_gates_pass_the_session_pairs(records, contract):
    for record in records:
        for pair in ("session~replay", "session~rerendered"):
            judged = contract.gates.conversation_turns(record, pair)
            assert judged.outcome in ("pass", "recorded") and "vacuous session hit" not in judged.message, judged


@pytest.mark.parametrize("fault", ["evicted", "emptied"])
def test_a_session_whose_cache_is_dropped_between_turns_is_not_a_session(runtime, rows, settings, contract,
                                                                        monkeypatch, fault):
    """Must-fail control: after each assistant turn the session's cache is dropped. `evicted`: the context knows
    (as a server whose slot was evicted), so the next request evaluates the whole history again; the states are
    those of a session (a one-call history on this build), and only llama.cpp's count tells: every later turn is
    reported as a vacuous session and the gate does not pass it. `emptied`: llama.cpp's memory is cleared behind
    the context's back; llama.cpp takes the next request at the positions it expected all the same, and its count
    reads as a full reuse, but the state it leaves holds the request's cells only: the row fails closed."""
    decode = llamacpp_conversation._decode

    def dropping(runtime_, context, logits, cap, closer, where):
        answer = decode(runtime_, context, logits, cap, closer, where)
        if "session" in where:
            if fault == "evicted":
                context.clear()
            else:
                context.llama_cpp.llama_memory_clear(context.memory, True)
        return answer

    monkeypatch.setattr(llamacpp_conversation, "_decode", dropping)
    record = family.run(runtime, rows[0], settings)
    if fault == "emptied":
        assert not record.ok and "the cache it read from is not there" in record.reason, record.reason
        print(f"emptied: {record.reason}")
        return
    assert record.ok, record.reason
    later = record.turns[1:]
    cached = [t.arms[arm].served.cached_tokens for t in later for arm in ("session", "session_replica")]
    assert cached == [0] * len(cached) and not any(t.prefix_hit.covers_decode for t in later), \
        (cached, [t.prefix_hit for t in later])
    for pair in ("session~replay", "session~rerendered"):
        judged = contract.gates.conversation_turns(record, pair)
        found = [t.turn for t in later if f"at turn {t.turn}: vacuous session hit" in judged.message]
        assert judged.outcome == "recorded" and found == [t.turn for t in later], judged
    shown = later[-1].comparisons["session~replay"]
    print(f"evicted session vs replay at turn {later[-1].turn}: cache exact {shown.cache_exact}, logits exact "
          f"{shown.logits_exact}")


@pytest.fixture(scope="module")
def smollm2_records():
    """SmolLM2's first two conversations (its ChatML template, `<|im_end|>` closing a turn, cap 24) on the GGUF it
    ships (Q4_1), at fp32."""
    bank = smollm2_conversations()
    from replaytests.inputs.models import shipped_gguf

    contract = load_contract(SMOLLM2_CONTRACT)
    runtime = Runtime.load(shipped_gguf("smollm2"), contract, "fp32")
    rows = read_bank(SMOLLM2_BANK, runtime.grammar, 8192, contract.caps.suffix_room())[:ROWS]
    return [family.run(runtime, row, contract.settings["conversation"] | {"bank": bank}) for row in rows]


@pytest.mark.parametrize("index", range(ROWS))
def test_smollm2_sessions_read_every_earlier_turn_from_their_context(smollm2_records, index):
    """As on the tiny model, on SmolLM2's conversations: every later turn of both sessions read the whole earlier
    history from the context it kept, the tokens it decoded included (llama.cpp's count), and every construction of
    the token history reached the session's state bit for bit. Whether the session's assistant turns are the bank's
    (transformers at bf16) is printed: data, not a premise."""
    record = smollm2_records[index]
    assert record.ok, record.reason
    for before, turn in zip(record.turns, record.turns[1:], strict=False):
        assert turn.prefix_hit.covers_decode, (turn.turn, turn.prefix_hit)
        for arm in ("session", "session_replica"):
            decoded = before.history_len + len(before.arms[arm].suffix) - 1
            assert turn.arms[arm].served.cached_tokens == decoded, (turn.turn, arm, turn.arms[arm].served)
    for turn in record.turns:
        inexact = {pair: c for pair in EXACT_PAIRS if not ((c := turn.comparisons[pair]).cache_exact
                                                           and c.logits_exact and c.suffix_equal)}
        assert not inexact, f"{record.row} turn {turn.turn}: not bit-exact: {inexact}"
    correct = [t.arms["session"].correct for t in record.turns]
    print(f"{record.row}: histories {[t.history_len for t in record.turns]}, session is the bank's "
          f"{[t.session_matches_bank for t in record.turns]}, correct {correct}, re-rendered ids equal "
          f"{[t.rerendered.ids_equal for t in record.turns]}")
