"""The protocol's names: its six blocks, their delimiters, roles and caps, and how a transplanted arm
is named. Plain data, no torch.

Kept apart from `protocol` so that a contract can be read before torch is first imported (the CPU
instruction set a contract pins must be applied before torch dispatches its first kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCKS = ("prompt", "cot_1", "cot_2", "cot_3", "merge", "answer")
PROMPT, MERGE, ANSWER = 0, 4, 5
DELIMITER_NAMES = tuple(f"<|{prefix}{block}|>" for block in BLOCKS for prefix in ("", "/"))
# The K/V cache classes a contract may name (environment.cache), as the HF adapter builds them.
CACHES = ("dynamic", "static", "offloaded")


@dataclass(frozen=True)
class Caps:
    """Content tokens allowed per block (the prompt block is given, not decoded)."""

    branch: int
    merge: int
    answer: int

    def of(self, block: int) -> int:
        return (0, self.branch, self.branch, self.branch, self.merge, self.answer)[block]

    def suffix_room(self) -> int:
        """Tokens the suffix can add after the boundary: merge content, 3 delimiters, answer content."""
        return self.merge + self.answer + 3


PARTS = ("k", "v")  # what a transplant can move: the keys, the values, or both


def direction(recipient: str, donor: str) -> str:
    """The ledger name of a transplant: 'prefill<-incremental' gives the prefill recipient incremental's K/V."""
    return f"{recipient}<-{donor}"
