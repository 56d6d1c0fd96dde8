"""The fixed cost of a short replay run at two commits, alternated: a one-row conformance run (by default one
FP32 row through the crossing's replica tests) started as a user starts it, in a child process, `--repeats` times
each way, BEFORE from a git worktree put first on PYTHONPATH (the same venv, the same installed packages), AFTER
from this checkout. Reports each side's summed wall and CPU seconds (the children's, from the kernel) and their
ratio, and whether both sides wrote the same records. Not a test: nothing passes or fails on a time.

    python benchmarks/short_run.py BEFORE_COMMIT [--repeats 5] [--out DIR] [-- conformance arguments...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DEFAULT = ["--rows", "1", "--precision", "fp32", "-k", "replica_exact and crossing"]


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(name: str, source: Path | None, out: Path, number: int, arguments: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one conformance run from `source` (None: this checkout, as installed)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source / "src") + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider",
               "-p", "no:xdist", "-q", "--report-dir", str(out / "runs"), "--run-name", f"{name}-{number}",
               *arguments]
    cpu, start = child_cpu(), time.perf_counter()
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - start, child_cpu() - cpu
    if proc.returncode != 0:
        sys.exit(f"{name} run {number} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, cpu


def records(out: Path, name: str) -> list[dict]:
    lines = (out / "runs" / f"{name}-1" / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the commit to compare this checkout with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("/tmp/replaytests-short-run"))
    parser.add_argument("arguments", nargs="*", help=f"conformance arguments (default: {' '.join(DEFAULT)})")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree = out / "worktree"
    if not tree.is_dir():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(tree), args.before], check=True,
                       capture_output=True)
    subprocess.run(["git", "-C", str(tree), "checkout", "-q", "--detach", args.before], check=True)
    arguments = args.arguments or DEFAULT
    sums = {"before": [0.0, 0.0], "after": [0.0, 0.0]}
    for number in range(1, args.repeats + 1):
        for name, source in (("before", tree), ("after", None)):
            wall, cpu = run_once(name, source, out, number, arguments)
            sums[name][0] += wall
            sums[name][1] += cpu
    before, after = records(out, "before"), records(out, "after")
    if not before:
        sys.exit("the runs wrote no records: nothing to compare (a selection that selects no conformance test?)")
    same = before == after
    before_at = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, check=True).stdout.strip()
    print(f"{args.repeats} runs each, alternated: {' '.join(arguments)}")
    print("| side | wall s | CPU s | per run (CPU) |")
    print("|---|---|---|---|")
    for name, (wall, cpu) in sums.items():
        label = f"before ({before_at})" if name == "before" else "after (this checkout)"
        print(f"| {label} | {wall:.1f} | {cpu:.1f} | {cpu / args.repeats:.2f} |")
    print(f"ratio after / before: wall {sums['after'][0] / sums['before'][0]:.2f}x, "
          f"CPU {sums['after'][1] / sums['before'][1]:.2f}x; the same records: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
