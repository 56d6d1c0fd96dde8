"""replaytests.engine.protocol: the visibility contract, the structural mask, the grammar cursor (protocol.md §2)."""

from __future__ import annotations

import re

import pytest
import torch

from replaytests.engine.protocol import (
    ANSWER,
    BLOCKS,
    DELIMITER_NAMES,
    MERGE,
    VISIBILITY,
    Cursor,
    Delimiters,
    Grammar,
    Visibility,
    answer_ids,
    parse_prefix,
    visibility_rows,
)
from replaytests.errors import BankError, ConfigError

CONTENT = 100  # an ordinary byte-level token of the tiny tokenizer
PAST_TOKENIZER = 300  # an embedding row the tokenizer never produces (tokenizer 269 < vocab 320)
VOCAB = 320

# docs/protocol.md §2, written out independently of protocol.VISIBILITY: query role -> visible key roles.
SPEC_VISIBLE = {
    0: {0},
    1: {0, 1},
    2: {0, 2},
    3: {0, 3},
    4: {0, 1, 2, 3, 4},
    5: {0, 4, 5},
}
ROLE_NAMES = {0: "prompt", 1: "branch1", 2: "branch2", 3: "branch3", 4: "merge", 5: "answer"}

# A full flattened sequence's roles: prompt 3, each branch 2-3, merge 3, answer 3 (delimiters included).
SEQUENCE_ROLES = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]


def expected_mask(roles: list[int], first_query: int, n_queries: int) -> torch.Tensor:
    """The mask of docs/protocol.md §2 by brute force: role visibility AND key position <= query position."""
    return torch.tensor([
        [roles[k] in SPEC_VISIBLE[roles[q]] and k <= q for k in range(len(roles))]
        for q in range(first_query, first_query + n_queries)
    ])


def mismatches(actual: torch.Tensor, expected: torch.Tensor, first_query: int = 0) -> list[tuple[int, int]]:
    return [(first_query + q, k) for q, k in (actual != expected).nonzero().tolist()]


# ---------------------------------------------------------------------------------------------
# Visibility contract


@pytest.mark.parametrize("query_role", [pytest.param(r, id=f"query={ROLE_NAMES[r]}") for r in range(6)])
def test_visibility_table_row_matches_spec(query_role):
    visible = {k for k in range(6) if VISIBILITY[query_role, k]}
    assert visible == SPEC_VISIBLE[query_role], (
        f"VISIBILITY row for query role {ROLE_NAMES[query_role]}: sees roles {sorted(visible)}, "
        f"docs/protocol.md §2 says {sorted(SPEC_VISIBLE[query_role])}"
    )


@pytest.mark.parametrize("branch", [pytest.param(b, id=f"branch{b}") for b in (1, 2, 3)])
def test_answer_never_sees_a_branch(branch):
    roles = torch.tensor(SEQUENCE_ROLES)
    mask = visibility_rows(roles, roles, 0)
    answer_rows = (roles == 5).nonzero().flatten()
    branch_cols = (roles == branch).nonzero().flatten()
    seen = mask[answer_rows][:, branch_cols]
    assert not seen.any(), (
        f"answer queries at positions {answer_rows.tolist()} see branch {branch} keys at "
        f"{branch_cols[seen.any(0)].tolist()}"
    )


@pytest.mark.parametrize(("branch", "other"), [
    pytest.param(2, 1, id="branch2-not-branch1"),
    pytest.param(3, 1, id="branch3-not-branch1"),
    pytest.param(3, 2, id="branch3-not-branch2"),
])
def test_branch_never_sees_an_earlier_branch(branch, other):
    roles = torch.tensor(SEQUENCE_ROLES)
    mask = visibility_rows(roles, roles, 0)
    rows, cols = (roles == branch).nonzero().flatten(), (roles == other).nonzero().flatten()
    assert not mask[rows][:, cols].any(), f"branch {branch} queries see earlier branch {other} keys"


@pytest.mark.parametrize("role", [pytest.param(r, id=ROLE_NAMES[r]) for r in range(6)])
def test_each_role_sees_its_own_earlier_tokens_and_the_prompt(role):
    roles = torch.tensor(SEQUENCE_ROLES)
    mask = visibility_rows(roles, roles, 0)
    last = int((roles == role).nonzero().max())
    own = (roles == role).nonzero().flatten()
    prompt = (roles == 0).nonzero().flatten()
    assert mask[last, own].all(), f"the last {ROLE_NAMES[role]} token (position {last}) misses its own block"
    assert mask[last, prompt].all(), f"the last {ROLE_NAMES[role]} token (position {last}) misses the prompt"


