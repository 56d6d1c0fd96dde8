"""The position splice of the conversation transplant (docs/protocol.md §16, "The transplant at turn k"): a
recipient's turn-k state whose K/V over its first `end` positions, every layer, K and V, is a storage-isolated
copy of a donor's.

Nothing is recomputed. The result keeps the recipient's tokens, roles, its K/V from position `end` on (computed,
when the recipient was built, from its own K/V before them) and its own boundary logits (its last call's output,
which read its own K/V): as the transplant family keeps the recipient's boundary logits, the first token of the
assistant turn is the recipient's choice, and only the tokens decoded after it read the spliced cache. Provenance
is validated before the splice, and the result after it, each refusal one line naming the field: source
constructions, layer count, cache sequence length, tokens, roles, each tensor's shape, stride, dtype and device,
the range, and shared storage; the result's positions before `end` must be the donor's bit for bit and those
from `end` on the recipient's (a splice of another range is caught at its first wrong position).

The checks are the seam's; each backend copies the tensors its own way (`copy`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from replaytests.engine.boundary import Boundary, as_int, bitwise_equal, check_same_state, check_storage_isolated
from replaytests.engine.transplant import TENSOR_FIELDS
from replaytests.errors import TransplantRefused, short
from replaytests.inputs.blocks import PARTS, direction

CONSTRUCTIONS = ("session", "replay")  # the conversation constructions a splice moves K/V between


def label(recipient: str, donor: str, end: int) -> str:
    """A splice as its boundary is named: `replay<-session[:37]` gives the replay positions 0-36 of the session."""
    return f"{direction(recipient, donor)}[:{end}]"


def check_provenance(recipient: Boundary, donor: Boundary, end: int, where: str) -> None:
    """Refuse unless donor and recipient are distinct conversation constructions of the same turn's state,
    storage-isolated, and `end` is a position range inside it."""
    for arm in (recipient, donor):
        if arm.construction.removesuffix("_replica") not in CONSTRUCTIONS:
            raise TransplantRefused(f"{where}: source construction {arm.construction!r} is not one of "
                                    f"{', '.join(CONSTRUCTIONS)} (or a replica of one)")
    if recipient.construction == donor.construction:
        raise TransplantRefused(f"{where}: source construction: recipient and donor are both {donor.construction!r}")
    mine, theirs = recipient.metadata(), donor.metadata()
    for field in ("layers", "cache_seq_length", "tokens", "roles"):
        if mine[field] != theirs[field]:
            raise TransplantRefused(f"{where}: {field} differs: recipient {short(mine[field])} vs donor "
                                    f"{short(theirs[field])}")
    for index, (own, other) in enumerate(zip(mine["tensors"], theirs["tensors"], strict=True)):
        for field, a, b in zip(TENSOR_FIELDS, own, other, strict=True):
            if a != b:
                raise TransplantRefused(f"{where}: layer {index // 2} {PARTS[index % 2].upper()} {field} differs: "
                                        f"recipient {short(a)} vs donor {short(b)}")
    length = mine["cache_seq_length"]
    if not mine["layers"] or not 1 <= end <= length:
        raise TransplantRefused(f"{where}: range [0, {end}) is not a non-empty range of the {length} cached positions")
    check_storage_isolated([recipient, donor], where)


def _first_other(tensor: torch.Tensor, source: torch.Tensor) -> int | None:
    """The first position (dimension 2) where `tensor` and `source` differ in any bit, or None."""
    differs = (as_int(tensor) != as_int(source)).flatten(3).any(dim=3).any(dim=1).any(dim=0)
    return int(differs.nonzero()[0]) if bool(differs.any()) else None


def first_kv_difference(a: Boundary, b: Boundary) -> int | None:
    """The first position whose K or V, in any layer, differs in any bit between two states of the same tokens;
    None where every layer is bit-exact."""
    found = [p for kv, other in zip(a.layers, b.layers, strict=True) for x, y in zip(kv, other, strict=True)
             if (p := _first_other(x, y)) is not None]
    return min(found, default=None)


def check_result(result: Boundary, recipient: Boundary, donor: Boundary, end: int, where: str) -> None:
    """The result is the recipient's state with every layer's K and V over [0, end) bit-copied from the donor."""
    check_same_state([recipient, result], where)
    check_storage_isolated([recipient, donor, result], where)
    if not bitwise_equal(result.logits, recipient.logits):
        raise TransplantRefused(f"{where}: boundary logits are not the recipient's own")
    for index, kv in enumerate(result.layers):
        for p, (part, tensor) in enumerate(zip(PARTS, kv, strict=True)):
            for source, name, span in ((donor, "donor", slice(0, end)), (recipient, "recipient", slice(end, None))):
                other = _first_other(tensor[:, :, span], source.layers[index][p][:, :, span])
                if other is not None:
                    raise TransplantRefused(f"{where}: layer {index} {part.upper()} position {other + span.start} is "
                                            f"not a bit-exact copy of the {source.construction} {name} (the splice "
                                            f"takes positions [0, {end}) from the donor, the rest from the recipient)")


def splice(recipient: Boundary, donor: Boundary, end: int, copy: Callable[[int], object]) -> Boundary:
    """The recipient's state with the donor's K/V over positions [0, end): `copy(end)` is the backend's copy,
    returning the new boundary's cache."""
    where = f"conversation transplant {label(recipient.construction, donor.construction, end)}"
    check_provenance(recipient, donor, end, where)
    result = Boundary(label(recipient.construction, donor.construction, end), list(recipient.tokens),
                      list(recipient.roles), copy(end), recipient.logits.clone())
    check_result(result, recipient, donor, end, where)
    return result
