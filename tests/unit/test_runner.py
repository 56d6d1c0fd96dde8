"""Records are owned by the run, not carried by the tests that read them: each record reaches the run's
directory as it is computed, a test selection never changes the records, and a sharded run in two
phases (the crossing first, then the transplant from the merged crossing: --panel-from) writes the
ledger one run writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest

from replaytests.outputs import ledger
from replaytests.outputs.ledger import collate
from replaytests.outputs.records import Record

# The families whose records the runner's machinery moves between shards, phases and workers (the transplant reads
# the crossing's): the rollout, conversation and sweep families are left out, for the test command's time (a test's own
# -k, given after, replaces this one). Rows tiny-004 and -005: under the contract's AVX2 pin tiny-005 is the first
# row whose BF16 crossing diverges (the transplant's panel), tiny-004 an exact one; where a machine disagrees, the
# tests say the whole run has no transplant record.
ROWS = ("--rows", "4:6", "--precision", "bf16", "-p", "no:cacheprovider",
        "-k", "not rollout and not conversation and not sweep")


def run(root: Path, name: str, *args: str, workers: int = 1) -> tuple[subprocess.CompletedProcess, Path]:
    xdist = ("-n", str(workers), "--dist", "loadgroup") if workers > 1 else ("-p", "no:xdist")
    proc = forkserver.run([sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", *ROWS, *xdist,
                           "--report-dir", str(root), "--run-name", name, *args], cwd=root.parent)
    return proc, root / name


def records(run_dir: Path) -> dict[tuple, Record]:
    return {r.key: r for r in ledger.read_ledger(run_dir / "ledger.jsonl")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    proc, run_dir = run(tmp_path_factory.mktemp("whole") / "r", "whole")
    assert proc.returncode == 0, f"the whole run failed:\n{proc.stdout[-3000:]}"
    return run_dir


@pytest.mark.e2e
def test_a_selection_of_the_transplant_writes_the_same_transplant_records(whole, tmp_path):
    proc, run_dir = run(tmp_path / "r", "k", "-k", "transplant and not conversation")
    assert proc.returncode == 0, proc.stdout[-3000:]
    got, full = records(run_dir), records(whole)
    transplants = {k: r for k, r in full.items() if k[0] == "transplant"}
    assert transplants, "the whole run has no transplant record: nothing to compare"
    assert {k: r for k, r in got.items() if k[0] == "transplant"} == transplants, "transplant records differ"
    crossing = {k for k in got if k[0] == "crossing"}
    assert crossing == {k for k in full if k[0] == "crossing"}, "the crossing the panel was drawn from is missing"
    assert all(got[k] == full[k] for k in crossing), "a crossing record differs from the whole run's"


@pytest.mark.e2e
def test_two_workers_compute_each_record_once_and_write_the_ledger_of_one_process(whole, tmp_path):
    """Under -n 2 the transplant's panel and family gate read records of rows another worker's tests
    own: they are shared (suite.claims), not computed twice, and the ledger is one process's. Every test of one
    (cell, row) group runs on one worker (here every test is BF16: its row names its group)."""
    proc, run_dir = run(tmp_path / "r", "n2", "-v", workers=2)
    assert proc.returncode == 0 and "2 workers" in proc.stdout, proc.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, row in re.findall(r"^\[(gw\d+)\] .*PASSED .*\[.*(tiny-\d+).*\]", proc.stdout, re.MULTILINE):
        workers.setdefault(row, set()).add(worker)
    assert set(workers) == {"tiny-004", "tiny-005"}, f"rows {sorted(workers)} in:\n{proc.stdout[-3000:]}"
    assert all(len(ran_on) == 1 for ran_on in workers.values()), f"a (cell, row) ran on two workers: {workers}"
    got = records(run_dir)
    assert got == records(whole), (f"the two workers' ledger differs from one process's in "
                                   f"{sorted(set(got) ^ set(records(whole)))} or in values")
    computed = json.loads((run_dir / "run.json").read_text())["run"]["computed"]
    assert computed == len(got), f"{computed} records computed for a ledger of {len(got)}: some were computed twice"


@pytest.mark.e2e
def test_two_phases_of_two_shards_write_the_ledger_of_one_run(whole, tmp_path):
    root = tmp_path / "r"
    phase1 = [run(root, f"p1-{i}", "--shard", f"{i}/2", "-m", "not causal") for i in (1, 2)]
    assert all(proc.returncode == 0 for proc, _ in phase1), [proc.stdout[-2000:] for proc, _ in phase1]
    assert not any(k[0] in ("transplant", "replication") for _, d in phase1 for k in records(d)), \
        "the first phase computed a causal family"
    sources = [arg for _, d in phase1 for arg in ("--panel-from", str(d))]
    phase2 = [run(root, f"p2-{i}", "--shard", f"{i}/2", "-m", "causal", *sources) for i in (1, 2)]
    assert all(proc.returncode == 0 for proc, _ in phase2), [proc.stdout[-2000:] for proc, _ in phase2]
    assert not any(k[0] == "crossing" for _, d in phase2 for k in records(d)), \
        "the second phase computed crossing records again"
    merged = {r.key: r for r in collate([d for _, d in (*phase1, *phase2)])}
    assert merged == records(whole), (f"the two phases differ from one run in "
                                      f"{sorted(set(merged) ^ set(records(whole)))} or in their values")


@pytest.mark.e2e
@pytest.mark.parametrize(("case", "message"), [
    pytest.param("missing-rows", "no finished bf16 crossing record of", id="missing-rows"),
    pytest.param("interrupted", "is an interrupted run", id="interrupted"),
])
def test_a_panel_source_that_is_not_a_finished_crossing_is_one_line(whole, tmp_path, case, message):
    source = tmp_path / "source"
    source.mkdir()
    records = ledger.read_ledger(whole / "ledger.jsonl")
    dropped = min(r.row for r in records)  # a row the run selects, gone from its panel source
    kept = [r for r in records if case != "missing-rows" or r.row != dropped]
    ledger.write_ledger(source / "ledger.jsonl", kept)
    meta = json.loads((whole / "run.json").read_text())
    meta["run"]["interrupted"] = case == "interrupted"
    (source / "run.json").write_text(json.dumps(meta))
    proc, _ = run(tmp_path / "r", "x", "-m", "causal", "--panel-from", str(source))
    assert proc.returncode == 4, f"expected a usage error, got {proc.returncode}:\n{proc.stdout[-2000:]}"
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line or "error" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.e2e
def test_a_panel_source_made_under_another_contract_names_both(whole, tmp_path):
    """Its crossing is not this run's: refused before any row, naming both contracts (each row failed as
    not contemporaneous, with no word of the contract)."""
    from replaytests.errors import ConfigError
    from replaytests.inputs.options import Options
    from replaytests.suite.panel_source import read_panel_source
    from replaytests.suite.session import ReplaySession

    source = tmp_path / "source"
    source.mkdir()
    ledger.write_ledger(source / "ledger.jsonl", ledger.read_ledger(whole / "ledger.jsonl"))
    meta = json.loads((whole / "run.json").read_text())
    meta["contract"] |= {"name": "cpu-other", "sha256": "0" * 64}
    (source / "run.json").write_text(json.dumps(meta))
    replay = ReplaySession.open(Options(rows="0:2"))
    with pytest.raises(ConfigError, match=r"was run under another contract \(cpu-other, sha256 000000000000…; this "
                                          r"run's cpu-tiny, "):
        read_panel_source((source,), replay.rows, replay.integrity, replay.contract, ("bf16",))
