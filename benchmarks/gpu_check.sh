#!/usr/bin/env bash
# The GPU check (issue 7), within about 8 minutes on one H200:
#   (a) the conformance suite on CUDA, tiny model, BF16 and FP32, contracts/h200.yaml;
#   (b) a seeded ~270M-parameter Qwen2 (benchmarks/large_model.py): freeze a bank of 1k-4k-token
#       prefixes, then the fixed-prefix crossing on it under a contract extending h200.yaml;
#   (c) the benchmarks (benchmarks/run.py) on CUDA, tiny and larger model.
# Everything lands in OUT_DIR (default: $OUT, else benchmarks/results/gpu-check): logs/, reports, bench JSON.
# Needs only torch, transformers, pytest, pytest-xdist, numpy, scipy, pyyaml, safetensors and this repo
# (installed with `pip install --no-deps --no-build-isolation -e .`, or used from src/ if that fails).
#
# usage: benchmarks/gpu_check.sh [--cpu-smoke] [OUT_DIR]
#   --cpu-smoke  the same steps at toy sizes on the CPU (a couple of minutes), to test this script.
# Environment: GPU_CHECK_BUDGET (seconds for all steps, default 470), GPU_CHECK_WORKERS (xdist workers, 4),
#   LARGE_ROWS (problems of the larger model, 8), PYTHON (interpreter, python).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
SMOKE=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then SMOKE=1; shift; fi
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
  echo "usage: benchmarks/gpu_check.sh [--cpu-smoke] [OUT_DIR]" >&2; exit 2
fi
OUT_DIR=${1:-${OUT:-benchmarks/results/gpu-check}}
mkdir -p "$OUT_DIR/logs" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 2
PY=${PYTHON:-python}
BUDGET=${GPU_CHECK_BUDGET:-470}
WORKERS=${GPU_CHECK_WORKERS:-4}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
BEGAN=$SECONDS
STATUS=()
declare -A RC=()

# step and skip: benchmarks/steps.sh
source benchmarks/steps.sh

# ---- setup: the package and its pytest plugin (entry point), or src/ with -p as a fallback
PLUGIN=()
has_plugin() {
  "$PY" -c "import importlib.metadata as m, replaytests; \
assert any(e.value == 'replaytests.suite.plugin' for e in m.entry_points(group='pytest11'))" 2>/dev/null
}
if ! has_plugin; then
  step install 180 "$PY" -m pip install --no-deps --no-build-isolation -e .
  if ! has_plugin; then
    echo "   replaytests is not installed: using PYTHONPATH=src and -p replaytests.suite.plugin"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    PLUGIN=(-p replaytests.suite.plugin)
  fi
fi
PYTEST=("$PY" -m pytest --pyargs replaytests.conformance -p no:cacheprovider -p no:json-report -q "${PLUGIN[@]}")
CLI=("$PY" -m replaytests.cli)

