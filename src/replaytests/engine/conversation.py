"""A conversation's turns as the families see them (docs/protocol.md §16, "Conversations"): the state a
construction reached at turn k, just before the assistant's first token, and the assistant turn decoded from it.

Every token of a conversation takes the prompt's role, so attention is plain causal under either visibility
(a chat is not the protocol's multi-branch reasoning). An assistant turn is decoded greedily under the answer
block's mask: any content token or the closer, only the closer once the turn holds `cap` content tokens.

No torch here: the registry and the outputs read the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replaytests.engine.boundary import Boundary, Suffix

# session: one cache carried across turns, assistant turns decoded live, each user turn appended in one call;
# replay: one call over the token history (the generated ids kept); rerendered: one call over the history as
# the chat template renders the messages, tokenized again; incremental: the token history one token per call.
CONSTRUCTIONS = ("session", "replay", "rerendered", "incremental")
ONE_CALL = ("replay", "rerendered")  # one prefill call per turn


@dataclass(frozen=True)
class TurnState:
    """One construction at turn k (1-based): its state over the history through the generation prompt, and
    the assistant turn decoded from there (content ids, then the closer)."""

    construction: str
    turn: int
    boundary: Boundary
    answer: Suffix