def test_full_mask_is_role_visibility_intersected_with_causality():
    roles = torch.tensor(SEQUENCE_ROLES)
    mask = visibility_rows(roles, roles, 0)
    expected = expected_mask(SEQUENCE_ROLES, 0, len(SEQUENCE_ROLES))
    assert mask.shape == expected.shape, f"mask shape {tuple(mask.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(mask, expected), f"mask differs from protocol.md §2 at (query, key) {mismatches(mask, expected)}"


def test_no_key_after_the_query_is_ever_visible():
    # Within the prompt (or within one block) roles allow everything: only causality forbids the future.
    roles = torch.tensor(SEQUENCE_ROLES)
    mask = visibility_rows(roles, roles, 0)
    future = mask.triu(diagonal=1)
    assert not future.any(), f"keys after the query position are visible at {future.nonzero().tolist()}"


@pytest.mark.parametrize("query_pos", [
    pytest.param(2, id="prompt-token"),
    pytest.param(8, id="branch2-token"),
    pytest.param(14, id="merge-token"),
    pytest.param(len(SEQUENCE_ROLES) - 1, id="last-answer-token"),
])
def test_decode_step_is_one_row_of_the_full_mask(query_pos):
    roles = torch.tensor(SEQUENCE_ROLES)
    keys = roles[: query_pos + 1]
    row = visibility_rows(roles[query_pos: query_pos + 1], keys, query_pos)
    assert row.shape == (1, query_pos + 1), f"decode-step mask shape {tuple(row.shape)}, expected (1, {query_pos + 1})"
    expected = expected_mask(SEQUENCE_ROLES[: query_pos + 1], query_pos, 1)
    assert torch.equal(row, expected), f"decode step at {query_pos}: differs at {mismatches(row, expected, query_pos)}"


def test_decode_step_hides_keys_past_the_query_position():
    # Keys handed in beyond the query position (e.g. a preallocated role buffer) stay invisible.
    roles = torch.tensor(SEQUENCE_ROLES)
    row = visibility_rows(roles[5:6], roles, 5)
    assert row.shape == (1, len(SEQUENCE_ROLES)), f"decode-step mask shape {tuple(row.shape)}"
    assert not row[0, 6:].any(), f"query at 5 sees later keys {(row[0, 6:].nonzero().flatten() + 6).tolist()}"


@pytest.mark.parametrize(("start", "end"), [
    pytest.param(0, 3, id="prompt-block-call"),
    pytest.param(3, 13, id="middle-chunk"),
    pytest.param(0, len(SEQUENCE_ROLES), id="whole-sequence"),
])
def test_chunk_of_queries_matches_those_rows(start, end):
    roles = torch.tensor(SEQUENCE_ROLES)
    chunk = visibility_rows(roles[start:end], roles[:end], start)
    expected = expected_mask(SEQUENCE_ROLES[:end], start, end - start)
    assert torch.equal(chunk, expected), f"queries {start}..{end - 1}: differ at {mismatches(chunk, expected, start)}"


@pytest.mark.parametrize("chunks", [
    pytest.param([3] + [1] * (len(SEQUENCE_ROLES) - 3), id="prompt-block-then-one-per-call"),
    pytest.param([len(SEQUENCE_ROLES)], id="one-call"),
    pytest.param([5, 1, 7, 1, 5], id="mixed"),
])
def test_incremental_visibility_gives_the_reference_mask(chunks):
    # Visibility writes one column per token and hands out views: each call's 4D mask must be, in every
    # physical-batch copy, exactly visibility_rows for that call's queries.
    roles, visibility, start = torch.tensor(SEQUENCE_ROLES), Visibility(len(SEQUENCE_ROLES) + 4, 2, "cpu"), 0
    for size in chunks:
        end = start + size
        visibility.extend(SEQUENCE_ROLES[start:end])
        mask = visibility.mask(SEQUENCE_ROLES[start:end], start)
        expected = visibility_rows(roles[start:end], roles[:end], start)
        assert mask.shape == (2, 1, size, end), f"call at {start}: mask shape {tuple(mask.shape)}"
        for copy in range(2):
            assert torch.equal(mask[copy, 0], expected), (
                f"call at {start}, copy {copy}: differs at {mismatches(mask[copy, 0], expected, start)}")
        start = end


