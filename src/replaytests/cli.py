"""The `replaytests` command: what is not a test (freezing a bank) and the audit wrapper.

`replaytests audit` runs the same pytest session as `pytest --pyargs replaytests.conformance`:
one execution path, so the ledger is the same whichever way the suite is started.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from replaytests.errors import ReplaytestsError
from replaytests.session import DEFAULT_CONTRACT, DEFAULT_MODEL, DEFAULT_REPORT_DIR, REPO


def _freeze(args: argparse.Namespace) -> int:
    from replaytests.freeze import freeze

    rows = freeze(args.model, args.problems, args.contract, args.out)
    print(f"froze {len(rows)} rows into {args.out} (prefix lengths "
          f"{min(r.prefix_len for r in rows)}-{max(r.prefix_len for r in rows)})")
    return 0


def _audit(args: argparse.Namespace, extra: list[str]) -> int:
    # A child pytest process: exactly what a user typing pytest gets (and no assert-rewrite
    # warning for the already-imported package).
    argv = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "-q"]
    if args.workers != "1":
        argv += ["-n", str(args.workers), "--dist", "loadgroup"]
    for name in ("model", "bank", "contract", "precision", "rows", "device", "report_dir"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    code = subprocess.run(argv + extra, check=False).returncode
    report_dir = args.report_dir or DEFAULT_REPORT_DIR
    if (report_dir / "summary.md").is_file():
        print(f"report: {report_dir / 'summary.md'}")
    return code


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="replaytests", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)

    freeze = sub.add_parser("freeze", help="live-generate each problem to the merge boundary (BF16) into a bank")
    freeze.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory. Default: %(default)s")
    freeze.add_argument("--problems", type=Path, default=REPO / "fixtures" / "problems" / "tiny.jsonl",
                        help="problems JSONL. Default: %(default)s")
    freeze.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    freeze.add_argument("--out", type=Path, required=True, help="bank JSONL to write (manifest beside it)")

    audit = sub.add_parser("audit", help="run the conformance suite and print its summary table; "
                                         "arguments after -- go to pytest")
    for name in ("model", "bank", "contract", "report-dir"):
        audit.add_argument(f"--{name}", type=Path, default=None, help="see pytest --help (default: embedded)")
    audit.add_argument("--precision", choices=("bf16", "fp32", "both"), default=None)
    audit.add_argument("--rows", default=None, help="a count N or a slice A:B of bank rows")
    audit.add_argument("--device", default=None)
    audit.add_argument("--workers", default="auto",
                       help="pytest-xdist worker processes ('auto': one per core; 1: in-process). Default: %(default)s")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    args = parser().parse_args(argv)
    try:
        if args.command == "freeze":
            return _freeze(args)
        return _audit(args, extra)
    except ReplaytestsError as exc:
        print(f"replaytests: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
