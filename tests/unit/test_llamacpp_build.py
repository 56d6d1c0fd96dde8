"""Which llama.cpp build a run ran on (engine/llamacpp/build.py): the record tools/install-llamacpp.sh writes, what
the run's platform carries of it, and the committed baseline a run of each build is audited against.

Two builds (docs/llamacpp.md "Two builds"): `avx2` (fixed ISA, llamafile off) and `user` (pip's defaults:
-march=native, llamafile on). A baseline of one build is platform drift to a run of the other, never a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replaytests.engine.llamacpp import build as llamacpp_build
from replaytests.inputs import cpu_isa
from replaytests.inputs.gates import same_platform
from replaytests.inputs.options import COMMITTED, SMOLLM2_CAUSAL_BANK, SMOLLM2_LLAMACPP_CONTRACT, Options
from replaytests.inputs.platforms import platform_differences

AVX2 = {"version": "0.3.36", "isa": "avx2", "cmake_args": "-DGGML_NATIVE=OFF -DGGML_LLAMAFILE=OFF", "cores": 2}
USER = {"version": "0.3.36", "isa": "user", "cmake_args": "", "native": True, "llamafile": True,
        "cpu": "AMD EPYC", "cpu_flags_sha256": "0123456789ab", "cores": 2}


def _platform(build: dict, cpu: str = "AMD EPYC") -> dict:
    """A llama.cpp run's platform as runtime.describe records it, for `build`."""
    settings = {"chunk": 64, "flash_attention": False, "n_ctx": 1024, "version": build["version"],
                **llamacpp_build.platform_settings(build), "system_info": "CPU : AVX2 = 1 |"}
    return {"hardware.device_kind": "cpu", "hardware.cpu": cpu, "environment.cpu_isa": "AVX2",
            "environment.cpu_threads": 1, "software.llama_cpp": build["version"], "runtime.llamacpp": settings}


def test_a_fixed_isa_build_records_no_cpu_and_a_native_build_the_cpu_it_was_built_for():
    assert llamacpp_build.platform_settings(AVX2) == {"build_isa": "avx2"}
    assert llamacpp_build.platform_settings(USER) == {
        "build_isa": "user", "build_cpu": "AMD EPYC (cpuinfo flags sha256 0123456789ab)"}
    assert llamacpp_build.platform_settings(None) == {"build_isa": None}
    assert llamacpp_build.of_platform(_platform(USER)) == ("user", "AMD EPYC (cpuinfo flags sha256 0123456789ab)")
    assert llamacpp_build.of_platform({"hardware.cpu": "x"}) == (None, None)


def test_the_committed_avx2_baseline_s_platform_is_what_an_avx2_build_records_today():
    """Recording build_cpu only for a native build leaves an avx2 run's platform as the committed baseline's:
    no drift where nothing changed."""
    run = json.loads((COMMITTED[-1].baselines[0].parent / "run.json").read_text())
    recorded = run["platform"]["runtime.llamacpp"]
    assert recorded["build_isa"] == "avx2", recorded
    build = run["environment"]["llamacpp_build"]
    here = {**recorded, **llamacpp_build.platform_settings(build)}
    assert platform_differences(run["platform"], {**run["platform"], "runtime.llamacpp": here}, "baseline") == []


@pytest.mark.parametrize(("baseline", "run", "named"), [
    pytest.param(AVX2, USER, "runtime.llamacpp.build_isa avx2 (baseline) vs user (here)", id="avx2-baseline"),
    pytest.param(USER, AVX2, "runtime.llamacpp.build_isa user (baseline) vs avx2 (here)", id="user-baseline"),
    pytest.param(USER, {**USER, "cpu_flags_sha256": "ba9876543210"}, "runtime.llamacpp.build_cpu", id="other-cpu"),
])
def test_a_baseline_of_another_build_is_platform_drift_naming_the_build(baseline, run, named):
    differences = platform_differences(_platform(baseline), _platform(run), "baseline")
    assert any(line.startswith(named) for line in differences), differences
    judged = same_platform("baseline", differences, strict=False)
    assert judged.outcome == "recorded" and named in judged.message, judged
    assert same_platform("baseline", differences, strict=True).outcome == "fail"
    assert platform_differences(_platform(run), _platform(run), "baseline") == []


def _committed_with(tmp_path: Path, builds: dict[str, dict]):
    """A committed llama.cpp input set whose baselines were made by `builds` (name: build record)."""
    baselines = []
    for name, build in builds.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "ledger.jsonl").write_text("")
        (tmp_path / name / "run.json").write_text(json.dumps({"platform": _platform(build)}))
        baselines.append(tmp_path / name / "ledger.jsonl")
    committed = COMMITTED[-1]
    return type(committed)(committed.bank, committed.contract, tuple(baselines), None, "llamacpp")


@pytest.mark.parametrize(("here", "chosen"), [
    pytest.param(AVX2, "avx2", id="avx2"),
    pytest.param(USER, "user", id="user"),
    pytest.param({**USER, "cpu_flags_sha256": "ba9876543210"}, "user", id="user-built-on-another-cpu"),
    pytest.param({**AVX2, "isa": "avx512"}, "avx2", id="a-build-without-a-baseline-gets-the-reference"),
])
def test_a_llamacpp_run_takes_the_baseline_of_its_own_build(tmp_path, monkeypatch, here, chosen):
    committed = _committed_with(tmp_path, {"avx2": AVX2, "user": USER})
    monkeypatch.setattr(llamacpp_build, "record", lambda prefix=None: here)
    monkeypatch.setattr(cpu_isa, "cpu_model", lambda: "AMD EPYC")
    assert committed.baseline() == tmp_path / chosen / "ledger.jsonl", committed.baseline()


def test_the_committed_llamacpp_set_holds_one_baseline_per_build():
    """The committed SmolLM2 llama.cpp baselines: the avx2 build's first (the reference), then the user build's;
    each run.json records the build it names."""
    options = Options(bank=SMOLLM2_CAUSAL_BANK, contract=SMOLLM2_LLAMACPP_CONTRACT, backend="llamacpp")
    committed = options.committed
    assert committed is not None and committed.backend == "llamacpp"
    builds = [llamacpp_build.of_platform(json.loads((path.parent / "run.json").read_text())["platform"])[0]
              for path in committed.baselines if path.is_file()]
    assert builds == ["avx2", "user"][:len(builds)] and builds, builds


def test_a_record_that_is_not_a_json_object_is_no_record(tmp_path):
    (tmp_path / llamacpp_build.BUILD_RECORD).write_text("[1, 2]")
    assert llamacpp_build.record(tmp_path) is None
    (tmp_path / llamacpp_build.BUILD_RECORD).write_text(json.dumps(USER))
    assert llamacpp_build.record(tmp_path) == USER
    assert llamacpp_build.record(tmp_path / "nowhere") is None
