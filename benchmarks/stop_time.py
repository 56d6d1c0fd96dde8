"""How long a stopped audit takes to end: `replaytests audit` on the embedded default, SIGTERM once its third
record is appended, then the seconds until the audit exits and until its run.json exists. A CI runner sends
SIGKILL 10 s after SIGTERM (GitHub Actions, GitLab, Kubernetes' default grace is 30 s): the run must have
written its ledger well before. `--workers 2`: xdist's workers are stopped at once. `--workers 1`: one
process, BF16 only, the transplant first (its first test computes the whole BF16 crossing of the panel: the
longest single test), stopped at the next forward call (engine.stop).

    python benchmarks/stop_time.py [--repeats 3] [--workers 2|1]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(root: Path, name: str, workers: str) -> tuple[float, float, int]:
    within = ["--precision", "bf16", "--", "-k", "transplant"] if workers == "1" else []
    audit = subprocess.Popen([str(Path(sys.executable).with_name("replaytests")), "audit", "--workers", workers,
                              "--rows", "0:16", "--report-dir", str(root), "--run-name", name, *within],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records, run_json = root / name / "records.jsonl", root / name / "run.json"
    while not (records.is_file() and records.read_text().count("\n") >= 3):
        if audit.poll() is not None:
            raise SystemExit(f"the audit ended (exit {audit.returncode}) before its third record")
        time.sleep(0.05)
    start = time.monotonic()
    audit.send_signal(signal.SIGTERM)
    written = None
    while audit.poll() is None:
        if written is None and run_json.exists():
            written = time.monotonic() - start
        time.sleep(0.02)
    ended = time.monotonic() - start
    kept = len((root / name / "ledger.jsonl").read_text().splitlines())
    return written if written is not None else ended, ended, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", choices=("2", "1"), default="2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one(Path(tmp), f"stop{i}", args.workers) for i in range(args.repeats)]
    for i, (written, ended, kept) in enumerate(runs):
        print(f"run {i}: run.json after {written:.1f} s, audit exited after {ended:.1f} s, {kept} records kept")
    print(f"median: run.json {statistics.median(r[0] for r in runs):.1f} s, "
          f"exit {statistics.median(r[1] for r in runs):.1f} s")


if __name__ == "__main__":
    main()