# ---------------------------------------------------------------------------------------------
# Grammar.eligible: the structural logits mask


def allowed_ids(mask: torch.Tensor) -> set[int]:
    return set(mask.nonzero().flatten().tolist())


@pytest.mark.parametrize("count_below_cap", [pytest.param(0, id="empty-block"), pytest.param(1, id="one-below-cap")])
@pytest.mark.parametrize("block", [pytest.param(b, id=BLOCKS[b]) for b in range(1, 6)])
def test_inside_block_under_cap_allows_content_and_own_closer(grammar, delims, tokenizer, banned, block,
                                                              count_below_cap):
    cap = grammar.caps.of(block)
    count = 0 if count_below_cap == 0 else cap - 1
    mask = grammar.eligible(Cursor(block=block, open=True, count=count))
    allowed = allowed_ids(mask)
    where = f"block {BLOCKS[block]!r} with {count}/{cap} content tokens"
    assert mask.dtype == torch.bool, f"{where}: mask dtype {mask.dtype}, expected torch.bool"
    assert mask.shape == grammar.content.shape, f"{where}: mask shape {tuple(mask.shape)}, expected vocab-long"
    closer = delims.closers[block]
    assert closer in allowed, f"{where}: own closer {closer} not eligible"
    other_delims = allowed & (set(delims.all_ids) - {closer})
    assert not other_delims, f"{where}: delimiters other than the closer eligible: {sorted(other_delims)}"
    past = {t for t in allowed if t >= len(tokenizer)}
    assert not past, f"{where}: ids past the tokenizer's size {len(tokenizer)} eligible: {sorted(past)[:10]}"
    assert not allowed & set(banned), f"{where}: banned tokens eligible: {sorted(allowed & set(banned))}"
    content = set(range(len(tokenizer))) - set(delims.all_ids) - set(banned)
    assert allowed == content | {closer}, (
        f"{where}: missing {sorted(content - allowed)[:10]}, extra {sorted(allowed - content - {closer})[:10]}"
    )


@pytest.mark.parametrize("block", [pytest.param(b, id=BLOCKS[b]) for b in range(1, 6)])
def test_at_cap_only_the_closer_is_eligible(grammar, delims, block):
    cap = grammar.caps.of(block)
    allowed = allowed_ids(grammar.eligible(Cursor(block=block, open=True, count=cap)))
    assert allowed == {delims.closers[block]}, (
        f"block {BLOCKS[block]!r} at cap {cap}: eligible {sorted(allowed)[:10]}, expected only closer "
        f"{delims.closers[block]}"
    )


@pytest.mark.parametrize("closed_block", [
    pytest.param(-1, id="before-prompt"),
    *(pytest.param(b, id=f"after-{BLOCKS[b]}") for b in range(5)),
])
def test_between_blocks_only_the_next_opener_is_eligible(grammar, delims, closed_block):
    allowed = allowed_ids(grammar.eligible(Cursor(block=closed_block, open=False)))
    opener = delims.openers[closed_block + 1]
    assert allowed == {opener}, (
        f"between blocks after {closed_block}: eligible {sorted(allowed)[:10]}, expected only opener {opener} "
        f"of {BLOCKS[closed_block + 1]!r}"
    )


def test_grammar_content_excludes_delimiters_banned_and_ids_past_the_tokenizer(grammar, delims, tokenizer, banned):
    excluded = set(range(grammar.content.shape[0])) - allowed_ids(grammar.content)
    expected = set(delims.all_ids) | set(banned) | set(range(len(tokenizer), grammar.content.shape[0]))
    assert excluded == expected, (
        f"non-content ids differ: extra {sorted(excluded - expected)}, missing {sorted(expected - excluded)}"
    )


@pytest.mark.parametrize("bad", [pytest.param(10**6, id="past-the-vocabulary"), pytest.param(-1, id="negative")])
def test_banned_token_outside_the_vocabulary_is_a_config_error(delims, unit_caps, tokenizer, bad):
    # A contract's banned_tokens reaches Grammar unchecked; -1 would silently ban the last id (319).
    with pytest.raises(ConfigError, match=rf"banned.*{bad}"):
        Grammar(delims, unit_caps, VOCAB, len(tokenizer), (bad,))


# ---------------------------------------------------------------------------------------------
# Cursor.advance