if ((SMOKE)); then
  DEVICE=cpu
  TINY_ARGS=(--rows 1 -p no:xdist)
  LARGE_SIZE=(--hidden 128 --layers 2 --heads 2 --kv-heads 1 --intermediate 256 --max-positions 2048)
  LARGE_PROBLEMS=(--count 2 --min-bytes 200 --max-bytes 400)
  LARGE_CONTRACT=(--device cpu)
  PARALLEL=(-p no:xdist)
  BENCH_TINY=(--smoke)
  # cpu-tiny pins AVX2, and benchmarks/run.py imports torch before it reads the contract
  BENCH_ENV=(env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
  BENCH_LARGE=(--smoke)
else
  DEVICE=cuda
  if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: CUDA is not available here (use --cpu-smoke to test the script on a CPU)" >&2; exit 2
  fi
  TINY_ARGS=(-n "$WORKERS" --dist loadgroup)
  LARGE_SIZE=()
  LARGE_PROBLEMS=(--count "${LARGE_ROWS:-8}" --min-bytes 900 --max-bytes 3900)
  LARGE_CONTRACT=()
  PARALLEL=(-n "$WORKERS" --dist loadgroup)
  BENCH_TINY=()
  BENCH_ENV=()
  BENCH_LARGE=(--lengths 1024,4096 --row-lengths 1024,2048,4096 --reps 3)
  timeout 30 nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1
fi
timeout 60 "${CLI[@]}" env --contract contracts/h200.yaml --device "$DEVICE" >"$OUT_DIR/env.txt" 2>&1

# ---- (a) the conformance suite, tiny model, BF16 and FP32, on contracts/h200.yaml
step tiny-suite 240 "${PYTEST[@]}" --contract contracts/h200.yaml --device "$DEVICE" --precision both \
  --report-dir "$OUT_DIR/tiny-h200" "${TINY_ARGS[@]}"
if [[ -f "$OUT_DIR/tiny-h200/ledger.jsonl" ]]; then
  step tiny-report 60 "${CLI[@]}" report "$OUT_DIR/tiny-h200"
fi

# ---- (b) the larger model: build, freeze a bank of long prefixes, the fixed-prefix crossing
LARGE="$WORK/large-model"
INPUTS="$OUT_DIR/large-inputs"
mkdir -p "$INPUTS"
if step large-build 150 "$PY" benchmarks/large_model.py model --out "$LARGE" "${LARGE_SIZE[@]}" &&
   step large-problems 30 "$PY" benchmarks/large_model.py problems --out "$INPUTS/problems.jsonl" \
     "${LARGE_PROBLEMS[@]}" &&
   step large-contract 30 "$PY" benchmarks/large_model.py contract --out "$INPUTS/contract.yaml" \
     "${LARGE_CONTRACT[@]}" &&
   step large-freeze 150 "${CLI[@]}" freeze --model "$LARGE" --problems "$INPUTS/problems.jsonl" \
     --contract "$INPUTS/contract.yaml" --out "$INPUTS/bank.jsonl" --force &&
   step large-contract2 30 "$PY" benchmarks/large_model.py contract --out "$INPUTS/contract.yaml" \
     --bank "$INPUTS/bank.jsonl" "${LARGE_CONTRACT[@]}"; then
  step large-crossing 240 "${PYTEST[@]}" --model "$LARGE" --bank "$INPUTS/bank.jsonl" \
    --contract "$INPUTS/contract.yaml" --device "$DEVICE" --precision both --report-dir "$OUT_DIR/large-h200" \
    -k "crossing or incremental_vs_prefill" "${PARALLEL[@]}"
else
  skip large-crossing "an earlier large-model step failed or was skipped"
fi

# ---- (c) the benchmarks on the device: tiny model, then the larger one
step bench-tiny 150 "${BENCH_ENV[@]}" "$PY" benchmarks/run.py --device "$DEVICE" --out "$OUT_DIR/bench-tiny-$DEVICE.json" \
  "${BENCH_TINY[@]}"
if [[ "${RC[large-build]:-}" == 0 ]]; then
  step bench-large 150 "$PY" benchmarks/run.py --device "$DEVICE" --model "$LARGE" \
    --contract "$INPUTS/contract.yaml" --out "$OUT_DIR/bench-large-$DEVICE.json" "${BENCH_LARGE[@]}"
else
  skip bench-large "the larger model was not built"
fi

# ---- summary
{
  echo "gpu_check on $DEVICE$( ((SMOKE)) && echo ' (CPU smoke: toy sizes)'), $((SECONDS - BEGAN))s of a ${BUDGET}s budget"
  printf '%s\n' "${STATUS[@]}"
  for log in tiny-suite large-crossing; do
    [[ -f "$OUT_DIR/logs/$log.log" ]] || continue
    echo; echo "-- $log"
    sed -n '/replaytests summary/,/^ledger:/p' "$OUT_DIR/logs/$log.log"
    tail -n 1 "$OUT_DIR/logs/$log.log"
  done
  for md in "$OUT_DIR"/bench-*.md; do
    [[ -f "$md" ]] && { echo; echo "-- $(basename "$md")"; cat "$md"; }
  done
  echo; echo "outputs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"
FAILED=0
for name in "${!RC[@]}"; do [[ "${RC[$name]}" == 0 ]] || FAILED=1; done
exit "$FAILED"
