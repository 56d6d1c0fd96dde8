#!/usr/bin/env bash
# Wall time of one `replaytests audit` at two commits, on this machine, one after the other:
#   benchmarks/before_after.sh BEFORE_COMMIT OUT_DIR [audit arguments...]
# e.g. benchmarks/before_after.sh 30be65c /tmp/ba --workers 2
#      benchmarks/before_after.sh 30be65c /tmp/ba --workers 2 --rows 12 --model "$(replaytests models prepare smollm2)" \
#          --bank fixtures/banks/smollm2.jsonl --contract contracts/cpu-smollm2.yaml
# BEFORE runs from a git worktree put first on PYTHONPATH (the same venv, the same installed packages);
# AFTER is this checkout. Prints each wall time, exit status, and whether the two ledgers hold the same
# records. Not a timed test: one run each, in sequence, on a machine left otherwise idle.
set -euo pipefail
before=$1 out=$2
shift 2
here=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
mkdir -p "$out"
tree="$out/worktree"
[ -d "$tree" ] || git -C "$here" worktree add --detach "$tree" "$before" >/dev/null
run() {  # name, directory, PYTHONPATH, audit arguments...
    local name=$1 dir=$2 path=$3 start end code=0
    shift 3
    start=$(date +%s.%N)
    (cd "$dir" && PYTHONPATH="$path" python -m replaytests.cli audit --report-dir "$out/runs" --run-name "$name" \
        "$@" >"$out/$name.log" 2>&1) || code=$?
    end=$(date +%s.%N)
    echo "$name: $(echo "$end - $start" | bc) s, exit $code"
}
run before "$tree" "$tree/src" "$@"
run after "$here" "" "$@"
python - "$out/runs/before/ledger.jsonl" "$out/runs/after/ledger.jsonl" <<'PY'
import json, sys
before, after = ([json.loads(line) for line in open(path)] for path in sys.argv[1:])
print(f"ledgers: {len(before)} and {len(after)} records, {'the same' if before == after else 'DIFFERENT'}")
PY
