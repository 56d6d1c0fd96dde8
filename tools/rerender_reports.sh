#!/usr/bin/env bash
# Re-render the report (report.json, report.md, report.html) of every committed ledger under fixtures/ledgers/ with
# the code of a checkout, into OUT/<ledger>/ (each rendered in one fixed work directory, so paths in the reports
# do not differ between two renders). Two checkouts' renders compared show what a change of the outputs changed:
#   bash tools/rerender_reports.sh /tmp/before /path/to/old-checkout && bash tools/rerender_reports.sh /tmp/after
#   diff -r /tmp/before /tmp/after
# A run whose verdict is FAIL makes `replaytests report` exit 1; its files are written all the same.
set -euo pipefail
out=${1:?usage: tools/rerender_reports.sh OUT [CHECKOUT]}
checkout=$(cd "${2:-$(dirname "$0")/..}" && pwd)
ledgers=$(cd "$(dirname "$0")/../fixtures/ledgers" && pwd)
work=${TMPDIR:-/tmp}/replaytests-rerender/ledger  # one path for every render: reports name it
rm -rf "$out" && mkdir -p "$out"
for dir in "$ledgers"/*/; do
  name=$(basename "$dir")
  [ -f "$dir/ledger.jsonl" ] && [ -f "$dir/report.md" ] || continue
  rm -rf "$work" && mkdir -p "$work" && cp "$dir/ledger.jsonl" "$dir/run.json" "$work/"
  PYTHONPATH="$checkout/src" python -m replaytests.cli report "$work" --out "$work" --force > /dev/null || true
  mkdir -p "$out/$name" && cp "$work"/report.json "$work"/report.md "$work"/report.html "$out/$name/"
done
echo "rendered $(ls "$out" | wc -l) committed ledgers' reports with $checkout into $out"
