"""replaytests.inputs.bank: reading and validating frozen prefix banks and their manifests (docs/protocol.md §10)."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from replaytests.errors import BankError, ConfigError
from replaytests.files import sha256_file
from replaytests.inputs.bank import manifest_path, read_bank
from replaytests.inputs.integrity import verify_inputs

MAX_POSITIONS = 1024  # the tiny model's max_position_embeddings


@pytest.fixture
def room(tiny_contract) -> int:
    return tiny_contract.caps.suffix_room()


@pytest.fixture
def row(bank_rows_json) -> dict:
    """A valid row of the committed bank (the first, 123 tokens), to break one field at a time."""
    return copy.deepcopy(bank_rows_json[0])


def write_bank(tmp_path, rows: list[dict | str], name: str = "bank.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def read(path, grammar, room, max_positions=MAX_POSITIONS):
    return read_bank(path, grammar, max_positions, room)


def one_line(info) -> None:
    assert "\n" not in str(info.value), f"{type(info.value).__name__} spans lines: {info.value!s}"


# ---------------------------------------------------------------------------------------------
# The committed default bank


def test_committed_bank_reads_cleanly(repo, tiny_grammar, room):
    rows = read(repo / "fixtures" / "banks" / "tiny.jsonl", tiny_grammar, room)
    assert len(rows) == 48, f"committed bank has {len(rows)} rows, expected 48"
    assert len({r.id for r in rows}) == 48, "committed bank has duplicate ids"
    lengths = sorted(r.prefix_len for r in rows)
    assert lengths[-1] - lengths[0] >= 200, f"prefix lengths span only {lengths[0]}..{lengths[-1]}"
    assert len(set(lengths)) >= 24, f"only {len(set(lengths))} distinct prefix lengths among 48 rows: {lengths}"
    quartiles = [lengths[i] for i in (0, 12, 24, 36, 47)]
    assert quartiles == sorted(set(quartiles)), f"prefix lengths bunch up: quartiles {quartiles}"
    assert all(r.expected_answer for r in rows), "a committed row has no expected answer"


def test_committed_manifest_matches_the_bank(repo, bank_rows_json):
    bank = repo / "fixtures" / "banks" / "tiny.jsonl"
    manifest = check_manifest(bank)
    lengths = [len(r["tokens"]) for r in bank_rows_json]
    got = (manifest["rows"], manifest["prefix_len"], manifest["bank"], manifest["precision"])
    expected = (48, {"min": min(lengths), "max": max(lengths)}, "tiny.jsonl", "bf16")
    assert got == expected, f"manifest (rows, prefix_len, bank, precision) {got}, expected {expected}"
    assert manifest["bank_sha256"] == sha256_file(bank), "manifest bank_sha256 is not the bank's sha256"


def test_prefix_len_field_agrees_with_tokens(bank_rows_json):
    wrong = [r["id"] for r in bank_rows_json if r["prefix_len"] != len(r["tokens"])]
    assert not wrong, f"rows whose 'prefix_len' differs from len(tokens): {wrong}"


# ---------------------------------------------------------------------------------------------
# Broken rows: one-line BankError naming file:line, row and field


def test_invalid_json_line_names_file_and_line(tmp_path, tiny_grammar, room, row):
    path = write_bank(tmp_path, [row, '{"id": "x", "tokens": [1, 2'])
    with pytest.raises(BankError, match=rf"^{re.escape(str(path))}:2: not valid JSON \(.+ at column \d+\)$") as info:
        read(path, tiny_grammar, room)
    one_line(info)


@pytest.mark.parametrize(("content", "pattern"), [
    pytest.param(["[1, 2]"], r":1: expected a JSON object per line, got list$", id="array-line"),
    pytest.param(["", "  "], r": no bank rows$", id="only-blank-lines"),
])
def test_not_a_bank(tmp_path, tiny_grammar, room, content, pattern):
    path = write_bank(tmp_path, content)
    with pytest.raises(BankError, match=pattern) as info:
        read(path, tiny_grammar, room)
    one_line(info)


def test_missing_bank_file(tmp_path, tiny_grammar, room):
    with pytest.raises(BankError, match=r"gone\.jsonl: cannot read bank: No such file or directory$"):
        read(tmp_path / "gone.jsonl", tiny_grammar, room)


@pytest.mark.parametrize("field", ["tokens", "roles", "id"])
def test_missing_field_is_named(tmp_path, tiny_grammar, room, row, field):
    del row[field]
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=rf"^{re.escape(str(path))}:1( \(row tiny-000\))?: missing field '{field}'$"):
        read(path, tiny_grammar, room)


@pytest.mark.parametrize(("field", "value", "pattern"), [
    pytest.param("tokens", "257 258", r"field 'tokens' has type str", id="tokens-string"),
    pytest.param("roles", None, r"field 'roles' has type NoneType", id="roles-null"),
    pytest.param("id", ["a"], r"field 'id' has type list", id="id-list"),
    pytest.param("tokens", [257, 1.5], r"fields 'tokens' and 'roles' must hold integers only$", id="tokens-float"),
    pytest.param("roles", [0, True], r"fields 'tokens' and 'roles' must hold integers only$", id="roles-bool"),
])
def test_wrong_field_type(tmp_path, tiny_grammar, room, row, field, value, pattern):
    row[field] = value
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=pattern) as info:
        read(path, tiny_grammar, room)
    one_line(info)


def _set_role(index, value):
    def apply(roles):
        roles[index] = value
        return roles
    return apply


@pytest.mark.parametrize(("edit", "pattern"), [
    pytest.param(_set_role(122, 3), r"field 'roles'\[122\] is 3, the block grammar gives 4$", id="merge-role-wrong"),
    pytest.param(_set_role(20, 0), r"field 'roles'\[20\] is 0, the block grammar gives 1$", id="opener-role-wrong"),
    pytest.param(_set_role(0, 5), r"field 'roles'\[0\] is 5, the block grammar gives 0$", id="first-role-wrong"),
    pytest.param(lambda r: r[:-1], r"field 'roles'\[122\] is missing, the block grammar gives 4$", id="roles-short"),
    pytest.param(lambda r: [*r, 4], r"field 'roles'\[123\] is 4, the block grammar gives nothing", id="roles-long"),
])
def test_roles_that_do_not_match_the_grammar(tmp_path, tiny_grammar, room, row, edit, pattern):
    assert row["roles"][20] == 1 and row["roles"][19] == 0, "fixture: row 0's prompt block ends at index 19"
    row["roles"] = edit(row["roles"])
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=rf"^{re.escape(str(path))}:1 \(row tiny-000\): " + pattern) as info:
        read(path, tiny_grammar, room)
    one_line(info)


def _set_token(index, spec):
    def apply(tokens, tok):
        tokens[index] = tok(spec)
        return tokens
    return apply


@pytest.mark.parametrize(("edit", "pattern"), [
    pytest.param(_set_token(25, "<|cot_2|>"), r"field 'tokens'\[25\]: token \d+ is not allowed in block 'cot_1'",
                 id="opener-inside-branch"),
    pytest.param(_set_token(3, "<|/cot_3|>"), r"field 'tokens'\[3\]: token \d+ is not allowed in block 'prompt'",
                 id="delimiter-inside-prompt"),
    pytest.param(_set_token(0, 100), r"field 'tokens'\[0\]: token 100 where the grammar expects opener",
                 id="no-prompt-opener"),
    pytest.param(_set_token(1, 10**6), r"field 'tokens'\[1\]: token 1000000 is not allowed in block 'prompt'",
                 id="id-past-the-vocabulary"),
    pytest.param(_set_token(30, 300), r"field 'tokens'\[30\]: token 300 is not allowed in block 'cot_1'",
                 id="id-past-the-tokenizer-in-branch"),
    pytest.param(lambda t, tok: t[:-1], r"field 'tokens' must end with the single <\|merge\|> opener",
                 id="no-merge-opener"),
    pytest.param(lambda t, tok: [*t, 100], r"field 'tokens' must end with the single <\|merge\|> opener",
                 id="past-the-boundary"),
])
def test_tokens_that_break_the_grammar(tmp_path, tiny_grammar, tok, room, row, edit, pattern):
    row["tokens"] = edit(row["tokens"], tok)
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=rf"^{re.escape(str(path))}:1 \(row tiny-000\): " + pattern) as info:
        read(path, tiny_grammar, room)
    one_line(info)


def test_branch_over_the_contract_cap(tmp_path, tiny_grammar, room, row):
    # cot_1 of row 0 spans indices 20 (opener) .. 53 (closer) with 32 = cap content tokens; one more breaks it.
    assert row["roles"][20:54] == [1] * 34, "fixture: row 0's cot_1 block is not at 20..53"
    row["tokens"].insert(53, 100)
    row["roles"].insert(53, 1)
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=r"field 'tokens'\[53\]: token 100 is not allowed in block 'cot_1' "
                                        r"after 32 content tokens \(cap 32\)$"):
        read(path, tiny_grammar, room)


@pytest.mark.parametrize(("slack", "fits"), [pytest.param(0, True, id="exactly-fits"),
                                            pytest.param(-1, False, id="one-too-long")])
def test_prefix_plus_suffix_room_must_fit_the_positions(tmp_path, tiny_grammar, room, row, slack, fits):
    path = write_bank(tmp_path, [row])
    max_positions = len(row["tokens"]) + room + slack
    if fits:
        rows = read(path, tiny_grammar, room, max_positions)
        assert rows[0].tokens == row["tokens"], "row tokens changed on reading"
    else:
        with pytest.raises(BankError, match=rf"\(row tiny-000\): field 'tokens' has 123 tokens; with room for the "
                                            rf"suffix \({room}\) that exceeds the model's {max_positions} positions$"):
            read(path, tiny_grammar, room, max_positions)


def test_a_prefix_too_long_for_the_tiny_model(tmp_path, tiny_grammar, room, row):
    # A 1000-token prompt is grammatical (the prompt has no cap) but cannot fit 1024 positions with a suffix.
    prompt_end = row["roles"].index(1)
    row["tokens"] = [row["tokens"][0], *([100] * 1000), *row["tokens"][prompt_end - 1:]]
    row["roles"] = [0] * 1001 + row["roles"][prompt_end - 1:]
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=rf"field 'tokens' has {len(row['tokens'])} tokens; .* exceeds the model's "
                                        rf"1024 positions$"):
        read(path, tiny_grammar, room)


@pytest.mark.parametrize("second_id", [pytest.param("tiny-000", id="same-string"),
                                       pytest.param(7, id="int-and-string")])
def test_duplicate_ids(tmp_path, tiny_grammar, room, row, second_id):
    first = dict(row, id="7" if second_id == 7 else row["id"])
    path = write_bank(tmp_path, [first, dict(row, id=second_id)])
    with pytest.raises(BankError, match=rf"^{re.escape(str(path))}: duplicate row id '{first['id']}'$"):
        read(path, tiny_grammar, room)


def test_expected_answer_must_be_a_string(tmp_path, tiny_grammar, room, row):
    # crossing.is_correct calls .strip() on it: a number here crashes the run instead of failing the read.
    row["expected_answer"] = 1303
    path = write_bank(tmp_path, [row])
    with pytest.raises(BankError, match=r"\(row tiny-000\): field 'expected_answer'"):
        read(path, tiny_grammar, room)


def test_non_utf8_bank_is_a_bank_error(tmp_path, tiny_grammar, room):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(BankError, match=r"latin1\.jsonl"):
        read(path, tiny_grammar, room)


# ---------------------------------------------------------------------------------------------
# the manifest as a run checks it (integrity.verify_inputs: the bank first, before any model hashing)


REPO = Path(__file__).resolve().parents[2]
COMMITTED_MANIFEST = REPO / "fixtures" / "banks" / "tiny.manifest.json"
DELIMITER_IDS = json.loads(COMMITTED_MANIFEST.read_text())["tokenizer"]["delimiter_ids"]


def check_manifest(bank: Path) -> dict:
    return verify_inputs(bank, REPO / "fixtures" / "models" / "tiny-qwen2", DELIMITER_IDS).manifest


@pytest.fixture
def bank_copy(tmp_path, repo):
    """The committed bank and its manifest, copied side by side into tmp_path."""
    src = repo / "fixtures" / "banks" / "tiny.jsonl"
    shutil.copy(src, tmp_path / "tiny.jsonl")
    shutil.copy(manifest_path(src), tmp_path / "tiny.manifest.json")
    return tmp_path / "tiny.jsonl"


def test_manifest_of_an_unchanged_copy_passes(bank_copy):
    manifest = check_manifest(bank_copy)
    assert manifest["bank_sha256"] == sha256_file(bank_copy), "check_manifest returned another manifest"


@pytest.mark.parametrize("where", [pytest.param("answer", id="expected-answer-digit"),
                                   pytest.param("token", id="token-digit")])
def test_manifest_refuses_a_bank_edited_by_one_byte(bank_copy, where):
    data = bytearray(bank_copy.read_bytes())
    offset = data.index(b'"1303"') + 4 if where == "answer" else data.index(b'"tokens": [257, 5') + 16
    data[offset] = ord("9") if data[offset] != ord("9") else ord("8")
    bank_copy.write_bytes(bytes(data))
    recorded = json.loads(manifest_path(bank_copy).read_text())["bank_sha256"]
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(bank_copy))}: bank sha256 {sha256_file(bank_copy)[:12]}… "
                                          rf"differs from manifest field 'bank_sha256' {recorded[:12]}…; "
                                          r"the bank changed since it was frozen; refused"):
        check_manifest(bank_copy)


def test_missing_manifest(bank_copy):
    manifest_path(bank_copy).unlink()
    with pytest.raises(ConfigError, match=r"tiny\.manifest\.json: bank manifest not found \(freeze the bank with "
                                          r"`replaytests freeze`\)$"):
        check_manifest(bank_copy)


def test_manifest_not_json(bank_copy):
    manifest_path(bank_copy).write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError,
                       match=r"tiny\.manifest\.json: cannot read bank manifest: not valid JSON \(.+ at line 1\)$"):
        check_manifest(bank_copy)


def test_manifest_present_but_bank_missing(bank_copy):
    bank_copy.unlink()
    with pytest.raises(ConfigError, match=re.escape(str(bank_copy))):
        check_manifest(bank_copy)


def test_manifest_that_is_not_an_object(bank_copy):
    manifest_path(bank_copy).write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"tiny\.manifest\.json"):
        check_manifest(bank_copy)
