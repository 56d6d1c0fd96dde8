"""nox sessions of replaytests. `upgrade` gates a runtime upgrade with both environments side by side
(docs/upgrade.md):

    nox -s upgrade -- old="transformers==5.19.0" new="transformers==5.24.0" gate=trajectories

It builds one venv per side (`.nox/upgrade-old`, `.nox/upgrade-new`) with this checkout and the side's
requirements, runs the same audit in each (the embedded default's first rows unless told otherwise),
and gates the new run against the old one with `replaytests compare` at the chosen level. Its exit
status is the gate's. Arguments (each `name=value`, after `--`):

    old, new    requirements of each side, separated by spaces (required)
    gate        bits | trajectories | rates (default bits)
    rows        the audit's --rows (default 0:6)
    precision   bf16 | fp32 | both (default both)
    pip         extra pip arguments for both sides, e.g. "--index-url https://download.pytorch.org/whl/cu128"
    audit       extra arguments for both audits, e.g. "--contract contracts/h200.yaml --device cuda"
    out         where the two runs and compare.txt go (default reports/upgrade)

Without a torch requirement on a side, that side gets the CPU build the README pins (torch==2.13.0).
The session refuses a comparison with nothing to judge: two sides whose recorded software is the same
(nothing was upgraded), or an audit that stopped with a usage error.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import nox
from packaging.requirements import InvalidRequirement, Requirement  # a dependency of nox

nox.options.sessions = []  # nothing runs without -s
CPU_TORCH = "torch==2.13.0"
ARGUMENTS = {"old": None, "new": None, "gate": "bits", "rows": "0:6", "precision": "both", "pip": "", "audit": "",
             "out": "reports/upgrade"}


def _arguments(session: nox.Session) -> dict[str, str]:
    given = {}
    for arg in session.posargs:
        name, equals, value = arg.partition("=")
        if not equals or name not in ARGUMENTS:
            session.error(f"upgrade: argument {arg!r}: expected name=value with name one of {', '.join(ARGUMENTS)}")
        given[name] = value
    out = ARGUMENTS | given
    if missing := [name for name in ("old", "new") if not out[name]]:
        session.error(f"upgrade: missing {' and '.join(missing)}=REQUIREMENTS (e.g. old=\"transformers==5.19.0\")")
    for side in ("old", "new"):
        for requirement in shlex.split(out[side]):
            try:
                Requirement(requirement)
            except InvalidRequirement as exc:
                session.error(f"upgrade: {side}={out[side]!r}: {requirement!r} is not a requirement ({exc})")
    if out["gate"] not in ("bits", "trajectories", "rates"):
        session.error(f"upgrade: gate={out['gate']!r}: expected bits, trajectories or rates")
    return out


def _call(session: nox.Session, *command: str, stdout=None) -> int:
    """Run a command whose exit status the session reads (nox's run only says pass or fail)."""
    session.log(shlex.join(command))
    code = subprocess.run(command, stdout=stdout, check=False).returncode
    if code not in (0, 1):
        session.error(f"upgrade: {command[0]} {command[1]} exited {code} (bad input or interrupted: see above)")
    return code


def _side(session: nox.Session, name: str, requirements: list[str], args: dict[str, str], root: Path) -> Path:
    """Build the side's venv, run the audit in it; the run directory."""
    venv = Path(".nox") / f"upgrade-{name}"
    start = time.monotonic()
    session.run(sys.executable, "-m", "venv", "--clear", str(venv), external=True)
    torch = [] if any(Requirement(r).name == "torch" for r in requirements) else [CPU_TORCH]
    # --no-compile: byte-compiling torch's thousands of modules took half of each install (74 s -> 37 s
    # on 2 cores); the audit compiles only what it imports.
    session.run(str(venv / "bin" / "pip"), "install", "-q", "--no-compile", *shlex.split(args["pip"]), *torch,
                "-e", ".", *requirements, external=True)
    built = time.monotonic()
    code = _call(session, str(venv / "bin" / "replaytests"), "audit", "--rows", args["rows"], "--precision",
                 args["precision"], "--report-dir", str(root), "--run-name", name, *shlex.split(args["audit"]))
    session.log(f"{name}: venv built in {built - start:.0f} s; audit exit {code} in {time.monotonic() - built:.0f} s "
                f"({'pass' if code == 0 else 'a failing check: see its report'})")
    return root / name


def _software(run: Path) -> dict:
    platform = json.loads((run / "run.json").read_text(encoding="utf-8")).get("platform", {})
    return {key: value for key, value in platform.items() if key.startswith("software.")}


@nox.session(python=False)
def upgrade(session: nox.Session) -> None:
    """Gate a runtime upgrade: the same audit in an old and a new environment, compared at a level."""
    _gate_sides(session, _arguments(session))


@nox.session(python=False)
def newest(session: nox.Session) -> None:
    """The nightly look ahead: the versions constraints.txt pins (those the committed baselines were made
    with) against the newest versions pyproject.toml allows, gated at trajectories by default; torch stays
    the pinned CPU build on both sides. Where nothing newer is out, it says so and passes.

        nox -s newest [-- gate=trajectories rows=0:6 out=reports/newest]
    """
    pins = [line.strip() for line in Path("constraints.txt").read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    names = [Requirement(pin).name for pin in pins]
    newest_side = [pin if Requirement(pin).name == "torch" else name for pin, name in zip(pins, names, strict=True)]
    session.posargs[:0] = [f"old={' '.join(pins)}", f"new={' '.join(newest_side)}", "gate=trajectories",
                           "out=reports/newest"]
    args = _arguments(session)
    args["pip"] = f"{args['pip']} --upgrade".strip()
    _gate_sides(session, args, nothing_new_passes=True)


def _gate_sides(session: nox.Session, args: dict[str, str], nothing_new_passes: bool = False) -> None:
    root = Path(args["out"])
    if root.exists() and any((root / side).exists() for side in ("old", "new")):
        session.error(f"upgrade: {root} holds an earlier upgrade's runs; pass out=ANOTHER or remove them")
    runs = {side: _side(session, side, shlex.split(args[side]), args, root) for side in ("old", "new")}
    before, after = _software(runs["old"]), _software(runs["new"])
    if before == after:
        if nothing_new_passes:
            session.log(f"newest: the newest allowed versions are the pinned ones ({before}): nothing to compare")
            return
        session.error(f"upgrade: the two environments recorded the same software ({before}): nothing was upgraded, "
                      "so the comparison would pass on nothing")
    changed = {k: (before.get(k), after.get(k)) for k in sorted(before.keys() | after.keys())
               if before.get(k) != after.get(k)}
    session.log("upgraded: " + "; ".join(f"{k.removeprefix('software.')} {a} -> {b}" for k, (a, b) in changed.items()))
    report = root / "compare.txt"
    with report.open("w", encoding="utf-8") as out:
        code = _call(session, str(Path(".nox") / "upgrade-new" / "bin" / "replaytests"), "compare", str(runs["old"]),
                     str(runs["new"]), "--gate", args["gate"], stdout=out)
    text = report.read_text(encoding="utf-8")
    print(text, end="")
    if code:
        session.error(f"upgrade: the gate at {args['gate']} failed ({text.splitlines()[0]}); {report}")