REJECTIONS = [
    # (cursor, token, message pattern after "token <id> ")
    pytest.param(dict(), "<|cot_1|>", r"where the grammar expects opener \d+ of 'prompt'", id="start-wrong-opener"),
    pytest.param(dict(), CONTENT, r"where the grammar expects opener \d+ of 'prompt'", id="start-content"),
    pytest.param(dict(block=0), "<|cot_2|>", r"where the grammar expects opener \d+ of 'cot_1'",
                 id="skips-a-branch"),
    pytest.param(dict(block=3), "<|answer|>", r"where the grammar expects opener \d+ of 'merge'",
                 id="answer-before-merge"),
    pytest.param(dict(block=1), CONTENT, r"where the grammar expects opener \d+ of 'cot_2'",
                 id="content-between-blocks"),
    pytest.param(dict(block=1, open=True), "<|cot_2|>",
                 r"is not allowed in block 'cot_1' after 0 content tokens \(cap 3\)", id="opener-inside-branch"),
    pytest.param(dict(block=2, open=True, count=1), "<|/cot_1|>",
                 r"is not allowed in block 'cot_2' after 1 content tokens \(cap 3\)", id="other-closer-in-branch"),
    pytest.param(dict(block=4, open=True), "<|merge|>",
                 r"is not allowed in block 'merge' after 0 content tokens \(cap 2\)", id="own-opener-inside-merge"),
    pytest.param(dict(block=0, open=True, count=2), "<|/cot_1|>",
                 r"is not allowed in block 'prompt' after 2 content tokens$", id="delimiter-inside-prompt"),
    pytest.param(dict(block=1, open=True, count=3), CONTENT,
                 r"is not allowed in block 'cot_1' after 3 content tokens \(cap 3\)", id="branch-over-cap"),
    pytest.param(dict(block=4, open=True, count=2), CONTENT,
                 r"is not allowed in block 'merge' after 2 content tokens \(cap 2\)", id="merge-over-cap"),
    pytest.param(dict(block=5, open=True, count=1), CONTENT,
                 r"is not allowed in block 'answer' after 1 content tokens \(cap 1\)", id="answer-over-cap"),
    pytest.param(dict(block=3, open=True), PAST_TOKENIZER,
                 r"is not allowed in block 'cot_3'", id="id-past-tokenizer-in-branch"),
    pytest.param(dict(block=3, open=True), 5, r"is not allowed in block 'cot_3'", id="banned-in-branch"),
    pytest.param(dict(block=5, open=True), -1, r"is not allowed in block 'answer'", id="negative-id"),
    pytest.param(dict(block=5), CONTENT, r"where the grammar expects nothing \(the answer is closed\)",
                 id="content-after-answer"),
    pytest.param(dict(block=5), "<|prompt|>", r"where the grammar expects nothing \(the answer is closed\)",
                 id="opener-after-answer"),
    pytest.param(dict(block=5), "<|/answer|>", r"where the grammar expects nothing \(the answer is closed\)",
                 id="closer-after-answer"),
]


@pytest.mark.parametrize(("state", "spec", "pattern"), REJECTIONS)
def test_advance_rejects(grammar, tok, state, spec, pattern):
    cursor = Cursor(**state)
    before = Cursor(**state)
    token = tok(spec)
    with pytest.raises(ValueError, match=re.escape(f"token {token} ") + pattern):
        cursor.advance(token, grammar)
    assert cursor == before, f"a rejected token {token} moved the cursor from {before} to {cursor}"


ACCEPTS = [
    pytest.param(dict(), "<|prompt|>", dict(block=0, open=True, count=0), id="opens-prompt"),
    pytest.param(dict(block=0, open=True), PAST_TOKENIZER, dict(block=0, open=True, count=1),
                 id="prompt-takes-any-non-delimiter"),
    pytest.param(dict(block=0, open=True, count=7), "<|/prompt|>", dict(block=0, open=False, count=7),
                 id="closes-prompt"),
    pytest.param(dict(block=0), "<|cot_1|>", dict(block=1, open=True, count=0), id="opens-cot_1"),
    pytest.param(dict(block=1, open=True, count=2), CONTENT, dict(block=1, open=True, count=3),
                 id="content-up-to-cap"),
    pytest.param(dict(block=1, open=True, count=3), "<|/cot_1|>", dict(block=1, open=False, count=3),
                 id="closer-at-cap"),
    pytest.param(dict(block=2, open=True), "<|/cot_2|>", dict(block=2, open=False, count=0), id="empty-branch"),
    pytest.param(dict(block=5, open=True, count=1), "<|/answer|>", dict(block=5, open=False, count=1),
                 id="closes-answer"),
]


