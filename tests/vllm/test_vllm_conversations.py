"""The conversation family on the vLLM backend (engine/vllm/conversation.py), end to end.

- The suite's run (`vllm_run`: three conversations of the tiny causal bank, both precisions) and a run of SmolLM2's
  first two conversations at BF16 carry every turn's constructions with the engine's own counters, and each
  session hit is exactly the one vLLM owes a chat server: every full block the turns before it computed, the
  previous assistant turn's decoded tokens included (SGLang PR #16521's radix cache reused none of them). A hit
  that reaches no block written while the previous turn decoded is vacuous, and the conformance run says so
  instead of passing it.
- The must-fail control: the same conversation on an engine without a prefix cache reads nothing at any turn, and
  every session pair after turn 1 is reported vacuous, never passed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (bash tools/install-vllm.sh; docs/vllm.md)")

from vllm_runs import CONTRACT, _records, _run

BLOCK = 32  # runtime.vllm.block_size of contracts/cpu-tiny-vllm.yaml and cpu-smollm2-vllm.yaml
SESSION_PAIRS = ("session~replay", "session~incremental", "session~rerendered")


def owed_hit(turns: list[dict], k: int, block: int = BLOCK) -> int:
    """The prefix hit a chat server owes session turn k (1-based, k >= 2): every full block of what the session
    computed so far (turn k-1's prompt and its assistant turn but the closer, chosen and never fed), below turn k's
    last prompt token (which the engine always computes)."""
    previous, this = turns[k - 2], turns[k - 1]
    computed = previous["history_len"] + len(previous["arms"]["session"]["suffix"]) - 1
    return min(computed // block, (this["history_len"] - 1) // block) * block


def _outcomes(proc, test: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if f"::{test}[" in line
            and line.startswith(("PASSED", "XFAIL", "XPASS", "FAILED", "ERROR"))]


def _check_counters(records: list[dict]) -> list[tuple[str, str, int]]:
    """Every turn's counters against the block arithmetic; the (row, precision, turn) whose hit covers decode."""
    covered = []
    for record in records:
        where = f"{record['row']} {record['precision']}"
        turns = record["turns"]
        assert len(turns) >= 3, f"{where}: {len(turns)} turns"
        for t in turns:
            served = {arm: a["served"]["cached_tokens"] for arm, a in t["arms"].items()}
            cold = {arm: n for arm, n in served.items() if n and (t["turn"] == 1 or not arm.startswith("session"))}
            assert not cold, f"{where} turn {t['turn']}: requests on an emptied prefix cache read from it: {cold}"
            if t["turn"] == 1:
                assert t.get("prefix_hit") is None, f"{where}: turn 1 records a hit"
                continue
            hit, owed = t["prefix_hit"], owed_hit(turns, t["turn"])
            assert hit["cached_tokens"] == served["session"] == served["session_replica"] == owed, (
                f"{where} turn {t['turn']}: the engine reused {served['session']} (replica {served['session_replica']})"
                f" tokens, a server owes {owed}: {hit}")
            assert hit["prompt_block_tokens"] == turns[t["turn"] - 2]["history_len"] // BLOCK * BLOCK, (where, hit)
            assert hit["covers_decode"] == (hit["cached_tokens"] > hit["prompt_block_tokens"]), (where, hit)
            if hit["covers_decode"]:
                covered.append((record["row"], record["precision"], t["turn"]))
    return covered


def _check_vacuous_reported(proc, records: list[dict]) -> None:
    """Every session pair at a turn whose hit is vacuous: an expected failure naming the turn, never a pass."""
    for record in records:
        vacuous = [t["turn"] for t in record["turns"][1:] if not t["prefix_hit"]["covers_decode"]]
        for pair in SESSION_PAIRS:
            test = f"test_conversation_turns[{record['precision']}-{record['row']}-{pair}]"
            lines = [line for line in _outcomes(proc, "test_conversation_turns") if test in line]
            assert len(lines) == 1, (test, lines)
            for turn in vacuous:
                assert lines[0].startswith("XFAIL") and f"at turn {turn}: vacuous session hit" in lines[0], lines[0]


def test_every_session_hit_is_the_one_a_server_owes_and_covers_decoded_blocks(vllm_run):
    proc, run = vllm_run
    records = _records(run, "conversation")
    assert len(records) == 6 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    covered = _check_counters(records)
    assert covered, "no session hit reached a block written while the previous turn decoded"
    # the natural vacuous case: a hit over the user turns' blocks only (the previous assistant turn completed no
    # block), counted by the engine and reported as vacuous, not passed
    user_blocks_only = [(r["row"], r["precision"], t["turn"]) for r in records for t in r["turns"][1:]
                        if t["prefix_hit"]["cached_tokens"] and not t["prefix_hit"]["covers_decode"]]
    assert user_blocks_only, "no turn's hit covered the user turns' blocks only: the vacuous case went unseen"
    _check_vacuous_reported(proc, records)


def test_the_conversation_constructions_are_replica_exact_and_the_turn_one_control_holds(vllm_run):
    proc, run = vllm_run
    assert proc.returncode == 0, proc.stdout[-4000:]
    for test in ("test_replica_exact", "test_conversation_control"):
        lines = [line for line in _outcomes(proc, test) if test != "test_replica_exact" or "-conversation-" in line]
        assert len(lines) == (6 * 4 if test == "test_replica_exact" else 6), (test, lines)
        assert all(line.startswith("PASSED") for line in lines), [line for line in lines if "PASSED" not in line]
    for record in _records(run, "conversation"):
        # the turn-1 session is one cold request over user turn 1, as the replay: the same logits bit for bit
        control = record["turns"][0]["comparisons"]["session~replay"]
        assert control["logits_exact"] and control["suffix_equal"], (record["row"], record["precision"], control)


@pytest.fixture(scope="module")
def no_prefix_cache(tmp_path_factory):
    """The must-fail control: one conversation at FP32 on an engine without a prefix cache."""
    root, contract = tmp_path_factory.mktemp("nocache"), tmp_path_factory.mktemp("contract") / "nocache.yaml"
    contract.write_text(f"extends: {CONTRACT}\nname: cpu-tiny-vllm-nocache\n"
                        "runtime: {vllm: {prefix_caching: false}}\n")
    return _run(root, "nocache", "--rows", "1", "--precision", "fp32", "-k", "conversation", contract=contract)


def test_a_session_without_a_prefix_cache_is_reported_vacuous_never_passed(no_prefix_cache):
    proc, run = no_prefix_cache
    assert proc.returncode == 0, proc.stdout[-4000:]
    records = _records(run, "conversation")
    assert len(records) == 1 and records[0]["status"] == "ok", [r.get("reason") for r in records]
    hits = [t["prefix_hit"] for t in records[0]["turns"][1:]]
    assert hits and all(h["cached_tokens"] == 0 and not h["covers_decode"] for h in hits), hits
    lines = _outcomes(proc, "test_conversation_turns")
    session = [line for line in lines if any(f"-{pair}]" in line for pair in SESSION_PAIRS)]
    assert len(session) == 3 and not [line for line in session if not line.startswith("XFAIL")], session
    _check_vacuous_reported(proc, records)


def test_smollm2_sessions_reuse_every_decoded_block(smollm2_conversations):
    proc, run = smollm2_conversations
    assert proc.returncode == 0, f"the SmolLM2 vLLM run failed:\n{proc.stdout[-4000:]}"
    records = _records(run, "conversation")
    assert len(records) == 1 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    assert _check_counters(records), "no session hit reached a block written while the previous turn decoded"
    _check_vacuous_reported(proc, records)
