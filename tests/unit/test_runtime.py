"""engine.hf.forward and runtime: numeric flags, the physical-batch forward call, its desync check (protocol.md §2)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from replaytests.engine.hf import constructions
from replaytests.engine.hf.forward import check_batch_equal, copies_differ
from replaytests.engine.hf.runtime import Runtime
from replaytests.engine.numerics import apply_numeric_flags
from replaytests.engine.protocol import visibility_rows
from replaytests.errors import ConfigError, NonFinite, PhysicalBatchDesync
from replaytests.inputs.cells import Cell

DESYNC = r"^physical-batch desync at {where}: copy {copy} differs from copy 0, max \|diff\| {diff}$"

# ---------------------------------------------------------------------------------------------
# check_batch_equal


@pytest.mark.parametrize("tensor", [
    pytest.param(torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]), id="logits-pair"),
    pytest.param(torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(0)).expand(2, -1, -1, -1),
                 id="cache-pair"),
    pytest.param(torch.tensor([[0.5, -1.0]] * 3, dtype=torch.bfloat16), id="bf16-three-copies"),
    pytest.param(torch.tensor([[4.0, 5.0]]), id="single-copy"),
])
def test_batch_equal_passes_identical_copies(tensor):
    check_batch_equal(tensor, "live token 7 (logits)")


@pytest.mark.parametrize(("tensor", "copy", "diff"), [
    pytest.param(torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.25, 3.0]]), 1, "0.25", id="copy1-one-logit"),
    pytest.param(torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.5, 2.0]]), 2, "0.5", id="copy2-of-three"),
    pytest.param(torch.tensor([[0.0, 1.0], [-4.0, 1.0]], dtype=torch.bfloat16), 1, "4", id="bf16"),
    pytest.param(torch.tensor([[1.0, 1.0], [1.0, 1.0 + 2.0**-23]]), 1, "1.19209e-07", id="one-ulp"),
])
def test_batch_desync_names_step_copy_and_max_diff(tensor, copy, diff):
    where = "suffix token 12 (logits)"
    with pytest.raises(PhysicalBatchDesync,
                       match=DESYNC.format(where=re.escape(where), copy=copy, diff=re.escape(diff))):
        check_batch_equal(tensor, where)


def test_batch_desync_on_a_cache_tensor():
    keys = torch.zeros(2, 2, 4, 8)
    keys[1, 1, 3, 7] = 1e-3
    with pytest.raises(PhysicalBatchDesync, match=DESYNC.format(
            where=re.escape("prefill boundary cache layer 3 K"), copy=1, diff="0.001")):
        check_batch_equal(keys, "prefill boundary cache layer 3 K")


@pytest.mark.parametrize(("row0", "row1", "equal_bits"), [
    pytest.param([float("nan"), 1.0], [float("nan"), 1.0], True, id="same-nan-bits-pass"),
    pytest.param([0.0, 1.0], [-0.0, 1.0], False, id="signed-zero-fails"),
])
def test_batch_check_is_bitwise(row0, row1, equal_bits):
    # docs/protocol.md §2: the copies' logits must be *bitwise* equal.
    tensor = torch.tensor([row0, row1])
    bits = tensor.view(torch.int32)
    assert torch.equal(bits[0], bits[1]) is equal_bits, "fixture: bit patterns not as intended"
    if equal_bits:
        check_batch_equal(tensor, "live token 3 (logits)")
    else:
        with pytest.raises(PhysicalBatchDesync, match=r"^physical-batch desync at live token 3 \(logits\): copy 1"):
            check_batch_equal(tensor, "live token 3 (logits)")


def _calls(*pairs: tuple[list[float], list[float]], dtype=torch.float32) -> torch.Tensor:
    """Logits of several calls, [calls, copies, vocab]."""
    return torch.tensor([list(pair) for pair in pairs], dtype=dtype)


@pytest.mark.parametrize(("logits", "differ"), [
    pytest.param(_calls(([1.0, 2.0], [1.0, 2.0]), ([3.0, 4.0], [3.0, 4.0])), False, id="two-calls-equal"),
    pytest.param(_calls(([1.0, 2.0], [1.0, 2.0]), ([3.0, 4.0], [3.0, 4.0 + 2.0**-21])), True, id="last-call-one-ulp"),
    pytest.param(_calls(([0.0, 1.0], [-0.0, 1.0])), True, id="signed-zero"),
    pytest.param(_calls(([float("nan"), 1.0], [float("nan"), 1.0])), False, id="same-nan-bits"),
    pytest.param(_calls(([0.5, -1.0], [0.5, -1.0]), ([2.0, 2.0], [2.0, 2.5]), dtype=torch.bfloat16), True,
                 id="bf16-second-call"),
    pytest.param(torch.tensor([[[7, 8], [7, 8], [7, 9]]]), True, id="int-third-copy"),
])
def test_copies_differ_compares_every_call_bitwise(logits, differ):
    # The decoder compares many calls' copies in one go: any copy of any call that differs in any bit.
    assert bool(copies_differ(logits)) is differ, (
        f"copies_differ({logits.tolist()}) is {bool(copies_differ(logits))}, expected {differ}")


# ---------------------------------------------------------------------------------------------
# apply_numeric_flags


@pytest.fixture
def restore_numeric_flags():
    saved = (torch.get_num_threads(), torch.get_float32_matmul_precision(),
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.set_num_threads(saved[0])
    torch.set_float32_matmul_precision(saved[1])
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[2], saved[3]


@pytest.mark.parametrize("cell", [pytest.param("bf16", id="bf16-flags"), pytest.param("fp32", id="fp32-flags")])
def test_numeric_flags_read_back(restore_numeric_flags, tiny_contract, cell):
    flags = tiny_contract.cells[cell]
    apply_numeric_flags(flags, 1)
    readback = {
        "threads": (torch.get_num_threads(), 1),
        "tf32_matmul": (torch.backends.cuda.matmul.allow_tf32, flags.tf32_matmul),
        "cudnn_tf32": (torch.backends.cudnn.allow_tf32, flags.cudnn_tf32),
        "float32_matmul_precision": (torch.get_float32_matmul_precision(), flags.float32_matmul_precision),
    }
    wrong = {name: pair for name, pair in readback.items() if pair[0] != pair[1]}
    assert not wrong, f"{cell} flags read back (actual, wanted): {wrong}"


def test_numeric_flag_that_does_not_take_is_a_config_error(restore_numeric_flags, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    with pytest.raises(ConfigError, match=r"^numeric flag cpu_threads: set 1 but it reads back 3$"):
        apply_numeric_flags(Cell(dtype="float32"), 1)


def test_load_refuses_a_precision_the_contract_lacks(tiny_contract, repo):
    bf16_only = dataclasses.replace(tiny_contract, cells={"bf16": tiny_contract.cells["bf16"]})
    with pytest.raises(ConfigError, match=r"cpu-tiny\.yaml: cell 'fp32' is not declared by contract cpu-tiny "
                                          r"\(its cells: bf16\)$"):
        Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", bf16_only, "fp32")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_load_refuses_cuda_without_cuda(tiny_contract, repo):
    with pytest.raises(ConfigError, match=r"environment\.device is 'cuda' but CUDA is not available here$"):
        Runtime.load(repo / "fixtures" / "models" / "tiny-qwen2", tiny_contract, "fp32", device="cuda")


# ---------------------------------------------------------------------------------------------
# End to end on the tiny model: a batch-position-dependent forward is caught and named


class Perturb:
    """Wraps Runtime._forward: calls the real one, then perturbs copy 1 of the call starting at `at`."""

    def __init__(self, real, at: int | None, target: str = "logits", amount: float = 1e-3) -> None:
        self.real, self.at, self.target, self.amount = real, at, target, amount
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def new_cache(self):
        return self.real.new_cache()

    def __call__(self, ids, mask, positions, cache):
        logits = self.real(ids, mask, positions, cache)
        self.calls.append((ids.clone(), mask.clone(), positions.clone()))
        if self.at is None or int(positions[0, 0]) != self.at:
            return logits
        if self.target == "logits":
            logits = logits.clone()
            logits[1, 17] += self.amount
        else:  # "cache layer N K"
            layer = int(self.target.split()[2])
            cache.layers[layer].keys[1, 0, -1, 0] += self.amount
        return logits


def prompt_block_of(z: list[int], runtime: Runtime) -> list[int]:
    return z[: z.index(runtime.grammar.delims.closers[0]) + 1]


@pytest.mark.parametrize("construction", ["prefill", "incremental", "live"])
def test_unperturbed_constructions_pass_the_batch_check(fp32_runtime, shortest_z, construction):
    arg = prompt_block_of(shortest_z, fp32_runtime) if construction == "live" else shortest_z
    boundary = getattr(constructions, construction)(fp32_runtime, arg)
    assert boundary.tokens[-1] == fp32_runtime.grammar.delims.openers[4], (
        f"{construction}: boundary does not end at <|merge|> (last token {boundary.tokens[-1]})"
    )


def test_prefill_with_a_perturbed_copy_fails_closed(fp32_runtime, shortest_z, monkeypatch):
    monkeypatch.setattr(fp32_runtime, "_forward", Perturb(fp32_runtime._forward, at=0))
    with pytest.raises(PhysicalBatchDesync, match=DESYNC.format(
            where=re.escape("prefill call at position 0 (logits)"), copy=1, diff=r"(?P<diff>[0-9.e+-]+)")) as info:
        constructions.prefill(fp32_runtime, shortest_z)
    diff = float(re.search(r"max \|diff\| (\S+)$", str(info.value)).group(1))
    assert diff == pytest.approx(1e-3, rel=1e-3), f"reported max |diff| {diff}, the perturbation was 1e-3"


@pytest.mark.parametrize(("construction", "at", "where"), [
    pytest.param("incremental", 0, "incremental call at position 0 (logits)", id="incremental-prompt-call"),
    pytest.param("incremental", 60, "incremental call at position 60 (logits)", id="incremental-decode-step"),
    pytest.param("live", 0, "live prompt block (logits)", id="live-prompt-block"),
    pytest.param("live", 25, "live token 25 (logits)", id="live-decode-step"),
])
def test_desync_names_the_step(fp32_runtime, shortest_z, monkeypatch, construction, at, where):
    monkeypatch.setattr(fp32_runtime, "_forward", Perturb(fp32_runtime._forward, at=at))
    arg = prompt_block_of(shortest_z, fp32_runtime) if construction == "live" else shortest_z
    with pytest.raises(PhysicalBatchDesync, match=DESYNC.format(where=re.escape(where), copy=1, diff=r"\S+")):
        getattr(constructions, construction)(fp32_runtime, arg)


def test_a_desynced_boundary_cache_fails_closed(fp32_runtime, shortest_z, monkeypatch):
    # The logits agree but copy 1 of layer 2's K differs: the boundary check on the cache catches it.
    monkeypatch.setattr(fp32_runtime, "_forward", Perturb(fp32_runtime._forward, at=0, target="cache layer 2 K"))
    with pytest.raises(PhysicalBatchDesync, match=DESYNC.format(
            where=re.escape("prefill boundary cache layer 2 K"), copy=1, diff=r"\S+")):
        constructions.prefill(fp32_runtime, shortest_z)


class Poison(Perturb):
    """Both copies of the call starting at `at` get the same non-finite logit: bitwise equal, yet unusable."""

    def __call__(self, ids, mask, positions, cache):
        logits = self.real(ids, mask, positions, cache)
        if int(positions[0, 0]) == self.at:
            logits = logits.clone()
            logits[:, 17] = self.amount
        return logits


@pytest.mark.parametrize(("construction", "at", "value", "where", "counts"), [
    pytest.param("prefill", 0, float("nan"), "prefill call at position 0 (logits)", "2 NaN and 0 infinite",
                 id="prefill-nan"),
    pytest.param("incremental", 60, float("inf"), "incremental call at position 60 (logits)", "0 NaN and 2 infinite",
                 id="incremental-inf"),
    pytest.param("live", 25, float("nan"), "live token 25 (logits)", "2 NaN and 0 infinite", id="live-nan"),
])
def test_non_finite_logits_in_every_copy_fail_closed_naming_the_call(fp32_runtime, shortest_z, monkeypatch,
                                                                     construction, at, value, where, counts):
    monkeypatch.setattr(fp32_runtime, "_forward", Poison(fp32_runtime._forward, at=at, amount=value))
    arg = prompt_block_of(shortest_z, fp32_runtime) if construction == "live" else shortest_z
    with pytest.raises(NonFinite, match=re.escape(where) + f": {counts} values of \\d+"):
        getattr(constructions, construction)(fp32_runtime, arg)


def test_every_call_gets_the_4d_mask_explicit_positions_and_two_copies(fp32_runtime, shortest_z, monkeypatch):
    spy = Perturb(fp32_runtime._forward, at=None)
    monkeypatch.setattr(fp32_runtime, "_forward", spy)
    boundary = constructions.incremental(fp32_runtime, shortest_z)
    roles = torch.tensor(boundary.roles)
    prompt_len = len(prompt_block_of(shortest_z, fp32_runtime))
    assert len(spy.calls) == 1 + len(shortest_z) - prompt_len, (
        f"{len(spy.calls)} forward calls, expected the prompt block then one per token "
        f"({1 + len(shortest_z) - prompt_len})"
    )
    for ids, mask, positions in (spy.calls[0], spy.calls[-1]):
        start, end = int(positions[0, 0]), int(positions[0, -1]) + 1
        assert ids.shape == (2, end - start), f"call at {start}: ids shape {tuple(ids.shape)}"
        assert torch.equal(ids[0], ids[1]), f"call at {start}: the two copies carry different tokens"
        assert ids[0].tolist() == shortest_z[start:end], f"call at {start}: tokens differ from z"
        assert torch.equal(positions[1], torch.arange(start, end)), f"call at {start}: positions {positions[1]}"
        assert mask.shape == (2, 1, end - start, end), f"call at {start}: mask shape {tuple(mask.shape)}"
        expected = visibility_rows(roles[start:end], roles[:end], start)
        assert torch.equal(mask[0, 0], expected) and torch.equal(mask[1, 0], expected), (
            f"call at {start}: 4D mask differs from the visibility contract"
        )
