"""suite.claims: records shared between xdist workers, each computed once, read by every worker."""

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaytests.outputs import ledger
from replaytests.outputs.records import Record
from replaytests.suite.claims import Claims

KEYS = [("crossing", f"tiny/{n:03d}", "bf16") for n in range(8)]  # a row id may hold any character


def _record(key) -> Record:
    """An excluded record: what claims share, the key, is all these tests read of it."""
    family, row, precision = key
    return Record.of({"schema": ledger.SCHEMA, "family": family, "row": row, "precision": precision, "prefix_len": 1,
                      "cell_digest": "d", "expected_answer": None, "status": "excluded", "reason": "a claims test"})


def _worker(directory: str, records: str, computed: str, seconds: float, start) -> None:
    """One worker: needs every key, computes what it claims (appending it, as the session does)."""

    def compute(key) -> Record:
        time.sleep(seconds)
        result = _record(key)
        ledger.append_record(Path(records), result)
        with open(computed, "a") as handle:
            handle.write(f"{os.getpid()} {key[1]}\n")
        return result

    start.wait(30)  # both workers begin together
    found = Claims(Path(directory), Path(records)).shared(KEYS, compute)
    assert [found[key].row for key in KEYS] == [key[1] for key in KEYS]


def test_two_workers_that_need_the_same_rows_compute_each_once_and_split_them(tmp_path):
    claims, records, computed = tmp_path / "claims", tmp_path / "records.jsonl", tmp_path / "computed"
    claims.mkdir()
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [context.Process(target=_worker, args=(str(claims), str(records), str(computed), 0.3, start))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0], "a worker failed or did not finish"
    lines = [line.split() for line in computed.read_text().splitlines()]
    rows = sorted(row for _, row in lines)
    assert rows == [key[1] for key in KEYS], f"each row computed exactly once, got {rows}"
    per_worker = {pid: sum(p == pid for p, _ in lines) for pid, _ in lines}
    assert len(per_worker) == 2 and min(per_worker.values()) >= 2, f"one worker computed (nearly) all: {per_worker}"
    assert not list(claims.iterdir()), "claims left behind"


def test_a_record_another_worker_appended_is_read_not_computed(tmp_path):
    records = tmp_path / "records.jsonl"
    ledger.append_record(records, _record(KEYS[0]))
    found = Claims(tmp_path, records).shared(KEYS[:1], lambda key: pytest.fail(f"{key} computed again"))
    assert found[KEYS[0]] == _record(KEYS[0])


def test_a_claim_whose_holder_died_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    claims = Claims(tmp_path, tmp_path / "records.jsonl")
    claims.path(KEYS[0]).write_text(dead)
    found = claims.shared(KEYS[:1], _record)
    assert found[KEYS[0]].row == KEYS[0][1], "the dead holder's record was not computed here"


def test_a_failed_computation_releases_its_claim(tmp_path):
    def fail(key):
        raise RuntimeError("out of memory")

    claims = Claims(tmp_path, tmp_path / "records.jsonl")
    with pytest.raises(RuntimeError, match="out of memory"):
        claims.shared(KEYS[:1], fail)
    assert not claims.path(KEYS[0]).exists(), "a failed worker's claim would make the others wait forever"


def test_a_line_still_being_written_is_read_on_the_next_call(tmp_path):
    records = tmp_path / "records.jsonl"
    line = json.dumps(_record(KEYS[0]).to_json())
    records.write_text(line[:20])
    claims = Claims(tmp_path, records)
    assert claims.finished(KEYS[0]) is None
    records.write_text(line + "\n")
    assert claims.finished(KEYS[0]) == _record(KEYS[0])


def test_a_claim_held_by_a_zombie_is_taken_over(tmp_path):
    """A worker killed with SIGKILL stays a zombie until its parent reaps it, and a zombie's pid still
    answers kill(pid, 0): its claim must count as dead, or the run waits for ever."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not reaped
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    try:
        claims = Claims(tmp_path, tmp_path / "records.jsonl")
        claims.path(KEYS[0]).write_text(str(child.pid))
        found = claims.shared(KEYS[:1], _record)
        assert found[KEYS[0]].row == KEYS[0][1], "the zombie's record was not computed here"
    finally:
        child.wait()


def test_a_claims_directory_removed_mid_run_is_made_again(tmp_path):
    directory = tmp_path / "claims"
    claims = Claims(directory, tmp_path / "records.jsonl")  # never made: as if a /tmp cleaner removed it
    found = claims.shared(KEYS[:2], _record)
    assert sorted(found) == KEYS[:2] and directory.is_dir() and not list(directory.iterdir())


def test_a_torn_line_costs_only_its_own_record(tmp_path):
    """A worker that died mid-write leaves half a line; the next append starts a line of its own, and
    readers keep every whole record around the torn one, saying which line was torn."""
    records = tmp_path / "records.jsonl"
    ledger.append_record(records, _record(KEYS[0]))
    with open(records, "a") as handle:
        handle.write(json.dumps(_record(KEYS[1]).to_json())[:25])  # killed mid-write
    ledger.append_record(records, _record(KEYS[2]))
    kept, torn = ledger.read_appended(records)
    assert [r.row for r in kept] == [KEYS[0][1], KEYS[2][1]] and torn == [2], (kept, torn)
    claims = Claims(tmp_path, records)
    assert claims.finished(KEYS[2]) == _record(KEYS[2]) and claims.finished(KEYS[1]) is None


def test_a_write_cut_short_is_taken_back(tmp_path, monkeypatch):
    records = tmp_path / "records.jsonl"
    ledger.append_record(records, _record(KEYS[0]))
    before = records.read_bytes()
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, data[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        ledger.append_record(records, _record(KEYS[1]))
    assert records.read_bytes() == before, "a half-written record was left in the records file"
