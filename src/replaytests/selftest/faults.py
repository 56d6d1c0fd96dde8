"""The faults the selftest injects, each applied from outside the engine to a copy of a loaded runtime.

A faulted runtime is `dataclasses.replace(runtime)`: the same model and cell with arms of its own
(engine/arms.py), so nothing a fault builds reaches the clean runtime's arms, and the clean runtime
stays the control. Each fault replaces one member of that copy, at a seam the families already call:
`build` (the boundary a construction hands over, engine/backend.py), `transplant` (the backend's copy
of K/V, engine/transplant.py) or the forward call's ids, mask and positions (`_forward`, the one call
of the Hugging Face step that every construction, the decoder and the probe make: engine/hf/forward.py).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch

from replaytests.engine.backend import Backend
from replaytests.engine.boundary import Boundary
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.protocol import VISIBILITIES, prompt_of
from replaytests.engine.transplant import transplant as checked_transplant


def copy_of(runtime: Backend) -> Backend:
    """The runtime with arms of its own: what a fault builds is never handed to the clean runtime."""
    return dataclasses.replace(runtime)


def _one_ulp_up(tensor: torch.Tensor, index: tuple[int, ...]) -> None:
    """One element, in every physical-batch copy, moved to the next representable value (one ULP)."""
    element = tensor[(slice(None), *index)]
    tensor[(slice(None), *index)] = torch.nextafter(element, torch.full_like(element, float("inf")))


def nudged_cache(runtime: Backend, construction: str) -> Backend:
    """`construction`'s boundary cache with one K element of the middle layer one ULP up (the last position,
    first head and channel): the smallest change a cache comparison must see."""
    faulted = copy_of(runtime)
    build = faulted.build  # its own arms

    def nudged(name: str, z: list[int]) -> Boundary:
        boundary = build(name, z)
        if name != construction:
            return boundary
        cache = copy.deepcopy(boundary.cache)  # the held arm stays as built
        layer = cache.layers[len(cache.layers) // 2]
        # Every copy alike: a nudge in one copy would be the physical-batch check's to find, not the comparison's.
        _one_ulp_up(layer.keys, (0, int(cache.get_seq_length()) - 1, 0))
        return dataclasses.replace(boundary, cache=cache)

    faulted.build = nudged
    return faulted


class _EditedCall:
    """The step's forward call with (ids, mask, positions) passed through `edit` first; everything else the
    step asks of it (a new cache) is the call's own."""

    def __init__(self, call, edit: Callable) -> None:
        self._call, self._edit = call, edit

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        return self._call(*self._edit(ids, mask, positions), cache)

    def __getattr__(self, name: str):
        return getattr(self._call, name)


def _forward_edited(runtime: Backend, edit: Callable) -> Backend:
    """A copy whose every forward call passes (ids, mask, positions) through `edit` first."""
    faulted = copy_of(runtime)
    faulted._forward = _EditedCall(faulted._forward, edit)
    return faulted


def leaky_mask(runtime: Backend) -> Backend:
    """In every call, the last query also sees the nearest earlier key the visibility contract hides from it
    (one hidden key let through)."""
    def leak(ids, mask, positions):
        last = mask[0, 0, -1]
        # Causality already hides every key after the query: the hidden keys are the False ones before it.
        query = int(positions[0, -1])
        hidden = (~last[: query + 1]).nonzero().flatten()
        if not len(hidden):
            return ids, mask, positions
        mask = mask.clone()
        mask[:, :, -1, int(hidden[-1])] = True
        return ids, mask, positions

    return _forward_edited(runtime, leak)


def hides_keys(visibility: str) -> bool:
    """Whether the contract's visibility hides any earlier key (else no hidden key can be let through)."""
    return not bool(VISIBILITIES[visibility].all())


def shifted_position(runtime: Backend, at: int) -> Backend:
    """The position id of the token at flat position `at` given as `at + 1`, in every call that feeds it."""
    def shift(ids, mask, positions):
        first = int(positions[0, 0])
        if not first <= at < first + positions.shape[1]:
            return ids, mask, positions
        positions = positions.clone()
        positions[:, at - first] += 1
        return ids, mask, positions

    return _forward_edited(runtime, shift)


def desynced_copy(runtime: Backend) -> Backend:
    """The second physical-batch copy fed its second token in place of its first (the prompt opener) in the
    call that starts the sequence: one copy of the batch perturbed, as a kernel that depends on the batch
    position perturbs one row."""
    def perturb(ids, mask, positions):
        if ids.shape[0] < 2 or ids.shape[1] < 2 or int(positions[0, 0]) != 0:
            return ids, mask, positions
        ids = ids.clone()
        ids[1, 0] = ids[1, 1]
        return ids, mask, positions

    return _forward_edited(runtime, perturb)


def edited_prefix(runtime: Backend, edit: Callable[[list[int], int], list[int]]) -> Backend:
    """Every construction built from `edit(z, i)` instead of z, i the last prompt content token: a replay that
    feeds the model another prefix than the bank row's (the arms still agree with one another)."""
    faulted = copy_of(runtime)
    build = faulted.build  # its own arms: the edited z is never held by the clean runtime

    def rebuilt(name: str, z: list[int]) -> Boundary:
        return build(name, edit(z, len(prompt_of(z, runtime.grammar.delims)) - 2))

    faulted.build = rebuilt
    return faulted


def dropped(z: list[int], at: int) -> list[int]:
    return z[:at] + z[at + 1:]


def duplicated(z: list[int], at: int) -> list[int]:
    return z[:at + 1] + z[at:]


def swaps_nothing(runtime: Backend) -> Backend:
    """A transplant whose copy takes nothing from the donor: the recipient's own K/V copied back into it."""
    faulted = copy_of(runtime)
    faulted.arms = runtime.arms  # it builds nothing differently: the clean arms serve it

    def transplant(recipient: Boundary, donor: Boundary, layers=None, parts=("k", "v")) -> Boundary:
        def splice(chosen: list[int], selected: tuple[str, ...]) -> tuple[object, None]:
            own = hf_adapter.transplanted_cache(runtime.model, recipient.cache, recipient.cache, chosen, selected)
            return own, None

        return checked_transplant(recipient, donor, layers, parts, splice)

    faulted.transplant = transplant
    return faulted
