"""replaytests.engine.comparisons: first divergence and the boundary metrics of protocol.md §5 (eq. 2 in float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from replaytests.engine.comparisons import compare_boundaries, first_divergence

# ---------------------------------------------------------------------------------------------
# first_divergence


@pytest.mark.parametrize(("a", "b", "expected"), [
    pytest.param([], [], None, id="both-empty"),
    pytest.param([1, 2, 3], [1, 2, 3], None, id="equal"),
    pytest.param([9, 2, 3], [1, 2, 3], 0, id="differ-at-0"),
    pytest.param([1, 2, 3, 4, 5], [1, 2, 3, 0, 5], 3, id="differ-at-3"),
    pytest.param([1, 2, 3], [1, 2, 4], 2, id="differ-at-last"),
    pytest.param([1, 2], [1, 2, 3, 4, 5], 2, id="a-prefix-of-b"),
    pytest.param([1, 2, 3, 4, 5], [1, 2], 2, id="b-prefix-of-a"),
    pytest.param([], [7], 0, id="a-empty"),
    pytest.param([1, 5], [1, 2, 3], 1, id="differ-before-length"),
])
def test_first_divergence(a, b, expected):
    got = first_divergence(a, b)
    assert got == expected, f"first_divergence({a}, {b}) = {got}, expected {expected}"


# ---------------------------------------------------------------------------------------------
# compare_boundaries: an independent float64 reference in numpy


def np64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().numpy().astype(np.float64)


def ref_drift(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """eq. 2 over the concatenation of `pairs`: ||A-B|| / max(||A||, ||B||), and max |A-B|."""
    a = np.concatenate([np64(x).ravel() for x, _ in pairs])
    b = np.concatenate([np64(y).ravel() for _, y in pairs])
    denominator = max(np.linalg.norm(a), np.linalg.norm(b))
    return float(np.linalg.norm(a - b) / denominator), float(np.abs(a - b).max())


def clone_layers(layers):
    return [(k.clone(), v.clone()) for k, v in layers]


def perturbed(layers, part: int, layer: int, fn):
    out = clone_layers(layers)
    kv = list(out[layer])
    kv[part] = fn(kv[part].clone())
    out[layer] = tuple(kv)
    return out


def bump(index, amount):
    def apply(t: torch.Tensor) -> torch.Tensor:
        t[index] += amount
        return t
    return apply


PERTURBATIONS = [
    # (part 0=K 1=V, layer, function, label)
    pytest.param(0, 1, bump((0, 1, 2, 3), 0.5), id="K-layer1-one-element"),
    pytest.param(1, 2, lambda t: t * 1.01, id="V-layer2-scaled"),
    pytest.param(0, 0, lambda t: t + 1e-3 * torch.arange(t.numel()).reshape(t.shape), id="K-layer0-ramp"),
    pytest.param(1, 0, bump((1, 0, 4, 0), -2.0), id="V-layer0-second-batch-copy"),
]


@pytest.fixture
def base_layers(layers_factory):
    return layers_factory(n_layers=3, seq=5, seed=1)


def test_identical_boundaries_are_exact_with_zero_drift(make_boundary, base_layers):
    a = make_boundary("incremental", base_layers)
    b = make_boundary("prefill", clone_layers(base_layers), logits=a.logits.clone())
    m = compare_boundaries(a, b)
    assert m["cache_exact"] is True, f"cache_exact {m['cache_exact']} for identical caches"
    for key in ("k_rel_l2", "v_rel_l2", "k_max_abs", "v_max_abs", "logits_max_abs"):
        assert m[key] == 0.0, f"{key} = {m[key]} for identical boundaries"
    for key in ("k_rel_l2_per_layer", "v_rel_l2_per_layer", "k_max_abs_per_layer", "v_max_abs_per_layer"):
        assert m[key] == [0.0, 0.0, 0.0], f"{key} = {m[key]} for identical boundaries"
    assert m["logits_exact"] is True and m["argmax_equal"] is True, f"logits_exact/argmax_equal {m}"


@pytest.mark.parametrize(("part", "layer", "fn"), PERTURBATIONS)
def test_drift_matches_numpy_float64_reference(make_boundary, base_layers, part, layer, fn):
    other = perturbed(base_layers, part, layer, fn)
    m = compare_boundaries(make_boundary("a", base_layers), make_boundary("b", other))
    assert m["cache_exact"] is False, "cache_exact True after a perturbation"
    for name, p in (("k", 0), ("v", 1)):
        pairs = [(la[p], lb[p]) for la, lb in zip(base_layers, other, strict=True)]
        rel, max_abs = ref_drift(pairs)
        assert m[f"{name}_rel_l2"] == pytest.approx(rel, rel=1e-12, abs=0), (
            f"{name.upper()} overall relative L2 {m[f'{name}_rel_l2']!r}, numpy reference {rel!r}"
        )
        assert m[f"{name}_max_abs"] == pytest.approx(max_abs, rel=1e-12, abs=0), (
            f"{name.upper()} overall max |diff| {m[f'{name}_max_abs']!r}, numpy reference {max_abs!r}"
        )
        for index, pair in enumerate(pairs):
            rel_i, max_i = ref_drift([pair])
            got_rel, got_max = m[f"{name}_rel_l2_per_layer"][index], m[f"{name}_max_abs_per_layer"][index]
            assert got_rel == pytest.approx(rel_i, rel=1e-12, abs=0), (
                f"{name.upper()} layer {index} relative L2 {got_rel!r}, numpy reference {rel_i!r}"
            )
            assert got_max == pytest.approx(max_i, rel=1e-12, abs=0), (
                f"{name.upper()} layer {index} max |diff| {got_max!r}, numpy reference {max_i!r}"
            )


@pytest.mark.parametrize(("part", "layer", "fn"), PERTURBATIONS)
def test_k_and_v_are_reported_separately(make_boundary, base_layers, part, layer, fn):
    m = compare_boundaries(make_boundary("a", base_layers), make_boundary("b", perturbed(base_layers, part, layer, fn)))
    touched, untouched = ("k", "v") if part == 0 else ("v", "k")
    assert m[f"{touched}_rel_l2"] > 0, f"{touched.upper()} drift is 0 though {touched.upper()} was perturbed"
    assert m[f"{untouched}_rel_l2"] == 0.0 and m[f"{untouched}_max_abs"] == 0.0, (
        f"{untouched.upper()} drift {m[f'{untouched}_rel_l2']} / max {m[f'{untouched}_max_abs']} though only "
        f"{touched.upper()} was perturbed"
    )
    per_layer = m[f"{touched}_rel_l2_per_layer"]
    assert [i for i, d in enumerate(per_layer) if d > 0] == [layer], (
        f"{touched.upper()} per-layer drift {per_layer}: only layer {layer} was perturbed"
    )


@pytest.mark.parametrize("order", [pytest.param("A,2A", id="A-then-2A"), pytest.param("2A,A", id="2A-then-A")])
def test_relative_l2_divides_by_the_larger_norm(make_boundary, base_layers, order):
    # ||A - 2A|| / max(||A||, ||2A||) = 1/2 in either order (dividing by ||A|| alone would give 1).
    doubled = [(k * 2, v * 2) for k, v in base_layers]
    first, second = (base_layers, doubled) if order == "A,2A" else (doubled, base_layers)
    m = compare_boundaries(make_boundary("a", first), make_boundary("b", second))
    for key in ("k_rel_l2", "v_rel_l2"):
        assert m[key] == pytest.approx(0.5, rel=1e-12), f"{key} = {m[key]!r} for {order}, expected 0.5"


def test_bf16_drift_is_computed_in_float64(make_boundary, layers_factory):
    a_layers = layers_factory(n_layers=2, seq=7, seed=3, dtype=torch.bfloat16)
    b_layers = perturbed(a_layers, 0, 1, lambda t: (t.float() * 1.0078125).to(torch.bfloat16))
    m = compare_boundaries(make_boundary("a", a_layers), make_boundary("b", b_layers))
    rel, max_abs = ref_drift([(la[0], lb[0]) for la, lb in zip(a_layers, b_layers, strict=True)])
    assert m["k_rel_l2"] == pytest.approx(rel, rel=1e-12), f"bf16 K relative L2 {m['k_rel_l2']!r}, reference {rel!r}"
    assert m["k_max_abs"] == pytest.approx(max_abs, rel=1e-12), f"bf16 K max |diff| {m['k_max_abs']!r}, ref {max_abs!r}"
    assert isinstance(m["k_rel_l2"], float), f"k_rel_l2 is {type(m['k_rel_l2']).__name__}, expected a float"


@pytest.mark.parametrize(("b_logits", "exact", "argmax_equal", "max_abs"), [
    pytest.param([0.0, 3.0, 1.0, -2.0], True, True, 0.0, id="equal"),
    pytest.param([0.0, 3.0, 1.25, -2.0], False, True, 0.25, id="differ-same-argmax"),
    pytest.param([0.0, 3.0, 3.5, -2.0], False, False, 2.5, id="argmax-moves"),
    pytest.param([0.0, 3.0, 3.0, -2.0], False, True, 2.0, id="tie-goes-to-lowest-id"),
])
def test_boundary_logits(make_boundary, base_layers, b_logits, exact, argmax_equal, max_abs):
    a = make_boundary("a", base_layers, logits=torch.tensor([0.0, 3.0, 1.0, -2.0]))
    b = make_boundary("b", clone_layers(base_layers), logits=torch.tensor(b_logits))
    m = compare_boundaries(a, b)
    assert m["logits_exact"] is exact, f"logits_exact {m['logits_exact']}, expected {exact} for {b_logits}"
    assert m["argmax_equal"] is argmax_equal, f"argmax_equal {m['argmax_equal']}, expected {argmax_equal}"
    assert m["logits_max_abs"] == pytest.approx(max_abs), f"logits_max_abs {m['logits_max_abs']}, expected {max_abs}"
    assert m["cache_exact"] is True, "cache_exact False though only the logits differ"


def test_cache_exact_is_bitwise_signed_zero(make_boundary, layers_factory):
    # docs/protocol.md §5: "cache exact: every layer's K and V bitwise equal". +0.0 and -0.0 have different bits
    # (and different cache digests), so they are not an exact cache.
    a_layers = layers_factory(n_layers=1, seq=3)
    a_layers[0][0][0, 0, 0, 0] = 0.0
    b_layers = clone_layers(a_layers)
    b_layers[0][0][0, 0, 0, 0] = -0.0
    a, b = make_boundary("a", a_layers), make_boundary("b", b_layers)
    assert a.cache_digest() != b.cache_digest(), "fixture: digests should see the sign bit"
    m = compare_boundaries(a, b)
    assert m["cache_exact"] is False, (
        "cache_exact True for caches that differ in one sign bit (+0.0 vs -0.0 at layer 0 K[0,0,0,0]) "
        "while their cache digests differ"
    )
