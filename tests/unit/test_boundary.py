"""replaytests.engine.boundary: same-state and storage-isolation checks, and the cache digest (docs/protocol.md §3)."""

from __future__ import annotations

import types

import pytest
import torch

from replaytests.engine.boundary import cache_seq_length, check_same_state, check_storage_isolated
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.errors import BoundaryMismatch, NonFinite, StorageAliasing


def clone_layers(layers):
    return [(k.clone(), v.clone()) for k, v in layers]


@pytest.fixture
def layers(layers_factory):
    return layers_factory(n_layers=3, seq=5, seed=7)


# ---------------------------------------------------------------------------------------------
# check_same_state


def test_same_state_accepts_different_values(make_boundary, layers):
    # Only the K/V and logit values may differ between constructions that reach the same boundary.
    other = [(k + 1.0, v * 2.0) for k, v in layers]
    arms = [make_boundary("incremental", layers), make_boundary("prefill", other, logits=torch.zeros(16))]
    check_same_state(arms, "row r1 (bf16)")


MISMATCHES = [
    # (field, kwargs for the second arm built from the first arm's layers)
    pytest.param("tokens", lambda L: dict(layers=clone_layers(L), tokens=[10, 11, 99, 13, 14]), id="tokens"),
    pytest.param("roles", lambda L: dict(layers=clone_layers(L), roles=[0, 0, 1, 0, 4]), id="roles"),
    pytest.param("cache_seq_length", lambda L: dict(layers=clone_layers(L), seq_length=6), id="cache_seq_length"),
    pytest.param("cache_seq_length", lambda L: dict(layers=[(torch.cat([k, k[:, :, :1]], 2),
                                                              torch.cat([v, v[:, :, :1]], 2)) for k, v in L],
                                                    tokens=[10, 11, 12, 13, 14], roles=[0, 0, 0, 0, 4]),
                 id="cache-one-token-longer"),
    pytest.param("layers", lambda L: dict(layers=clone_layers(L[:2])), id="layers"),
    pytest.param("tensors", lambda L: dict(layers=[(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in L]),
                 id="tensors-dtype"),
    pytest.param("tensors", lambda L: dict(layers=[(k.transpose(1, 2).contiguous().transpose(1, 2), v.clone())
                                                   for k, v in L]), id="tensors-stride"),
    pytest.param("tensors", lambda L: dict(layers=[(k.clone(), v[:1].clone()) for k, v in L]),
                 id="tensors-shape-batch"),
    pytest.param("logits", lambda L: dict(layers=clone_layers(L), logits=torch.zeros(16, dtype=torch.bfloat16)),
                 id="logits-dtype"),
    pytest.param("logits", lambda L: dict(layers=clone_layers(L), logits=torch.zeros(17)), id="logits-shape"),
]


@pytest.mark.parametrize(("field", "second"), MISMATCHES)
def test_same_state_names_the_differing_field(make_boundary, layers, field, second):
    first = make_boundary("incremental", layers)
    other = make_boundary("prefill", **second(layers))
    with pytest.raises(BoundaryMismatch, match=rf"^row r1 \(bf16\): boundary field '{field}' differs between "
                                               rf"incremental and prefill: .+ vs .+$") as info:
        check_same_state([first, other], "row r1 (bf16)")
    assert "\n" not in str(info.value), f"multi-line BoundaryMismatch: {info.value!s}"


def test_same_state_names_the_third_arm_that_differs(make_boundary, layers):
    arms = [make_boundary("incremental", layers), make_boundary("incremental_replica", clone_layers(layers)),
            make_boundary("prefill", clone_layers(layers), tokens=[1, 2, 3, 4, 5])]
    with pytest.raises(BoundaryMismatch, match=r"'tokens' differs between incremental and prefill: "
                                               r"first at index 0: 10 vs 1 \(lengths 5 and 5\)$"):
        check_same_state(arms, "row r2 (fp32)")


def test_same_state_shortens_long_values(make_boundary, layers_factory):
    long_layers = layers_factory(n_layers=1, seq=400)
    tokens = list(range(400))
    arms = [make_boundary("live", long_layers, tokens=tokens, roles=[0] * 399 + [4]),
            make_boundary("incremental", clone_layers(long_layers), tokens=[*tokens[:-1], 7], roles=[0] * 399 + [4])]
    with pytest.raises(BoundaryMismatch) as info:
        check_same_state(arms, "bridge row r3 (bf16)")
    assert len(str(info.value)) < 400, f"message is {len(str(info.value))} characters: values not shortened"
    assert "first at index 399: 399 vs 7 (lengths 400 and 400)" in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------
# check_storage_isolated


def test_clones_are_storage_isolated(make_boundary, layers):
    a = make_boundary("incremental", layers)
    b = make_boundary("prefill", clone_layers(layers), logits=a.logits.clone())
    check_storage_isolated([a, b], "row r1 (bf16)")


SHARES = [
    pytest.param(lambda L, logits: dict(layers=[L[0], *clone_layers(L[1:])], logits=logits.clone()),
                 id="same-layer-tensors"),
    pytest.param(lambda L, logits: dict(layers=[*clone_layers(L[:2]), (L[2][0].clone(), L[2][1])],
                                        logits=logits.clone()), id="one-V-tensor"),
    pytest.param(lambda L, logits: dict(layers=[(L[0][0][:, :, :], L[0][1].clone()), *clone_layers(L[1:])],
                                        logits=logits.clone()), id="a-view-of-K"),
    pytest.param(lambda L, logits: dict(layers=clone_layers(L), logits=logits), id="logits"),
    pytest.param(lambda L, logits: dict(layers=clone_layers(L), logits=L[1][0].reshape(-1)[:16]),
                 id="logits-view-of-other-K"),
]


@pytest.mark.parametrize("shared", SHARES)
def test_shared_storage_is_refused(make_boundary, layers, shared):
    a = make_boundary("incremental", layers)
    b = make_boundary("prefill", **shared(layers, a.logits))
    with pytest.raises(StorageAliasing, match=r"^row r1 \(bf16\): prefill shares tensor storage with incremental "
                                              r"\(data_ptr 0x[0-9a-f]+: prefill (layer \d [KV]|logits), "
                                              r"incremental (layer \d [KV]|logits)\)$"):
        check_storage_isolated([a, b], "row r1 (bf16)")


def test_aliasing_between_the_first_and_third_arm(make_boundary, layers):
    arms = [make_boundary("incremental", layers),
            make_boundary("incremental_replica", clone_layers(layers), logits=torch.ones(16)),
            make_boundary("prefill", [*clone_layers(layers[:2]), layers[2]], logits=torch.zeros(16))]
    with pytest.raises(StorageAliasing, match=r"prefill shares tensor storage with incremental "):
        check_storage_isolated(arms, "row r4 (bf16)")


def test_an_arm_may_share_storage_with_itself(make_boundary, layers):
    # K and V of one construction may live in one buffer; isolation is between constructions.
    buffer = torch.randn(2, 2, 2, 5, 4)
    a = make_boundary("incremental", [(buffer[0], buffer[1])])
    b = make_boundary("prefill", [(buffer[0].clone(), buffer[1].clone())], logits=torch.zeros(16))
    check_storage_isolated([a, b], "row r5 (fp32)")


# ---------------------------------------------------------------------------------------------
# cache_digest / logits_digest


def test_digest_is_stable_for_equal_values(make_boundary, layers):
    a = make_boundary("incremental", layers)
    b = make_boundary("prefill", clone_layers(layers))
    assert a.cache_digest() == a.cache_digest(), "cache_digest differs between two calls on one boundary"
    assert a.cache_digest() == b.cache_digest(), "cache_digest differs between a boundary and its clone"
    assert a.logits_digest() == b.logits_digest(), "logits_digest differs for equal logits"


def test_digest_ignores_memory_layout(make_boundary, layers):
    strided = [(k.transpose(1, 2).contiguous().transpose(1, 2), v) for k, v in layers]
    assert not strided[0][0].is_contiguous(), "fixture: the K tensor should be non-contiguous"
    a, b = make_boundary("a", layers), make_boundary("b", strided)
    assert a.cache_digest() == b.cache_digest(), "cache_digest depends on stride for equal values"


@pytest.mark.parametrize(("layer", "part", "index"), [
    pytest.param(0, 0, (0, 0, 0, 0), id="layer0-K-first"),
    pytest.param(2, 1, (1, 1, 4, 3), id="layer2-V-last"),
    pytest.param(1, 0, (1, 0, 2, 1), id="layer1-K-second-copy"),
])
def test_digest_changes_when_one_element_changes(make_boundary, layers, layer, part, index):
    changed = clone_layers(layers)
    tensor = changed[layer][part]
    tensor[index] = torch.nextafter(tensor[index], torch.tensor(float("inf")))  # one ulp
    a, b = make_boundary("a", layers), make_boundary("b", changed)
    assert a.cache_digest() != b.cache_digest(), (
        f"cache_digest unchanged after a one-ulp change at layer {layer} {'KV'[part]}{list(index)}"
    )


def test_digest_sees_dtype_with_equal_bytes(make_boundary):
    raw = torch.arange(2 * 2 * 3 * 4, dtype=torch.int16).reshape(2, 2, 3, 4)
    a = make_boundary("a", [(raw.view(torch.float16), raw.view(torch.float16))])
    b = make_boundary("b", [(raw.view(torch.bfloat16), raw.view(torch.bfloat16))])
    assert a.cache_digest() != b.cache_digest(), "fp16 and bf16 caches with the same bytes share a digest"


def test_logits_digest_changes_with_one_logit(make_boundary, layers):
    logits = torch.linspace(-1, 1, 16)
    changed = logits.clone()
    changed[5] += 1e-3
    a, b = make_boundary("a", layers, logits=logits), make_boundary("b", layers, logits=changed)
    assert a.logits_digest() != b.logits_digest(), "logits_digest unchanged after logits[5] changed"


def test_fake_cache_matches_a_real_dynamic_cache(make_boundary, layers_factory, repo):
    """The unit tests' FakeCache exposes what a transformers DynamicCache does, with the same results."""
    config = hf_adapter.load_config(repo / "fixtures" / "models" / "tiny-qwen2")
    layers = layers_factory(n_layers=config.num_hidden_layers, seq=5, seed=11)
    from transformers import DynamicCache

    real = hf_adapter.cache_from_layers(types.SimpleNamespace(config=config), layers, like=DynamicCache())
    fake_boundary = make_boundary("fake", layers)
    real_boundary = make_boundary("real", layers)
    real_boundary.cache = real
    assert cache_seq_length(real) == 5, f"real cache seq length {cache_seq_length(real)}"
    assert real_boundary.metadata() == fake_boundary.metadata(), (
        f"metadata differs: real {real_boundary.metadata()} vs fake {fake_boundary.metadata()}"
    )
    assert real_boundary.cache_digest() == fake_boundary.cache_digest(), "digest differs real vs fake cache"
    check_storage_isolated([fake_boundary, real_boundary], "cache_from_layers copies")



# ---------------------------------------------------------------------------------------------
# finite values (a NaN equals the same NaN bitwise: two poisoned runs would "agree")


@pytest.mark.parametrize("where, value, name", [
    pytest.param("k", float("nan"), "layer 1 K", id="nan-in-K"),
    pytest.param("v", float("inf"), "layer 1 V", id="inf-in-V"),
    pytest.param("logits", float("-inf"), "logits", id="minus-inf-in-logits"),
])
def test_a_non_finite_boundary_fails_closed_naming_the_tensor(make_boundary, layers, where, value, name):
    poisoned, logits = clone_layers(layers), torch.linspace(-1.0, 1.0, 16)
    target = logits if where == "logits" else poisoned[1][0 if where == "k" else 1]
    target.view(-1)[3] = value
    arms = [make_boundary("incremental", layers), make_boundary("prefill", poisoned, logits=logits)]
    with pytest.raises(NonFinite, match=rf"row r1 \(fp32\): prefill boundary {name} holds"):
        check_same_state(arms, "row r1 (fp32)")


def test_the_same_nan_in_every_arm_still_fails_closed(make_boundary, layers):
    poisoned = clone_layers(layers)
    poisoned[0][0].fill_(float("nan"))
    arms = [make_boundary("incremental", poisoned), make_boundary("prefill", clone_layers(poisoned))]
    with pytest.raises(NonFinite, match=r"incremental boundary layer 0 K holds \d+ NaN"):
        check_same_state(arms, "row r1 (bf16)")
