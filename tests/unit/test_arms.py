"""replaytests.engine.arms: each (construction, tokens) built and decoded once per runtime, within a budget."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from replaytests.engine.arms import Arms


@dataclass
class FakeBoundary:
    """What Arms reads of a boundary: its cache (identity), layers and logits (their bytes)."""

    name: str
    nbytes: int = 64
    cache: object = field(default_factory=object)

    @property
    def layers(self):
        half = torch.zeros(self.nbytes // 8, dtype=torch.int8)  # K and V: nbytes // 4 bytes in all
        return [(half, half)]

    @property
    def logits(self):
        return torch.zeros(self.nbytes - self.nbytes // 4, dtype=torch.int8)


class Builder:
    """Counts the builds and decodes Arms asks for."""

    def __init__(self, nbytes: int = 64) -> None:
        self.nbytes, self.builds, self.decodes = nbytes, [], []

    def build(self, name: str):
        def make():
            self.builds.append(name)
            return FakeBoundary(name, self.nbytes)
        return make

    def decode(self, boundary):
        self.decodes.append(boundary.name)
        return f"suffix of {boundary.name}"


@pytest.mark.parametrize(("asks", "built"), [
    pytest.param([("prefill", [1, 2]), ("prefill", [1, 2])], ["prefill"], id="same-arm-twice-built-once"),
    pytest.param([("prefill", [1, 2]), ("prefill_replica", [1, 2])], ["prefill", "prefill_replica"],
                 id="a-replica-is-its-own-construction"),
    pytest.param([("incremental", [1, 2]), ("incremental", [1, 3])], ["incremental", "incremental"],
                 id="other-tokens-other-arm"),
])
def test_each_construction_of_each_tokens_is_built_once(asks, built):
    arms, builder = Arms(), Builder()
    got = [arms.boundary(c, tokens, builder.build(c)) for c, tokens in asks]
    assert builder.builds == built, f"built {builder.builds} for {asks}, expected {built}"
    assert (got[0] is got[1]) == (len(built) == 1), "a shared arm must be the same boundary, others distinct"
    assert (arms.built, arms.reused) == (len(built), len(asks) - len(built))


def test_a_held_boundary_is_decoded_once_any_other_each_time():
    arms, builder = Arms(), Builder()
    held = arms.boundary("prefill", [1], builder.build("prefill"))
    for _ in range(2):
        assert arms.suffix(held, builder.decode) == "suffix of prefill"
        arms.suffix(FakeBoundary("transplanted"), builder.decode)
    assert builder.decodes == ["prefill", "transplanted", "transplanted"], builder.decodes


def test_past_the_budget_the_oldest_arm_is_built_again():
    arms, builder = Arms(budget=150), Builder(nbytes=64)  # room for two arms
    for tokens in ([1], [2], [3], [1]):
        arms.boundary("prefill", tokens, builder.build(f"prefill {tokens}"))
    assert builder.builds == ["prefill [1]", "prefill [2]", "prefill [3]", "prefill [1]"], builder.builds
    assert arms.held == 128, f"{arms.held} bytes held, expected two arms of 64"


def test_an_arm_larger_than_the_budget_is_never_held():
    arms, builder = Arms(budget=32), Builder(nbytes=64)
    first = arms.boundary("prefill", [1], builder.build("prefill"))
    arms.suffix(first, builder.decode)
    arms.suffix(first, builder.decode)
    assert (builder.builds, builder.decodes, arms.held) == (["prefill"], ["prefill", "prefill"], 0)
