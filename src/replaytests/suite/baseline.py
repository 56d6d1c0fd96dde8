"""The baseline a run is audited against (--baseline): checked when the session opens, each audited record
judged against it, and the rates of the whole run judged against it once every test has reported."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from replaytests.errors import ConfigError
from replaytests.files import lookup
from replaytests.inputs.gates import Judgement, artifact, gated
from replaytests.outputs import compare, findings, ledger
from replaytests.outputs.records import Record
from replaytests.outputs.runs import read_run
from replaytests.outputs.verdict import Failure

if TYPE_CHECKING:
    from replaytests.suite.session import ReplaySession

RATES_CHECK = "baseline rates"  # the rates check's name in the verdict


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_baseline(replay: ReplaySession) -> None:
    """A baseline is a finished run (unless --accept-interrupted) with at least one record this run
    recomputes: an audit against nothing would pass having checked nothing. The committed baseline of
    committed inputs, not asked for, holding none of this run's cells is no error: the audit tests are
    then skipped, saying so."""
    path = replay.options.baseline_ledger
    if lookup(read_run(path) or {}, "run", "interrupted") and not replay.options.accept_interrupted:
        raise ConfigError(f"--baseline {path}: an interrupted run (it holds only what it finished); pass "
                          "--accept-interrupted to audit against it anyway")
    if not replay.baseline and replay.options.baseline is not None:
        every = ledger.read_ledger(path)  # read whole only to say what it holds
        theirs = sorted({r.row for r in every})
        ours = [r.id for r in replay.plan.sharded_rows]
        raise ConfigError(f"--baseline {path}: none of its {len(every)} records is one this run computes "
                          f"(its rows {_some(theirs)}; this run's {_some(ours)}, cells "
                          f"{', '.join(replay.cells)}): nothing would be audited")


def judge_against_baseline(replay: ReplaySession, problem: str | None, level: str = "bits",
                           cell: str | None = None) -> Judgement:
    """A ledger-audit check against the baseline, under gates.audit.reproduce; `level` is the coarsest
    level the change reaches (bits, or trajectories), `cell` the record's. Under --gate, a change finer
    than the gate is recorded and one at it fails, on any platform. Without it, on the baseline's own
    platform every bit must reproduce; on another platform (another CPU or GPU) only bits may differ and
    are recorded as platform drift, while a trajectory (suffix, answer, correctness) must still match in
    a cell whose crossing may not diverge (FP32), and in one that may (BF16) a changed trajectory is
    counted and judged by the rates of the whole run (baseline_rates)."""
    gate, contract = replay.options.gate, replay.contract
    if problem is not None and gate is None and level == "trajectories" and replay.baseline_platform \
            and not replay.options.strict_contract:
        drift = f"the baseline was made on another platform: {'; '.join(replay.baseline_platform)}"
        if cell is not None and contract.may_diverge(cell):
            return Judgement("recorded", f"{problem} ({drift}; a cell that may diverge: counted, judged by "
                                         "its rates)")
        return contract.gates.audit(f"{problem} ({drift}; only bits may differ across platforms, and "
                                    "this cell's trajectory changed)")
    if problem is None or gate is None:
        return artifact(contract.gates.audit(problem), replay.baseline_platform, replay.options.strict_contract,
                        "baseline")
    if not gated(level, gate):
        return Judgement("recorded", f"{problem}: allowed at --gate {gate}")
    return contract.gates.audit(f"{problem} (--gate {gate})")


class Rates(NamedTuple):
    """The run's rates check against its baseline: its failures (as the verdict lists them), and
    the changes it records as platform drift (lines)."""

    failures: list[Failure]
    drift: list[str]


def baseline_rates(replay: ReplaySession, records: list[Record]) -> Rates:
    """Under --gate rates, or against a baseline made on another platform (where a cell that may diverge is
    judged by its rates, not row by row), the findings of the rates level against the baseline
    (outputs/compare.py: exact McNemar per family, cell and headline pair, on the rows both hold; a sign-flip test
    of the rollout mismatch per row): the one check of a run that needs every row of a family at once, so the
    controller makes it from the run's records. Against another platform's baseline without --gate, a rollout
    mismatch that changed is platform drift, recorded with its numbers: the mismatch is made of log-probabilities'
    bits, which may differ across platforms (a changed divergence rate, a change of trajectories, still fails)."""
    across = replay.options.gate is None and bool(replay.baseline_platform)
    if (replay.options.gate != "rates" and not across) or not replay.baseline:
        return Rates([], [])
    found = compare.compare(replay.baseline, records, gates=replay.contract.gates, gate="rates")
    reasons = [reason for reason in found.reasons if reason.startswith(findings.RATES_REASONS)]
    drift = [reason for reason in reasons if across and reason.startswith(findings.ROLLOUT_RATES_REASON)]
    return Rates([Failure(RATES_CHECK, reason) for reason in reasons if reason not in drift],
                 [f"{reason} (against a baseline made on another platform: recorded, not judged; --gate rates "
                  "judges it)" for reason in drift])
