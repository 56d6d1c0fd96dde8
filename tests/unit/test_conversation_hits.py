"""A conversation's session on a serving engine (vLLM) counts only where the engine's own counters prove it: turn k's
prefix hit must reach into a block written while turn k-1 decoded, else it is vacuous (recorded, never judged, never
passed); a request on an emptied cache that read from it is a failure. Hand-built records: no model, no vLLM
(tests/vllm/test_vllm_conversations.py runs the engine)."""

from __future__ import annotations

import pytest
from test_report import comparison, record

from replaytests.families.registry import FAMILIES
from replaytests.families.serving import prefix_hit
from replaytests.inputs.contract import load_contract
from replaytests.outputs.records import Record

CONVERSATION = FAMILIES["conversation"]
RERENDERED_EQUAL = {"ids_equal": True, "length": 40, "shared": 40, "first_difference": None, "turn": None,
                    "segment": None, "reason": None, "turns_not_round_tripping": []}


def _no_kv(compared: dict) -> dict:
    """A comparison of two boundaries without K/V (vLLM's): the logits compared, every K/V measure null."""
    return compared | {name: None for name in compared if name.startswith(("k_", "v_"))} | {"cache_exact": None,
                                                                                           "logits_exact": True}


def _turn(k: int, session_cached: int, prompt_block: int, cold_cached: int = 0, suffix_equal: bool = True) -> dict:
    fields = record("conversation", "tiny-000", "fp32", {f"{a}~{b}": _no_kv(comparison(suffix_equal=suffix_equal))
                                                         for a, b in CONVERSATION.pairs})
    for arm, values in fields["arms"].items():
        cached = session_cached if arm.startswith("session") else cold_cached
        values["served"] = {"cached_tokens": cached, "prompt_block_tokens": prompt_block if arm.startswith("session")
                            else 0, "prefill_steps": 1, "steps_digest": "d"}
    turn = {"turn": k, "history_len": 20 * k, "expected_answer": "a", "session_matches_bank": True,
            "arms": fields["arms"], "comparisons": fields["comparisons"], "rerendered": RERENDERED_EQUAL}
    return turn | ({"prefix_hit": prefix_hit(fields["arms"]["session"]["served"])} if k > 1 else {})


def _record(*later: tuple, first_cached: int = 0) -> Record:
    """Turn 1 (fresh), then one turn per (session_cached, prompt_block[, cold_cached[, suffix_equal]])."""
    turns = [_turn(1, first_cached, 0), *(_turn(k, *args) for k, args in enumerate(later, start=2))]
    fields = record("conversation", "tiny-000", "fp32", {})
    return Record.of(fields | {"arms": turns[-1]["arms"], "comparisons": turns[-1]["comparisons"], "turns": turns})


@pytest.fixture(scope="module")
def gates(repo):
    return load_contract(repo / "contracts" / "cpu-tiny-vllm.yaml").gates


@pytest.mark.parametrize(("rec", "outcome", "says"), [
    pytest.param(_record((32, 0), (64, 32)), "pass", "", id="every-hit-covers-decoded-blocks"),
    pytest.param(_record((32, 32), (64, 32)), "recorded", "at turn 2: vacuous session hit: the engine reused 32",
                 id="hit-over-the-prefilled-blocks-only"),
    pytest.param(_record((0, 0), (0, 32)), "recorded", "at turn 3: vacuous session hit: the engine reused 0",
                 id="no-prefix-cache"),
    # fp32 divergence is a failure where it is judged, and never judged at a vacuous turn
    pytest.param(_record((32, 0, 0, False)), "fail", "assistant turns diverge (turn 2", id="judged-divergence"),
    pytest.param(_record((32, 32, 0, False)), "recorded", "vacuous session hit", id="vacuous-divergence-not-judged"),
    pytest.param(_record((32, 0, 32)), "fail", "turn 2 replay read 32 tokens", id="stale-replay"),
])
def test_a_session_turn_counts_only_where_its_hit_covers_decoded_blocks(gates, rec, outcome, says):
    judgement = gates.conversation_turns(rec, "session~replay")
    assert judgement.outcome == outcome, judgement
    assert says in judgement.message, judgement.message


def test_a_turn_one_session_that_read_the_cache_fails_the_control(gates):
    judgement = gates.conversation_control(_record((32, 0), first_cached=32))
    assert judgement.outcome == "fail" and "turn 1 session read 32 tokens" in judgement.message, judgement


def test_a_backend_without_counters_is_judged_as_before(gates):
    """The Hugging Face backend keeps no counters: no served, no prefix_hit, nothing vacuous."""
    fields = _record((32, 0)).to_json()
    for turn in fields["turns"]:
        turn.pop("prefix_hit", None)
        for arm in turn["arms"].values():
            arm.pop("served")
    for arm in fields["arms"].values():
        arm.pop("served")
    assert gates.conversation_turns(Record.from_json(fields), "session~replay").outcome == "pass"
    assert gates.conversation_control(Record.from_json(fields)).outcome == "pass"
