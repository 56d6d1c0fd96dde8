"""A Hugging Face checkpoint made into the GGUF llama.cpp runs, with llama.cpp's own tools
(`replaytests models gguf NAME --type TYPE`, docs/llamacpp.md).

llama.cpp's converter (convert_hf_to_gguf.py, which tools/install-llamacpp.sh keeps beside the build, from
the same sdist) writes the weights at their stored width: bf16 stays bf16, so nothing is rounded on the
way. A quantized type (q8_0, q4_1, …) is then made from that file by llama.cpp's quantizer
(`llama_model_quantize`), as `llama-quantize` makes it. Both are deterministic: the same checkpoint and
build give the same bytes, whose sha256 a run records as the model's digest.

The file goes to the cache (the CLI's is $REPLAYTESTS_CACHE/gguf/), named by the checkpoint's digest, with a record
beside it (`.json`: the source directory and its model digest, the type, the converter's version, the
file's sha256). A second call with the same checkpoint and build finds it and returns at once; a file is
written beside its place and renamed, so a GGUF in the cache is always whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from replaytests.engine.llamacpp.context import INSTALL, quantize, version
from replaytests.errors import ConfigError
from replaytests.files import lookup, read_json, regular_file, sha256_file, write_json_atomic

CONVERTER = "llamacpp-converter"  # the folder tools/install-llamacpp.sh puts in the venv
WIDTHS = ("f32", "f16", "bf16")   # written by the converter itself
QUANTIZED = ("q8_0", "q6_k", "q5_1", "q5_0", "q5_k_m", "q4_1", "q4_0", "q4_k_m", "q3_k_m", "q2_k")
TYPES = WIDTHS + QUANTIZED


def to_gguf(source: Path, digest: str, kind: str, name: str, cache: Path) -> Path:
    """The GGUF of the Hugging Face directory `source` (its model digest `digest`) at `kind`, made once and
    kept in the folder `cache`."""
    if kind not in TYPES:
        raise ConfigError(f"--type {kind}: expected one of {', '.join(TYPES)}")
    out = cache / f"{name}-{digest[:12]}.{kind}.gguf"
    record = out.with_name(out.name + ".json")
    wanted = {"source": str(source), "source_model_sha256": digest, "type": kind,
              "llama_cpp_python": version()}
    if out.is_file() and not out.is_symlink() and _matches(record, wanted, out):
        return out
    _check_source(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as work:
        width = kind if kind in WIDTHS else _stored_width(source)
        converted = Path(work) / f"{name}.{width}.gguf"
        _convert(source, converted, width, name)
        made = converted
        if kind not in WIDTHS:
            made = Path(work) / out.name
            quantize(converted, made, kind, os.cpu_count() or 1)
        sha = sha256_file(made, "the converted GGUF", ConfigError)
        os.replace(made, out)
    write_json_atomic(record, {**wanted, "sha256": sha})
    return out


def _check_source(source: Path) -> None:
    """Every file of the checkpoint is a regular one (the converter reads them, and a FIFO would block it for
    ever), and its weights are safetensors: the converter reads `pytorch_model*.bin` (pickle) only where it finds
    no safetensors, and weights are never read from pickle here."""
    for path in sorted(source.iterdir()):
        if not path.is_dir():
            regular_file(path, "a model file", ConfigError)
    if not (source / "config.json").is_file():
        raise ConfigError(f"{source}: no config.json; a Hugging Face model directory is expected")
    if not any(source.glob("*.safetensors")):
        raise ConfigError(f"{source}: no *.safetensors weights (only safetensors are converted, never pickle)")


def _matches(record: Path, wanted: dict, out: Path) -> bool:
    """The record beside a cached GGUF names this checkpoint, type and converter, and the file's bytes (a record
    that cannot be read is no match: the GGUF is made again, and the record written over)."""
    try:
        found = read_json(record, "conversion record", ConfigError, 1 << 16)
    except ConfigError:
        return False
    return (all(lookup(found, key) == value for key, value in wanted.items())
            and lookup(found, "sha256") == sha256_file(out, "the cached GGUF", ConfigError))


def _stored_width(source: Path) -> str:
    """bf16 where the checkpoint stores bf16 (converted without rounding), else f32."""
    try:
        config = read_json(source / "config.json", "model config", ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; a Hugging Face model directory is expected") from None
    stored = lookup(config, "dtype") or lookup(config, "torch_dtype")
    return "bf16" if stored == "bfloat16" else "f32"


def _convert(source: Path, out: Path, width: str, name: str) -> None:
    converter = Path(sys.prefix) / CONVERTER
    if not (converter / "convert_hf_to_gguf.py").is_file():
        raise ConfigError(f"{converter}: llama.cpp's converter is not in this venv; install it with {INSTALL}")
    command = [sys.executable, "-m", "replaytests.engine.llamacpp.hf_to_gguf", str(converter), str(source),
               "--outfile", str(out), "--outtype", width, "--model-name", name]
    # The converter's own gguf-py, not whatever gguf is installed: NO_LOCAL_GGUF would pick the latter.
    env = {key: value for key, value in os.environ.items() if key != "NO_LOCAL_GGUF"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or not out.is_file():
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise ConfigError(f"{source}: llama.cpp's converter failed ({lines[-1] if lines else done.returncode})")
