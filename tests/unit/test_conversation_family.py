"""The conversation family: where a re-rendered history first differs from the generated one (and the must-fail
control, a dropped separator found at its turn and position), the conversation bank's reader and its refusals,
the committed bank, and one row run end to end on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from replaytests.errors import BankError
from replaytests.families.conversation import rerender_difference
from replaytests.inputs.conversations import path_for, read_conversations
from replaytests.inputs.options import REPO

BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
P, SLASH_P, A, SLASH_A = 257, 258, 267, 268  # <|prompt|> <|/prompt|> <|answer|> <|/answer|> in the tiny tokenizer
USERS = [[P, 72, 105, SLASH_P, A], [P, 78, 111, SLASH_P, A]]
ANSWERS = [[52, 50, SLASH_A]]  # "42", then the closer
HISTORY = USERS[0] + ANSWERS[0] + USERS[1]


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join("\ufffd" if i >= 128 else chr(i) for i in ids)  # ids past ASCII: bytes that are not UTF-8


class Case(NamedTuple):
    id: str
    rendered: list[int]
    answers: list[list[int]]
    first: int | None
    turn: int | None
    segment: str | None
    reason: str | None


CASES = [
    Case("equal", HISTORY, ANSWERS, None, None, None, None),
    # the must-fail control: a template that drops the separator closing the assistant turn (verl #6501's kind)
    Case("dropped-separator", HISTORY[:7] + HISTORY[8:], ANSWERS, 7, 1, "assistant", "template"),
    Case("user-turn-edited", [*HISTORY[:9], 80, *HISTORY[10:]], ANSWERS, 9, 2, "user", "template"),
    Case("lossy-decode", USERS[0] + [65533, 50, SLASH_A] + USERS[1], [[200, 50, SLASH_A]], 5, 1, "assistant",
         "lossy decode"),
    Case("longer", [*HISTORY, A], ANSWERS, len(HISTORY), 2, "user", "template"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_rerender_difference_names_turn_position_and_why(case):
    history = USERS[0] + case.answers[0] + USERS[1]
    found = rerender_difference(history, case.rendered, USERS, case.answers, 2, encode, decode)
    equal = case.first is None
    assert found["ids_equal"] is equal, f"ids_equal {found['ids_equal']}, expected {equal}"
    assert (found["first_difference"], found["turn"], found["segment"]) == (case.first, case.turn, case.segment), (
        f"found token {found['first_difference']} in turn {found['turn']} {found['segment']}, expected token "
        f"{case.first} in turn {case.turn} {case.segment}")
    reason = found["reason"] or ""
    assert reason.startswith(case.reason or ""), f"reason {reason!r}, expected one starting {case.reason!r}"


def _bank(tmp_path: Path, turns: list) -> Path:
    path = tmp_path / "bad.conversations.jsonl"
    path.write_text(json.dumps({"schema": "replaytests.conversations/1", "id": "c0", "template": "t.jinja",
                                "turns": turns}) + "\n", encoding="utf-8")
    return path


GOOD = {"user": "What is 1 + 2?", "expected_answer": "3", "assistant_ids": [51, SLASH_A], "assistant": "3"}
BAD_BANKS = [
    pytest.param({k: v for k, v in GOOD.items() if k != "user"}, "turns\\[0\\]: missing field 'user'", id="no-role"),
    pytest.param(GOOD | {"assistant_ids": [51] * 13 + [SLASH_A]}, "13 content tokens, more than the cap \\(12\\)",
                 id="longer-than-cap"),
    pytest.param(GOOD | {"assistant_ids": [51, 999]}, "ids \\[999\\] outside the vocabulary", id="outside-vocab"),
]


@pytest.mark.parametrize(("turn", "message"), BAD_BANKS)
def test_a_bad_conversation_bank_is_one_line_naming_file_line_and_field(tmp_path, turn, message):
    path = _bank(tmp_path, [turn])
    with pytest.raises(BankError, match=f"bad.conversations.jsonl:1 \\(conversation c0\\): .*{message}"):
        read_conversations(path, 320, 12)


TEMPLATE = (REPO / "fixtures" / "chat_templates" / "tiny-qwen2.jinja").read_text(encoding="utf-8")
BAD_TEMPLATES = [
    pytest.param("{% for m in messages %}{{ m['content'] }", "not a Jinja template", id="syntax-error"),
]


@pytest.mark.parametrize(("template", "message"), BAD_TEMPLATES)
def test_a_template_that_does_not_parse_is_one_line_naming_bank_line_and_field(tmp_path, template, message):
    from replaytests.inputs.conversations import read_template

    (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
    conversation = read_conversations(_bank(tmp_path, [GOOD]), 320, 12)[0]
    with pytest.raises(BankError, match=f"bad.conversations.jsonl:1 \\(conversation c0\\): field 'template' .*"
                                        f"t.jinja:1: {message}"):
        read_template(tmp_path / "bad.conversations.jsonl", conversation)


RENDER_FAILURES = [
    pytest.param("{{ raise_exception('no system role') }}", "fails to render: .*no system role", id="raises"),
    pytest.param("{% for m in messages %}{{ m['content'] }}{% endfor %}", "does not begin with one token",
                 id="no-end-of-turn"),
    pytest.param("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}",
                 "drops the assistant turn's content", id="drops-assistant"),
]


@pytest.mark.model
@pytest.mark.parametrize(("template", "message"), RENDER_FAILURES)
def test_a_template_that_fails_to_render_or_close_a_turn_is_one_line(fp32_runtime, template, message):
    from replaytests.families.conversation import chat

    with pytest.raises(BankError, match=f"^bank.jsonl:3 \\(conversation c\\): field 'template': .*{message}"):
        chat(fp32_runtime, template, ["What is 1 + 2?", "Now add 7 to that."], "bank.jsonl:3 (conversation c): "
                                                                                "field 'template'")


@pytest.mark.model
def test_the_tiny_template_closes_a_turn_with_the_answer_closer_and_segments_each_user_turn(fp32_runtime):
    from replaytests.families.conversation import chat

    closer, segments = chat(fp32_runtime, TEMPLATE, ["Hi", "No"], "tiny")
    assert closer == SLASH_A, f"closer {closer}, expected <|/answer|> ({SLASH_A})"
    assert segments == [[P, *fp32_runtime.encode("Hi"), SLASH_P, A], [P, *fp32_runtime.encode("No"), SLASH_P, A]], \
        f"segments {segments}"


@pytest.mark.parametrize(("bank", "cap"), [pytest.param("tiny", 12, id="tiny"),
                                          pytest.param("smollm2", 24, id="smollm2")])
def test_a_committed_bank_holds_48_three_turn_conversations_within_its_cap_reaching_512_tokens(bank, cap):
    path = path_for(REPO / "fixtures" / "banks" / f"{bank}.jsonl")
    conversations = read_conversations(path, 50_000, cap, min_turns=3)
    manifest = json.loads(path.with_name(f"{bank}.conversations.manifest.json").read_text(encoding="utf-8"))
    assert len(conversations) == manifest["conversations"] == 48, f"{len(conversations)} conversations"
    assert manifest["cap"] == cap, f"the manifest's cap {manifest['cap']}, the contract's {cap}"
    assert manifest["history_len_last_turn"]["max"] >= 512, manifest["history_len_last_turn"]
    from replaytests.engine.conversation import graded

    correct = [sum(bool(graded(c.turns[k].assistant, c.turns[k].expected_answer)) for c in conversations)
               for k in range(3)]
    assert correct == manifest["correct_per_turn"], f"graded {correct}, manifest {manifest['correct_per_turn']}"


def test_one_row_end_to_end_on_the_tiny_model(fp32_runtime, bank_rows):
    from replaytests.families.conversation import run

    record = run(fp32_runtime, bank_rows[0], {"cap": 12, "bank": path_for(BANK)})
    assert record.ok, record.reason
    assert len(record.turns) == 3, f"{len(record.turns)} turns"
    control = record.turns[0].comparisons["session~replay"]
    assert control.cache_exact and control.logits_exact and control.suffix_equal, f"turn-1 control: {control}"
    inexact = [(t.turn, pair) for t in record.turns for pair in ("session~session_replica", "replay~replay_replica")
               if not t.comparisons[pair].suffix_equal or not t.comparisons[pair].cache_exact]
    assert not inexact, f"replicas not bit-exact at (turn, pair) {inexact}"
    assert all(t.session_matches_bank for t in record.turns[:1]), "turn 1 of the session differs from the bank"
    lossy = [t.rerendered for t in record.turns[1:] if not t.rerendered.ids_equal]
    assert lossy and all(r.reason.startswith("lossy decode") for r in lossy), [r.reason for r in lossy]


@pytest.mark.model
def test_a_replica_that_differs_past_the_rerendered_prefix_fails_its_gate(fp32_runtime, bank_rows, tiny_contract,
                                                                         monkeypatch):
    """The must-fail control of the replica gate at a turn whose re-rendered ids differ: replay_replica's K moved at
    the history's last position, past the ids the re-rendered history shares, is seen by replay~replay_replica (the
    pairs of one history compare it whole; they compared the shared ids alone, and this gate passed)."""
    from replaytests.families.conversation import run

    replayed = fp32_runtime.replayed

    def moved(construction, histories, cap, closer):
        states = replayed(construction, histories, cap, closer)
        if construction == "replay_replica":
            for state in states[1:]:
                state.boundary.layers[0][0][..., -1, :] += 1.0
        return states

    monkeypatch.setattr(fp32_runtime, "replayed", moved)
    record = run(fp32_runtime, bank_rows[0], {"cap": 12, "bank": path_for(BANK)})
    cut = [t.turn for t in record.turns if not t.rerendered.ids_equal and t.rerendered.shared < t.history_len]
    assert cut, "premise: no turn whose re-rendered ids differ before the history's end"
    seen = [t.turn for t in record.turns if not t.comparisons["replay~replay_replica"].cache_exact]
    assert seen == [2, 3], f"the moved K seen at turns {seen}, the re-rendered ids cut at turns {cut}"
    judged = tiny_contract.gates.replicas_at_every_step(record, "replay~replay_replica")
    assert judged.outcome == "fail", f"{judged.outcome}: {judged.message}"


GRADED = [
    pytest.param("The capital of France is Paris.", "Paris", True, id="sentence-last-word"),
    pytest.param("The capital of France is Paris.", "France", False, id="key-inside-not-last"),
    pytest.param("7 + 6 = 13", "13", True, id="equation-last-number"),
    pytest.param("A dog has four legs.", "4", True, id="number-word"),
    pytest.param("A spider has 18 legs.", "8", False, id="wrong-number"),
    pytest.param("It is -1.", "-1", True, id="negative"),
    pytest.param("", "3", False, id="empty"),
    pytest.param("3", None, None, id="no-key"),
]


@pytest.mark.parametrize(("answer", "expected", "correct"), GRADED)
def test_a_chat_answer_is_graded_by_its_last_number_or_word(answer, expected, correct):
    from replaytests.engine.conversation import graded

    assert graded(answer, expected) is correct, f"graded({answer!r}, {expected!r}) is not {correct}"
