#!/usr/bin/env bash
# Which numeric setting makes the two copies of a physical batch disagree on a GPU? The first GPU check
# (benchmarks/gpu_check.sh on one H200, torch 2.11.0+cu130) excluded 6 of 48 BF16 rows of the tiny model
# with PhysicalBatchDesync: copy 1's logits differed from copy 0's. This runs the BF16 suite of the tiny
# model under contracts/h200.yaml and under variants of it, side by side in one run (each variant in its
# own pytest process, all at once), and counts per variant the rows excluded for a desync and the failures.
#
# usage: benchmarks/gpu_batch_invariance.sh [OUT_DIR]   (default: $OUT, else benchmarks/results/batch-invariance)
# Environment: DEVICE (cuda; cpu with VARIANT_ARGS="--rows 0:1" tests this script), VARIANT_ARGS (more pytest
#   arguments), VARIANT_BUDGET (seconds each variant may run, default 240), VARIANT_WORKERS (xdist workers
#   per variant, default 3), PYTHON (python).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=${1:-${OUT:-benchmarks/results/batch-invariance}}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || exit 2
PY=${PYTHON:-python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/batch-invariance.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT_DIR/install.log" 2>&1

# variant name -> the bf16 settings it adds to h200.yaml ("" = h200.yaml as is) and the environment it runs in
declare -A SETTINGS=([as-is]="" [sdpa-math]="sdpa_backend: math" [no-reduced-reduction]="bf16_reduced_precision_reduction: false"
                     [cublas-workspace]="")
declare -A ENVIRONMENT=([as-is]="" [sdpa-math]="" [no-reduced-reduction]="" [cublas-workspace]="CUBLAS_WORKSPACE_CONFIG=:4096:8")
VARIANTS=(as-is sdpa-math no-reduced-reduction cublas-workspace)
for name in "${VARIANTS[@]}"; do
  contract="$WORK/$name.yaml"
  printf 'extends: %s/contracts/h200.yaml\nname: h200-%s\n' "$PWD" "$name" >"$contract"
  [[ -n "${SETTINGS[$name]}" ]] && printf 'precisions:\n  bf16:\n    %s\n' "${SETTINGS[$name]}" >>"$contract"
  # shellcheck disable=SC2086
  env ${ENVIRONMENT[$name]} timeout --kill-after=10 "${VARIANT_BUDGET:-240}" "$PY" -m pytest --pyargs \
    replaytests.conformance -p no:cacheprovider -q --contract "$contract" --device "${DEVICE:-cuda}" --precision bf16 \
    ${VARIANT_ARGS:-} -n "${VARIANT_WORKERS:-3}" --dist loadgroup --report-dir "$WORK/runs-$name" >"$OUT_DIR/$name.log" 2>&1 &
done
wait
{
  printf '%-22s %-30s %s\n' variant "rows excluded (desync)" "pytest"
  for name in "${VARIANTS[@]}"; do
    rows=$(grep -oE '(live|crossing|bridge|batch) row tiny-[0-9]+ \(bf16\) excluded: PhysicalBatchDesync' \
      "$OUT_DIR/$name.log" | sort -u | grep -oE 'tiny-[0-9]+' | sort -u | tr '\n' ' ')
    printf '%-22s %-30s %s\n' "$name" "$(wc -w <<<"$rows") ${rows:+($rows)}" \
      "$(grep -E '^[0-9]+ (passed|failed)|in [0-9.]+s' "$OUT_DIR/$name.log" | tail -1)"
  done
} | tee "$OUT_DIR/summary.txt"
