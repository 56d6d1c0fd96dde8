"""The multi-branch reasoning protocol (docs/protocol.md §2): blocks, roles, visibility and the structural mask.

The flattened sequence has six ordered blocks, each opened and closed by a single-token delimiter.
A block's index is also the role of every token in it (prompt 0, branches 1-3, merge 4, answer 5).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from replaytests.errors import BankError, ConfigError
from replaytests.inputs.blocks import ANSWER, BLOCKS, DELIMITER_NAMES, MERGE, PROMPT, Caps

# VISIBILITY[query_role][key_role]: answer tokens never see branch tokens.
VISIBILITY = torch.tensor(
    [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ],
    dtype=torch.bool,
)
# The contract's protocol.visibility: the six-role visibility above, or every role seeing every earlier
# token (plain causal attention, what a serving engine without 4D masks runs; docs/contract.md).
VISIBILITIES = {"roles": VISIBILITY, "causal": torch.ones_like(VISIBILITY)}


@dataclass(frozen=True)
class Delimiters:
    """Token ids of the 12 delimiters: openers[b] and closers[b] for block b."""

    openers: tuple[int, ...]
    closers: tuple[int, ...]

    @classmethod
    def resolve(cls, tokenizer, mapping: dict[str, str] | None = None) -> Delimiters:
        """Resolve each delimiter name (or the token a contract maps it to) to one token id."""
        mapping = mapping or {}
        ids = []
        for name in DELIMITER_NAMES:
            text = mapping.get(name, name)
            encoded = tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) != 1:
                raise ConfigError(
                    f"delimiter {name!r} (as {text!r}) is {len(encoded)} tokens {encoded} in the "
                    "tokenizer; every delimiter must be exactly one token"
                )
            ids.append(encoded[0])
        if len(set(ids)) != len(ids):
            raise ConfigError(f"delimiters must be 12 distinct tokens, got ids {ids}")
        return cls(openers=tuple(ids[0::2]), closers=tuple(ids[1::2]))

    @property
    def all_ids(self) -> tuple[int, ...]:
        return self.openers + self.closers


def prompt_block(delims: Delimiters, content: list[int]) -> list[int]:
    return [delims.openers[PROMPT], *content, delims.closers[PROMPT]]


def prompt_of(z: list[int], delims: Delimiters) -> list[int]:
    """The prompt block that opens z, through its closing delimiter."""
    return z[: z.index(delims.closers[PROMPT]) + 1]


def companions(z: list[int], delims: Delimiters) -> list[list[int]]:
    """Two other requests of z's problem that a batched construction runs beside z, sharing no prefix
    with it: its prompt block with the content reversed (decoding beside z) and z with its prompt content
    reversed (a prefill of the same length)."""
    prompt = prompt_of(z, delims)
    flipped = [prompt[0], *reversed(prompt[1:-1]), prompt[-1]]
    return [flipped, flipped + z[len(prompt):]]


@functools.cache
def _visibility_on(device: torch.device, visibility: str) -> torch.Tensor:
    return VISIBILITIES[visibility].to(device)


def visibility_rows(query_roles: torch.Tensor, key_roles: torch.Tensor, first_query: int,
                    visibility: str = "roles") -> torch.Tensor:
    """Bool mask [q, k]: role visibility intersected with causality (key position <= query position).

    Queries sit at positions first_query .. first_query+q-1, keys at 0 .. k-1. The reference form of
    the mask: Visibility builds the same rows as the sequence grows, and the tests hold it to this.
    """
    visible = _visibility_on(key_roles.device, visibility)[query_roles][:, key_roles]
    return visible & _causal(first_query, len(query_roles), len(key_roles), key_roles.device)


def _causal(first_query: int, queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """Bool [queries, keys]: key position <= query position, for queries at first_query.."""
    query_pos = torch.arange(first_query, first_query + queries, device=device)
    return torch.arange(keys, device=device)[None, :] <= query_pos[:, None]


class Visibility:
    """The 4D mask of every call, kept as the sequence grows: column k says which query roles see key k
    (a column of VISIBILITY), so adding a token writes one column and a decode step's mask is a view of
    one row, O(1) new work per token (never a rebuilt O(k) gather, never an L x L mask). Masks come out
    as [batch, 1, q, k], every physical-batch copy the same row.
    """

    def __init__(self, capacity: int, batch: int, device: torch.device | str, visibility: str = "roles") -> None:
        self._columns = VISIBILITIES[visibility].t().contiguous().to(device)  # _columns[r]: query roles that see r
        self._column_of = list(self._columns)  # the same rows as separate tensors: no indexing per token
        self._seen_by = torch.zeros(len(BLOCKS), capacity, dtype=torch.bool, device=device)
        self._batched = self._seen_by.expand(batch, 1, *self._seen_by.shape)
        self.length = 0

    def extend(self, roles: list[int]) -> None:
        """Add keys with these roles at positions length, length + 1, ..."""
        start, self.length = self.length, self.length + len(roles)
        if len(roles) == 1:
            self._seen_by[:, start] = self._column_of[roles[0]]
        elif roles:
            self._seen_by[:, start:self.length] = self._columns[torch.tensor(roles, device=self._columns.device)].t()

    def mask(self, query_roles: list[int], first_query: int) -> torch.Tensor:
        """Bool mask [batch, 1, q, k] for queries at first_query.., keys 0 .. first_query+q-1 (all added
        already): role visibility intersected with causality, each copy's [q, k] as visibility_rows gives it."""
        end = first_query + len(query_roles)
        if len(query_roles) == 1:  # a decode step: its one query is the last key, so causality removes nothing
            role = query_roles[0]
            return self._batched[:, :, role:role + 1, :end]
        roles = torch.tensor(query_roles, device=self._seen_by.device)
        rows = self._seen_by[roles, :end] & _causal(first_query, len(query_roles), end, roles.device)
        return rows.expand(self._batched.shape[0], 1, *rows.shape)


