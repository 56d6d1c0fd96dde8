"""Meta-tests of the family registry: every registered family has conformance tests in the fidelity
layers it names (and no layer reads a family that does not name it), and every registry fact is
consistent with itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from replaytests.families.registry import FAMILIES

CONFORMANCE = Path(__file__).resolve().parents[2] / "src" / "replaytests" / "conformance"
LAYER_MODULES = {"replica": "test_replica_stability.py", "token_identity": "test_token_identity.py",
                 "fidelity": "test_live_state_fidelity.py", "causal": "test_causal_sufficiency.py"}


def families_read(layer: str) -> set[str]:
    """The families a layer's conformance module reads records of: record("<family>", ...)."""
    return set(re.findall(r'record\(\s*"(\w+)"', (CONFORMANCE / LAYER_MODULES[layer]).read_text()))


@pytest.mark.parametrize(("family", "layer"), [pytest.param(f.name, layer, id=f"{f.name}-{layer}")
                                               for f in FAMILIES.values() for layer in f.layers])
def test_each_family_has_tests_in_its_layers(family, layer):
    assert family in families_read(layer), f"{LAYER_MODULES[layer]} reads no {family} record"


@pytest.mark.parametrize("layer", sorted(LAYER_MODULES))
def test_a_layer_reads_only_the_families_that_name_it(layer):
    strays = {f for f in families_read(layer) if f not in FAMILIES or layer not in FAMILIES[f].layers}
    assert not strays, f"{LAYER_MODULES[layer]} reads {sorted(strays)}, whose registry records do not name {layer}"


@pytest.mark.parametrize("family", [pytest.param(f, id=f.name) for f in FAMILIES.values()])
def test_pairs_headline_and_replicas_name_the_family_arms(family):
    arms = set(family.arms)
    assert {a for pair in family.pairs for a in pair} <= arms, f"{family.name}: a pair names an arm it lacks"
    pairs = {f"{a}~{b}" for a, b in family.pairs}
    assert set(family.headline) <= pairs and set(family.replicas) <= pairs, f"{family.name}: headline {family.headline}"
    assert set(family.layers) <= set(LAYER_MODULES), f"{family.name}: unknown layers {family.layers}"
