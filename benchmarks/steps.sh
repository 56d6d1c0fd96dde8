# The time-boxed steps the GPU scripts share (benchmarks/gpu_check.sh, benchmarks/gpu_lent.sh), sourced by each after
# it sets OUT_DIR, BUDGET and BEGAN and declares STATUS=() and RC=() (declare -A).
# shellcheck shell=bash

# step NAME LIMIT_S COMMAND...: run with a time box (clipped to what is left of the budget), log to
# logs/NAME.log, record the outcome; never stops the script.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - BEGAN)))
  ((limit > left)) && limit=$left
  if ((limit < 15)); then
    RC[$name]=skipped; STATUS+=("$(printf '%-16s skipped (budget of %ss spent)' "$name" "$BUDGET")"); return 1
  fi
  local start=$SECONDS rc
  echo "== $name (time box ${limit}s)"
  timeout --kill-after=15 "$limit" "$@" >"$OUT_DIR/logs/$name.log" 2>&1
  rc=$?
  tail -n 3 "$OUT_DIR/logs/$name.log" | sed 's/^/   /'
  RC[$name]=$rc
  local note=""; ((rc == 124 || rc == 137)) && note=" (timed out)"
  STATUS+=("$(printf '%-16s rc %-3s %4ss%s' "$name" "$rc" "$((SECONDS - start))" "$note")")
  return "$rc"
}

skip() {  # skip NAME REASON
  RC[$1]=skipped; STATUS+=("$(printf '%-16s skipped (%s)' "$1" "$2")")
}
