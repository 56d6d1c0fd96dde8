"""Cache transplant (docs/protocol.md §7.5): a recipient boundary with a storage-isolated copy of a donor's K/V.

The result keeps the recipient's tokens, roles, positions, padding and its own boundary logits; only
the selected layers' K and/or V come from the donor (all layers, K and V, by default). Provenance is
validated before the result is returned, and a transplant that fails it is refused with one line
naming the field: source constructions, layer count, cache sequence length, tokens, roles, each
tensor's shape, stride, dtype and device, and shared storage (inputs and result).

The checks are the seam's; each backend copies the tensors its own way (`splice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replaytests.engine.boundary import Boundary, bitwise_equal, check_same_state, check_storage_isolated
from replaytests.errors import TransplantRefused, short
from replaytests.inputs.blocks import PARTS, direction

__all__ = ["CONSTRUCTIONS", "PARTS", "check_provenance", "direction", "transplant"]

CONSTRUCTIONS = ("live", "incremental", "prefill")
TENSOR_FIELDS = ("shape", "stride", "dtype", "device")  # the order of Boundary.metadata()["tensors"] entries


def _label(recipient: Boundary, donor: Boundary, layers: list[int], parts: tuple[str, ...]) -> str:
    name = direction(recipient.construction, donor.construction)
    selection = [] if parts == PARTS else [f"{parts[0].upper()} only"]
    if len(layers) != len(recipient.layers):
        selection.append(f"layers {layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1))
                         else f"layers {','.join(map(str, layers))}")
    return f"{name}[{'; '.join(selection)}]" if selection else name


def _refuse(where: str, field: str, recipient: object, donor: object) -> None:
    raise TransplantRefused(f"{where}: {field} differs: recipient {short(recipient)} vs donor {short(donor)}")


def check_provenance(recipient: Boundary, donor: Boundary, where: str) -> None:
    """Refuse unless donor and recipient are distinct constructions of the same boundary, storage-isolated."""
    for arm in (recipient, donor):
        if arm.construction.removesuffix("_replica") not in CONSTRUCTIONS:
            raise TransplantRefused(f"{where}: source construction {arm.construction!r} is not one of "
                                    f"{', '.join(CONSTRUCTIONS)} (or a replica of one)")
    if recipient.construction == donor.construction:
        raise TransplantRefused(f"{where}: source construction: recipient and donor are both "
                                f"{donor.construction!r}")
    mine, theirs = recipient.metadata(), donor.metadata()
    for field in ("layers", "cache_seq_length", "tokens", "roles"):
        if mine[field] != theirs[field]:
            _refuse(where, field, mine[field], theirs[field])
    for index, (own, other) in enumerate(zip(mine["tensors"], theirs["tensors"], strict=True)):
        for field, a, b in zip(TENSOR_FIELDS, own, other, strict=True):
            if a != b:
                _refuse(where, f"layer {index // 2} {PARTS[index % 2].upper()} {field}", a, b)
    check_storage_isolated([recipient, donor], where)


def _selection(layers: Sequence[int] | None, parts: Sequence[str], n_layers: int,
               where: str) -> tuple[list[int], tuple[str, ...]]:
    chosen = list(range(n_layers)) if layers is None else sorted(set(layers))
    if not chosen or not all(0 <= i < n_layers for i in chosen):
        raise TransplantRefused(f"{where}: layers {list(layers or [])} are not a non-empty subset of 0..{n_layers - 1}")
    if not parts or set(parts) - set(PARTS):
        raise TransplantRefused(f"{where}: parts {tuple(parts)!r} are not a non-empty subset of {PARTS}")
    return chosen, tuple(p for p in PARTS if p in parts)


def _check_result(result: Boundary, recipient: Boundary, donor: Boundary, layers: list[int],
                  parts: tuple[str, ...], where: str) -> None:
    """The result is the recipient's state with exactly the selected tensors bit-copied from the donor."""
    check_same_state([recipient, result], where)
    check_storage_isolated([recipient, donor, result], where)
    if not bitwise_equal(result.logits, recipient.logits):
        raise TransplantRefused(f"{where}: boundary logits are not the recipient's own")
    for index, kv in enumerate(result.layers):
        for part, tensor in zip(PARTS, kv, strict=True):
            source = donor if index in layers and part in parts else recipient
            if not bitwise_equal(tensor, source.layers[index][PARTS.index(part)]):
                raise TransplantRefused(f"{where}: layer {index} {part.upper()} is not a bit-exact copy of the "
                                        f"{source.construction} {'donor' if source is donor else 'recipient'}")


def transplant(recipient: Boundary, donor: Boundary, layers: Sequence[int] | None, parts: Sequence[str],
               splice: Callable[[list[int], tuple[str, ...]], tuple[object, object]]) -> Boundary:
    """The recipient's boundary with the selected layers' K and/or V copied from the donor: `splice(layers,
    parts)` is the backend's copy, returning the new boundary's cache and state."""
    where = f"transplant {direction(recipient.construction, donor.construction)}"
    check_provenance(recipient, donor, where)
    chosen, parts = _selection(layers, parts, len(recipient.layers), where)
    cache, state = splice(chosen, parts)
    result = Boundary(_label(recipient, donor, chosen, parts), list(recipient.tokens), list(recipient.roles),
                      cache, recipient.logits.clone(), state)
    _check_result(result, recipient, donor, chosen, parts, f"{where} ({result.construction})")
    return result