@pytest.mark.parametrize(("state", "spec", "after"), ACCEPTS)
def test_advance_accepts(grammar, tok, state, spec, after):
    cursor = Cursor(**state)
    cursor.advance(tok(spec), grammar)
    assert cursor == Cursor(**after), f"after token {spec!r} from {state}: cursor {cursor}, expected {after}"


def test_cursor_is_done_only_after_the_answer_closer(grammar, tok):
    cursor = Cursor()
    sequence = ["<|prompt|>", CONTENT, "<|/prompt|>", "<|cot_1|>", "<|/cot_1|>", "<|cot_2|>", "<|/cot_2|>",
                "<|cot_3|>", "<|/cot_3|>", "<|merge|>", CONTENT, "<|/merge|>", "<|answer|>", CONTENT]
    for spec in sequence:
        cursor.advance(tok(spec), grammar)
    assert not cursor.done, f"cursor reports done inside the answer: {cursor}"
    cursor.advance(tok("<|/answer|>"), grammar)
    assert cursor.done, f"cursor not done after <|/answer|>: {cursor}"


# ---------------------------------------------------------------------------------------------
# parse_prefix


def spec_tokens(tok, specs) -> list[int]:
    return [tok(s) for s in specs]


P, EP, C1, EC1, C2, EC2, C3, EC3, M = (
    "<|prompt|>", "<|/prompt|>", "<|cot_1|>", "<|/cot_1|>", "<|cot_2|>", "<|/cot_2|>", "<|cot_3|>", "<|/cot_3|>",
    "<|merge|>",
)
X = CONTENT


@pytest.mark.parametrize(("specs", "roles"), [
    pytest.param([P, EP, C1, EC1, C2, EC2, C3, EC3, M], [0, 0, 1, 1, 2, 2, 3, 3, 4], id="empty-blocks"),
    pytest.param([P, X, X, EP, C1, X, EC1, C2, X, X, X, EC2, C3, EC3, M],
                 [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 4], id="with-content"),
    pytest.param([P, PAST_TOKENIZER, 5, EP, C1, EC1, C2, EC2, C3, X, EC3, M],
                 [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 4], id="prompt-with-any-non-delimiter"),
])
def test_parse_prefix_returns_roles(grammar, tok, specs, roles):
    got = parse_prefix(spec_tokens(tok, specs), grammar, "bank.jsonl:1")
    assert got == roles, f"roles {got}, expected {roles} (first difference at {_first_diff(got, roles)})"


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


@pytest.mark.parametrize(("specs", "index"), [
    pytest.param([X, P, EP], 0, id="starts-with-content"),
    pytest.param([P, EP, EP], 2, id="double-closer"),
    pytest.param([P, EP, C1, C2, EC2], 3, id="opener-inside-branch"),
    pytest.param([P, EP, C1, X, X, X, X, EC1], 6, id="branch-over-cap"),
    pytest.param([P, EP, C1, EC1, C3, EC3], 4, id="skips-branch-2"),
    pytest.param([P, EP, C1, EC1, C2, EC2, C3, EC3, M, M], 9, id="second-merge"),
    pytest.param([P, EP, C1, 5, EC1], 3, id="banned-in-branch"),
])
def test_parse_prefix_names_the_broken_index(grammar, tok, specs, index):
    message = f"bank.jsonl:3: field 'tokens'[{index}]: token {tok(specs[index])} "
    with pytest.raises(BankError, match="^" + re.escape(message)):
        parse_prefix(spec_tokens(tok, specs), grammar, "bank.jsonl:3")


@pytest.mark.parametrize("specs", [
    pytest.param([], id="empty"),
    pytest.param([P, X, EP], id="ends-after-prompt"),
    pytest.param([P, EP, C1, EC1, C2, X], id="ends-inside-branch-2"),
    pytest.param([P, EP, C1, EC1, C2, EC2, C3, EC3], id="ends-before-merge"),
    pytest.param([P, EP, C1, EC1, C2, EC2, C3, EC3, M, X], id="merge-content-after-boundary"),
    pytest.param([P, EP, C1, EC1, C2, EC2, C3, EC3, M, "<|/merge|>"], id="merge-closed"),
])
def test_parse_prefix_requires_ending_at_the_merge_opener(grammar, tok, specs):
    with pytest.raises(BankError, match=r"^bank\.jsonl:7: field 'tokens' must end with the single <\|merge\|> opener"):
        parse_prefix(spec_tokens(tok, specs), grammar, "bank.jsonl:7")


