"""The protocol checkpoint's text (inputs/protocol_text.py): seeded problems, worked solutions that
hold their own result, and a training corpus that never holds a bank problem."""

from __future__ import annotations

import json
import random

import pytest

from replaytests.inputs import protocol_text
from replaytests.inputs.options import REPO

PROBLEMS = REPO / "fixtures" / "problems" / "smollm2-protocol.jsonl"


def _bank_keys() -> set[tuple]:
    return {tuple(json.loads(line)["operands"]) for line in PROBLEMS.read_text().splitlines()}


@pytest.mark.parametrize("kind", protocol_text.KINDS)
def test_a_solution_states_its_result_in_the_merge_and_the_answer(kind):
    for seed in range(50):
        problem = protocol_text.draw(random.Random(seed), kind)
        *branches, merge, answer = protocol_text.solution(problem)
        assert answer == str(problem.result), f"{problem}: answer {answer!r}"
        assert merge.endswith(f"so the result is {problem.result}."), f"{problem}: merge {merge!r}"
        assert len(branches) == 3 and all(branches), problem


def test_the_committed_problems_are_the_generator_output():
    import sys

    sys.path.insert(0, str(REPO / "fixtures"))
    try:
        from make_problems_protocol import problems
    finally:
        sys.path.pop(0)
    assert [json.loads(line) for line in PROBLEMS.read_text().splitlines()] == problems()


def test_the_training_corpus_is_seeded_and_holds_no_bank_problem():
    bank = _bank_keys()
    assert len(bank) == 48, "two bank problems share their operands"
    corpus = protocol_text.corpus(20261203, 500, exclude=bank, sentences=(0, 40))
    assert corpus == protocol_text.corpus(20261203, 500, exclude=bank, sentences=(0, 40))
    assert corpus != protocol_text.corpus(1, 500, exclude=bank, sentences=(0, 40))
    unfiltered = protocol_text.corpus(20261203, 5000, exclude=set(), sentences=(0, 0))
    assert bank & {p.key for p, _, _ in unfiltered}, \
        "the exclusion is vacuous: an unfiltered corpus of 5000 holds no bank problem either"
    assert not bank & {p.key for p, _, _ in protocol_text.corpus(20261203, 5000, exclude=bank, sentences=(0, 0))}
