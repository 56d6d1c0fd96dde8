#!/usr/bin/env bash
# The one script a session runs when a GPU is lent to it (issue 51), within about 8 minutes on one H200:
#   (c) record: the machine a GPU baseline is keyed by (GPU model, compute capability, torch, CUDA, cuDNN,
#       driver, SDPA priority) -> machine.json;
#   (b) matrix: SDPA kernel {math, flash, efficient, cudnn, default} x cell {bf16, fp16, fp32} x 3 repeats on
#       the tiny model's physical batch (benchmarks/attention_matrix.py): rows excluded for
#       PhysicalBatchDesync and replica differences per (kernel, cell, repeat) -> attention-matrix.{json,md};
#   (a) gpu-check: benchmarks/gpu_check.sh under contracts/h200.yaml (SDPA math pinned at BF16), with what is
#       left of the budget -> gpu-check/.
# Everything lands in OUT_DIR (default: $OUT, else benchmarks/results/gpu-lent); summary.txt says it all.
#
# usage: benchmarks/gpu_lent.sh [--cpu-smoke] [OUT_DIR]
#   --cpu-smoke  the same steps at toy sizes on the CPU (the math kernel only), to test this script.
# Environment: GPU_LENT_BUDGET (seconds for all steps, default 450), GPU_LENT_MATRIX_BUDGET (seconds of it
#   for the matrix, default 150), GPU_LENT_ROWS (the bank rows the matrix tries first, then the rest of the
#   bank while time is left), GPU_CHECK_WORKERS (xdist workers of gpu_check.sh, default 6), PYTHON (python).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
SMOKE=0
if [[ "${1:-}" == "--cpu-smoke" ]]; then SMOKE=1; shift; fi
if [[ $# -gt 1 || "${1:-}" == -* ]]; then
  echo "usage: benchmarks/gpu_lent.sh [--cpu-smoke] [OUT_DIR]" >&2; exit 2
fi
OUT_DIR=${1:-${OUT:-benchmarks/results/gpu-lent}}
mkdir -p "$OUT_DIR/logs" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 2
PY=${PYTHON:-python}
BUDGET=${GPU_LENT_BUDGET:-450}
MATRIX_BUDGET=${GPU_LENT_MATRIX_BUDGET:-150}
# The rows the first H200 runs excluded for a desync (benchmarks/README.md), tried first.
ROWS=${GPU_LENT_ROWS:-tiny-005,tiny-006,tiny-009,tiny-016,tiny-038,tiny-047}
BEGAN=$SECONDS
STATUS=()
declare -A RC=()

# step (and skip): benchmarks/steps.sh, as gpu_check.sh runs them
source benchmarks/steps.sh

# The matrix and the recorder import replaytests from src/ (gpu_check.sh installs the package itself).
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ((SMOKE)); then
  DEVICE=cpu
  MATRIX_SIZE=(--rows 1 --repeats 2 --families crossing)
  CHECK=(benchmarks/gpu_check.sh --cpu-smoke)
else
  DEVICE=cuda
  if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_lent: CUDA is not available here (use --cpu-smoke to test the script on a CPU)" >&2; exit 2
  fi
  MATRIX_SIZE=(--rows "$ROWS" --repeats 3)
  CHECK=(benchmarks/gpu_check.sh)
  timeout 30 nvidia-smi >"$OUT_DIR/nvidia-smi.txt" 2>&1
fi

# ---- (c) the machine
step record 60 "$PY" benchmarks/attention_matrix.py record --device "$DEVICE" --out "$OUT_DIR/machine.json"

# ---- (b) the attention-kernel matrix (its own budget, and 60 s for loading and writing)
step matrix $((MATRIX_BUDGET + 60)) "$PY" benchmarks/attention_matrix.py matrix --device "$DEVICE" \
  --out-dir "$OUT_DIR/matrix" --budget "$MATRIX_BUDGET" "${MATRIX_SIZE[@]}"
for file in attention-matrix.json attention-matrix.md; do
  [[ -f "$OUT_DIR/matrix/$file" ]] && cp "$OUT_DIR/matrix/$file" "$OUT_DIR/$file"
done

# ---- (a) gpu_check.sh under the pinned contract, with the rest of the budget
LEFT=$((BUDGET - (SECONDS - BEGAN) - 10))
step gpu-check $((LEFT + 5)) env GPU_CHECK_BUDGET="$LEFT" GPU_CHECK_WORKERS="${GPU_CHECK_WORKERS:-6}" PYTHON="$PY" \
  "${CHECK[@]}" "$OUT_DIR/gpu-check"

# ---- summary
{
  echo "gpu_lent on $DEVICE$( ((SMOKE)) && echo ' (CPU smoke: toy sizes)'), $((SECONDS - BEGAN))s of a ${BUDGET}s budget"
  printf '%s\n' "${STATUS[@]}"
  [[ -f "$OUT_DIR/machine.json" ]] && "$PY" -c \
    "import json, sys; print('machine:', json.load(open(sys.argv[1]))['key'])" "$OUT_DIR/machine.json"
  if [[ -f "$OUT_DIR/attention-matrix.md" ]]; then
    echo; echo "-- attention-kernel matrix (attention-matrix.md)"; cat "$OUT_DIR/attention-matrix.md"
  fi
  if [[ -f "$OUT_DIR/gpu-check/summary.txt" ]]; then
    echo; echo "-- gpu_check.sh (gpu-check/summary.txt)"; cat "$OUT_DIR/gpu-check/summary.txt"
  fi
  echo; echo "outputs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"
FAILED=0
for name in "${!RC[@]}"; do [[ "${RC[$name]}" == 0 ]] || FAILED=1; done
exit "$FAILED"
