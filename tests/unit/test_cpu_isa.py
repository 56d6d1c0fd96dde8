"""replaytests.inputs.cpu_isa: when the contract's CPU level is applied, when it is not (and why), and the
read-back of the level torch's kernels dispatch to."""

from __future__ import annotations

import os

import pytest
import torch

from replaytests.inputs import cpu_isa
from replaytests.inputs.cpu_isa import ATEN, LEVELS, MARK, ONEDNN

AVX512_FLAGS = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.fixture
def clean_env(monkeypatch):
    """No dispatch variable set; whatever this process had is restored afterwards."""
    for name in (ATEN, ONEDNN, MARK):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def dispatch_env() -> dict:
    return {name: os.environ.get(name) for name in (ATEN, ONEDNN, MARK)}


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_a_supported_level_sets_both_variables_and_the_mark(clean_env, level):
    pinned = cpu_isa.pin(level, AVX512_FLAGS, "x86_64")
    assert (pinned.applied, pinned.note) == (True, ""), pinned
    assert dispatch_env() == {ATEN: LEVELS[level].aten, ONEDNN: LEVELS[level].onednn, MARK: level}, dispatch_env()


@pytest.mark.parametrize(("level", "flags", "machine", "note"), [
    pytest.param("AVX512", {"avx2", "fma"}, "x86_64", "this CPU lacks avx512f, avx512bw, avx512vl, avx512dq",
                 id="avx512-on-an-avx2-cpu"),
    pytest.param("AVX2", {"sse4_1"}, "x86_64", "this CPU lacks avx2, fma", id="avx2-on-an-older-cpu"),
    pytest.param("AVX2", AVX512_FLAGS, "aarch64", "this machine is aarch64, not x86-64", id="arm"),
])
def test_a_level_this_machine_cannot_run_is_not_applied(clean_env, level, flags, machine, note):
    pinned = cpu_isa.pin(level, flags, machine)
    assert (pinned.applied, pinned.note) == (False, note), pinned
    assert dispatch_env() == dict.fromkeys((ATEN, ONEDNN, MARK)), f"variables set anyway: {dispatch_env()}"


def test_variables_the_user_set_win(clean_env):
    clean_env.setenv(ATEN, "default")
    pinned = cpu_isa.pin("AVX2", AVX512_FLAGS, "x86_64")
    assert (pinned.applied, pinned.note) == (False, f"set in the environment: {ATEN}=default"), pinned
    assert dispatch_env() == {ATEN: "default", ONEDNN: None, MARK: None}, dispatch_env()


def test_a_child_re_pins_what_a_parent_run_set(clean_env):
    cpu_isa.pin("AVX2", AVX512_FLAGS, "x86_64")  # as a parent replaytests process would
    pinned = cpu_isa.pin("DEFAULT", AVX512_FLAGS, "x86_64")
    assert pinned.applied, pinned
    assert dispatch_env() == {ATEN: "default", ONEDNN: "SSE41", MARK: "DEFAULT"}, dispatch_env()


def test_an_unpinned_contract_clears_what_a_parent_run_set(clean_env):
    cpu_isa.pin("AVX2", AVX512_FLAGS, "x86_64")
    pinned = cpu_isa.pin(None, AVX512_FLAGS, "x86_64")
    assert (pinned.applied, pinned.note) == (False, "the contract does not pin the CPU instruction set"), pinned
    assert dispatch_env() == dict.fromkeys((ATEN, ONEDNN, MARK)), dispatch_env()


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_1 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert cpu_isa.cpu_flags(cpuinfo) == {"fpu", "sse4_1", "avx2", "fma"}
    assert cpu_isa.cpu_flags(tmp_path / "missing") is None


def test_in_force_reads_torch_back():
    """The read-back is ATen's own capability (this process was pinned, or not, when pytest started)."""
    assert cpu_isa.in_force().split(" ")[0] == torch.backends.cpu.get_cpu_capability()


def test_an_applied_level_torch_does_not_run_is_one_line(monkeypatch):
    monkeypatch.setattr(cpu_isa, "in_force", lambda: "AVX512")
    message = cpu_isa.check_applied(cpu_isa.Pin("AVX2", True), "contract cpu-tiny (c.yaml)")
    assert message == ("contract cpu-tiny (c.yaml) pins cpu_isa AVX2, but torch already dispatches its CPU kernels "
                       "to AVX512 (torch ran before replaytests read the contract); run again with "
                       "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 set in the environment"), message
    assert cpu_isa.check_applied(cpu_isa.Pin("AVX2", False, "set in the environment"), "c") is None
