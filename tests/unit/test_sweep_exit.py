"""The sweep's divergence gate end to end, seen failing: where the contract forbids a cell's continuations to
diverge, a sweep point whose reference and edge continuations split fails the run, and pytest exits 1.

The row is the committed baseline's (fixtures/ledgers/cpu-tiny-cells: the contract pins AVX2, so every machine
plays the one it was made on); whether the control had something to find is the run's own records' to say, never
the baseline's."""

from __future__ import annotations

import importlib.util
import json
import sys

import forkserver
import pytest

from replaytests.inputs.gates import point_premise
from replaytests.inputs.options import REPO
from replaytests.outputs import ledger

CELLS = REPO / "contracts" / "cpu-tiny-cells.yaml"
BASELINE = REPO / "fixtures" / "ledgers" / "cpu-tiny-cells" / "ledger.jsonl"
BANK = REPO / "fixtures" / "banks" / "tiny.jsonl"
CELL, PAIR = "kv-hqq4", "reference~edge"

NO_HQQ = importlib.util.find_spec("hqq") is None
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(NO_HQQ, reason="the kv-hqq4 cell needs hqq: pip install 'replaytests[cells]'")]


def diverged(record) -> list[str]:
    """The points of a sweep record whose premise held and whose headline continuations split."""
    return [f"{p.axis} {p.value}" for p in record.sweep or ()
            if point_premise(p) == ([], []) and p.comparisons[PAIR].first_divergence is not None]


def test_a_forbidden_sweep_divergence_fails_the_run(tmp_path):
    rows = [json.loads(line)["id"] for line in BANK.read_text(encoding="utf-8").splitlines()]
    found = [r for r in ledger.read_ledger(BASELINE) if r.family == "sweep" and r.precision == CELL and diverged(r)]
    assert found, f"{BASELINE}: no {CELL} sweep record with a divergent point to take a row from"
    row = min(found, key=lambda r: r.sweep[-1].tokens).row  # the shortest prefix: the cheapest run
    index = rows.index(row)
    strict = tmp_path / "strict.yaml"
    strict.write_text(f"extends: {CELLS}\nname: cpu-tiny-cells-strict-sweep\n"
                      f"gates:\n  sweep:\n    suffix_divergence_allowed: {{{CELL}: false}}\n", encoding="utf-8")
    proc = forkserver.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", "--contract", str(strict), "--precision", CELL, "--rows", f"{index}:{index + 1}",
         "-k", "sweep and not baseline", "--report-dir", str(tmp_path / "reports"), "--run-name", "strict"],
        cwd=tmp_path)
    records = [r for r in ledger.read_ledger(tmp_path / "reports" / "strict" / "ledger.jsonl") if r.family == "sweep"]
    assert len(records) == 1 and records[0].ok, f"no sweep record of {row} at {CELL}:\n{proc.stdout[-3000:]}"
    split = diverged(records[0])
    assert split, (f"the control has nothing to fail on: {row}'s {CELL} sweep split at no point in this run "
                   f"(the baseline's did: {diverged(next(r for r in found if r.row == row))})")
    assert proc.returncode == 1, f"exit {proc.returncode} with divergent points {split}:\n{proc.stdout[-3000:]}"
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and f"test_sweep_reference_vs_edge[{CELL}-{row}]" in failed[0], failed
    verdict = json.loads((tmp_path / "reports" / "strict" / "run.json").read_text(encoding="utf-8"))["verdict"]
    (failure,) = verdict["failures"]
    assert failure["check"] == f"test_sweep_reference_vs_edge[{CELL}-{row}]", verdict
    assert f"sweep.suffix_divergence_allowed.{CELL}" in failure["message"], failure["message"]