# ---------------------------------------------------------------------------------------------
# Delimiters.resolve


def test_resolve_gives_twelve_distinct_single_token_ids(tokenizer, delims):
    ids = list(delims.all_ids)
    assert len(set(ids)) == 12, f"delimiter ids not 12 distinct: {ids}"
    for block, name in enumerate(BLOCKS):
        opener = tokenizer.encode(f"<|{name}|>", add_special_tokens=False)
        assert [delims.openers[block]] == opener, f"opener of {name!r}: {delims.openers[block]} vs tokenizer {opener}"
        closer = tokenizer.encode(f"<|/{name}|>", add_special_tokens=False)
        assert [delims.closers[block]] == closer, f"closer of {name!r}: {delims.closers[block]} vs tokenizer {closer}"


def test_resolve_follows_a_contract_mapping_to_another_single_token(tokenizer):
    delims = Delimiters.resolve(tokenizer, {"<|answer|>": "a"})
    wanted = tokenizer.encode("a", add_special_tokens=False)
    assert [delims.openers[5]] == wanted, f"<|answer|> mapped to 'a' resolved to {delims.openers[5]}, expected {wanted}"


@pytest.mark.parametrize(("mapping", "pattern"), [
    pytest.param({"<|merge|>": "hello world"},
                 r"^delimiter '<\|merge\|>' \(as 'hello world'\) is 11 tokens \[.*\] in the tokenizer; "
                 r"every delimiter must be exactly one token$", id="multi-token-text"),
    pytest.param({"<|/answer|>": ""}, r"^delimiter '<\|/answer\|>' \(as ''\) is 0 tokens \[\]", id="empty-text"),
    pytest.param({"<|cot_2|>": "<|merge|><|merge|>"}, r"is 2 tokens", id="two-delimiters"),
    pytest.param({"<|cot_2|>": "<|cot_1|>"}, r"^delimiters must be 12 distinct tokens, got ids \[", id="duplicate"),
])
def test_resolve_rejects_bad_mappings(tokenizer, mapping, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        Delimiters.resolve(tokenizer, mapping)
    assert "\n" not in str(info.value), f"multi-line ConfigError: {info.value!s}"


class CharTokenizer:
    """A fake tokenizer: one token per character, except the names listed as single tokens."""

    def __init__(self, single: tuple[str, ...]) -> None:
        self.vocab = {name: 1000 + i for i, name in enumerate(single)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert add_special_tokens is False, "Delimiters.resolve must not add special tokens"
        return [self.vocab[text]] if text in self.vocab else [ord(c) for c in text]


def test_resolve_with_a_stock_vocabulary_missing_a_delimiter():
    fake = CharTokenizer(tuple(n for n in DELIMITER_NAMES if n != "<|/cot_3|>"))
    with pytest.raises(ConfigError, match=r"^delimiter '<\|/cot_3\|>' \(as '<\|/cot_3\|>'\) is 10 tokens"):
        Delimiters.resolve(fake)


def test_resolve_with_a_fake_tokenizer_maps_names_in_order():
    fake = CharTokenizer(DELIMITER_NAMES)
    delims = Delimiters.resolve(fake)
    assert delims.openers == tuple(range(1000, 1012, 2)), f"openers {delims.openers}"
    assert delims.closers == tuple(range(1001, 1012, 2)), f"closers {delims.closers}"


def test_answer_ids_are_the_answer_blocks_content_only(tiny_grammar):
    """The one reading of a suffix's answer every backend decodes: the merge's content and every delimiter
    are left out, the answer's content kept in order."""
    d = tiny_grammar.delims
    merge, answer = d.closers[MERGE], d.openers[ANSWER]
    content = [int(i) for i in tiny_grammar.content.nonzero().flatten()[:5]]
    suffix = [content[0], content[1], merge, answer, content[2], content[3], d.closers[ANSWER]]
    assert answer_ids(suffix, tiny_grammar) == [content[2], content[3]]
    with pytest.raises(ValueError):
        answer_ids([answer], tiny_grammar)  # the merge block is still open: the grammar forbids it