class Grammar:
    """The block grammar and the structural logits mask, precomputed once per (vocab, caps).

    Inside a block the eligible tokens are every content token plus the block's closer, or only
    the closer once the block holds `cap` content tokens; between blocks only the next opener.
    """

    def __init__(self, delims: Delimiters, caps: Caps, vocab_size: int, tokenizer_size: int,
                 banned: tuple[int, ...] = (), device: torch.device | str = "cpu") -> None:
        self.delims, self.caps = delims, caps
        content = torch.zeros(vocab_size, dtype=torch.bool)
        content[: min(tokenizer_size, vocab_size)] = True
        content[list(delims.all_ids)] = False
        outside = [t for t in banned if not 0 <= t < vocab_size]
        if outside:
            raise ConfigError(f"banned_tokens: ids {outside} are outside the vocabulary [0, {vocab_size})")
        if banned:
            content[list(banned)] = False
        self.content = content
        self._content_flags = content.tolist()  # is_content runs per decoded token: no tensor indexing there
        self._closer_only, self._content_or_closer, self._opener_only = [], [], []
        for block in range(len(BLOCKS)):
            self._closer_only.append(self._onehot(vocab_size, delims.closers[block], device))
            self._opener_only.append(self._onehot(vocab_size, delims.openers[block], device))
            self._content_or_closer.append((content | self._closer_only[-1].cpu()).to(device))

    def parse(self, tokens: list[int], where: str) -> list[int]:
        """The roles of a boundary prefix z checked against this grammar (parse_prefix)."""
        return parse_prefix(tokens, self, where)

    @staticmethod
    def _onehot(size: int, index: int, device) -> torch.Tensor:
        mask = torch.zeros(size, dtype=torch.bool)
        mask[index] = True
        return mask.to(device)

    def is_content(self, token: int) -> bool:
        return 0 <= token < len(self._content_flags) and self._content_flags[token]

    def eligible(self, cursor: Cursor) -> torch.Tensor:
        if cursor.open:
            if cursor.count < self.caps.of(cursor.block):
                return self._content_or_closer[cursor.block]
            return self._closer_only[cursor.block]
        return self._opener_only[cursor.block + 1]


@dataclass
class Cursor:
    """Where the sequence stands in the block grammar: the current block, open or closed."""

    block: int = -1
    open: bool = False
    count: int = 0

    @property
    def done(self) -> bool:
        return self.block == ANSWER and not self.open

    def role_of_next(self) -> int:
        """The role of the next token: the open block's, or the next block's opener."""
        return self.block if self.open else self.block + 1

    def advance(self, token: int, grammar: Grammar) -> None:
        """Consume one token; raise ValueError with the reason if the grammar forbids it."""
        delims = grammar.delims
        if self.open:
            if token == delims.closers[self.block]:
                self.open = False
            elif self._accepts_content(token, grammar):
                self.count += 1
            else:
                limit = "" if self.block == PROMPT else f" (cap {grammar.caps.of(self.block)})"
                raise ValueError(f"token {token} is not allowed in block {BLOCKS[self.block]!r} "
                                 f"after {self.count} content tokens{limit}")
        elif self.done or token != delims.openers[self.block + 1]:
            expected = "nothing (the answer is closed)" if self.done else (
                f"opener {delims.openers[self.block + 1]} of {BLOCKS[self.block + 1]!r}")
            raise ValueError(f"token {token} where the grammar expects {expected}")
        else:
            self.block, self.open, self.count = self.block + 1, True, 0

    def _accepts_content(self, token: int, grammar: Grammar) -> bool:
        """The prompt is given text (any non-delimiter); decoded blocks take content up to their cap."""
        if self.block == PROMPT:
            return 0 <= token < len(grammar.content) and token not in grammar.delims.all_ids
        return grammar.is_content(token) and self.count < grammar.caps.of(self.block)


def answer_ids(suffix: list[int], grammar: Grammar) -> list[int]:
    """The answer block's content tokens of a suffix (from just after <|merge|> through <|/answer|>): what
    each backend decodes to the answer text with its own tokenizer."""
    cursor, delims, ids = Cursor(block=MERGE, open=True, count=0), set(grammar.delims.all_ids), []
    for token in suffix:
        if cursor.role_of_next() == ANSWER and token not in delims:
            ids.append(token)
        cursor.advance(token, grammar)
    return ids


def parse_prefix(tokens: list[int], grammar: Grammar, where: str) -> list[int]:
    """Check a boundary prefix z against the grammar and return its roles.

    z must run from <|prompt|> through the three branches and end with the single <|merge|> token.
    """
    cursor, roles = Cursor(), []
    for index, token in enumerate(tokens):
        roles.append(cursor.role_of_next())
        try:
            cursor.advance(token, grammar)
        except ValueError as exc:
            raise BankError(f"{where}: field 'tokens'[{index}]: {exc}") from None
    if not (cursor.block == MERGE and cursor.open and cursor.count == 0):
        raise BankError(
            f"{where}: field 'tokens' must end with the single <|merge|> opener "
            f"(the boundary); it ends inside block {BLOCKS[max(cursor.block, 0)]!r}"
        )
    return roles
