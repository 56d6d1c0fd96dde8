"""Helpers of tests/vllm: a child conformance run on the vLLM backend, as a user runs it
(`pytest --pyargs replaytests.conformance --backend vllm ...`), and its records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "contracts" / "cpu-tiny-vllm.yaml"
BANK = REPO / "fixtures" / "banks" / "tiny-causal.jsonl"


def _run(root: Path, name: str, *args: str, contract: Path = CONTRACT, bank: Path = BANK):
    """A child conformance run on the vLLM backend: (the process, its run directory)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", "--backend", "vllm", "--bank", str(bank), "--contract", str(contract),
         "--report-dir", str(root), "--run-name", name, *args], cwd=root, capture_output=True, text=True, check=False)
    return proc, root / name


def _start(root: Path, name: str, *args: str, contract: Path = CONTRACT, bank: Path = BANK):
    """A child conformance run started, not waited for (_finish): several run side by side, each on a core."""
    (root / name).mkdir(parents=True)  # the run's report root; its output beside it
    out = (root / f"{name}.out").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rA", "--backend", "vllm", "--bank", str(bank), "--contract", str(contract),
         "--report-dir", str(root / name), "--run-name", name, *args], cwd=root / name, stdout=out,
        stderr=subprocess.STDOUT, text=True)
    return proc, root / name / name, out


def _finish(started):
    """A started run, once it ended: (the process, with its output as `stdout`, its run directory)."""
    proc, run, out = started
    proc.wait()
    out.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, Path(out.name).read_text(), ""), run


def _records(run: Path, family: str | None = None) -> list[dict]:
    records = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    return [r for r in records if family in (None, r["family"])]
