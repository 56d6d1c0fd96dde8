"""The trials: each fault injected, and the check its family exists for run on the same row with and without it.

Every check is the suite's own code, called as the conformance tests, the gates and `replaytests compare`
call it: the families' `run` (engine evaluation, fail-closed checks), the contract's gates
(inputs/gates.py), the ledger audit (outputs/audit.py), the comparison of two runs (outputs/compare.py),
the mask property (engine/checks.py), the token-identity test's own check, and `replaytests env`'s drift.
A cell is detected only where the check passes without the fault (its control) and fails with it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from replaytests.backends import declarations
from replaytests.engine.backend import SERVING, Backend
from replaytests.engine.checks import check_mask
from replaytests.families import bridge, crossing, transplant
from replaytests.families.registry import CROSS
from replaytests.families.skeleton import other_z
from replaytests.inputs import cpu_isa
from replaytests.inputs.bank import BankRow
from replaytests.inputs.contract import Contract
from replaytests.inputs.gates import Judgement
from replaytests.outputs.audit import audit_record
from replaytests.outputs.compare import RATES_REASON, compare
from replaytests.outputs.records import Record
from replaytests.selftest import faults
from replaytests.selftest.matrix import ERROR, NOT_RUN, Cell, judged

Finding = str | None  # what a check found (None: it passed)


@dataclasses.dataclass
class Bench:
    """The inputs every trial shares: the contract, one runtime in the bank's cell, one bank row, and the
    records computed once on it without a fault."""

    contract: Contract
    runtime: Backend
    row: BankRow

    @functools.cached_property
    def crossing(self) -> Record:
        return crossing.run(self.runtime, self.row)

    @functools.cached_property
    def recomputed(self) -> Record:
        """The crossing record computed again, on arms of its own: what a ledger audit compares a baseline to."""
        return crossing.run(faults.copy_of(self.runtime), self.row)

    @functools.cached_property
    def nudged(self) -> Record:
        """The crossing record with one prefill K element one ULP up."""
        return crossing.run(faults.nudged_cache(self.runtime, "prefill"), self.row)


def _gate(judge: Callable[[Record], Judgement]) -> Callable[[Record], Finding]:
    """A gate's judgement of a record as a finding; a record a fail-closed check excluded is a finding too
    (the conformance test that reads it fails)."""
    def finding(record: Record) -> Finding:
        if not record.ok:
            return f"row excluded: {record.reason}"
        judgement = judge(record)
        return None if judgement.outcome == "pass" else f"{judgement.outcome}: {judgement.message}"
    return finding


def _excluded(record: Record) -> Finding:
    """The row's fail-closed checks: the reason it was excluded, None where it was not."""
    return None if record.ok else record.reason


def _audited(bench: Bench, baseline: Record, current: Record) -> Finding:
    """The ledger audit of `baseline` against `current` under gates.audit.reproduce, as the conformance
    test words its problem (conformance/helpers.py)."""
    result = audit_record(baseline, current)
    moved = result.trajectory_changes
    problem = None if result.reproduced else (
        f"{len(result.changes)} of {result.leaves} leaves differ, "
        f"{f'{len(moved)} of a trajectory' if moved else 'bits only'}; first: {(moved or result.changes)[0]}")
    return _gate(lambda _: bench.contract.gates.audit(problem))(current)


def _consumes_bank_row(record: Record, row: BankRow) -> Finding:
    """The token-identity test's own check (conformance/test_token_identity.py) on one record."""
    return other_z(record, row) if record.ok else f"{record.title}: excluded ({record.reason})"


def ulp_cells(bench: Bench) -> list[Cell]:
    # One K element of the middle layer at the last position (faults.nudged_cache), one ULP up.
    gates, row = bench.contract.gates, bench.row
    replicas = _gate(lambda r: gates.replicas(r, "prefill~prefill_replica"))
    bridged = _gate(gates.control)
    return [
        judged("K +1 ULP, prefill", "crossing prefill~prefill_replica cache (gates.replicas)",
               replicas(bench.crossing), replicas(bench.nudged)),
        judged("K +1 ULP, bridge incremental", "bridge live~incremental bit-exact (gates.bridge.exact)",
               bridged(bridge.run(bench.runtime, row)),
               bridged(bridge.run(faults.nudged_cache(bench.runtime, "incremental"), row))),
        judged("K +1 ULP, prefill", "ledger audit (outputs/audit.py, gates.audit)",
               _audited(bench, bench.crossing, bench.recomputed), _audited(bench, bench.crossing, bench.nudged)),
    ]


def mask_cells(bench: Bench) -> list[Cell]:
    # In every call the last query sees the nearest earlier key the contract hides (faults.leaky_mask).
    fault, check = "mask lets 1 hidden key through", "visibility (engine/checks.py check_mask)"
    if not faults.hides_keys(bench.contract.visibility):
        return [Cell(fault, check, NOT_RUN, f"contract visibility {bench.contract.visibility!r} hides no key")]

    def finding(runtime: Backend) -> Finding:
        result = check_mask(runtime, bench.row.tokens)
        return None if result.outcome == "ok" else f"{result.outcome}: {result.detail}"

    return [judged(fault, check, finding(bench.runtime), finding(faults.leaky_mask(bench.runtime)))]


def position_cells(bench: Bench) -> list[Cell]:
    """Every construction gets the shifted position alike, so the replicas, the bridge and the crossing's
    own comparisons cannot see it; the ledger audit against a run without it does."""
    at = bench.row.prefix_len // 2
    shifted = crossing.run(faults.shifted_position(bench.runtime, at), bench.row)
    return [judged(f"position id {at} +1, every arm",
                   "ledger audit (outputs/audit.py, gates.audit)",
                   _audited(bench, bench.crossing, bench.recomputed), _audited(bench, bench.crossing, shifted))]


def token_cells(bench: Bench) -> list[Cell]:
    check = "token identity: arms consumed the bank row (conformance)"
    control = _consumes_bank_row(bench.crossing, bench.row)
    return [judged(f"last prompt token {name}, every arm", check, control,
                   _consumes_bank_row(crossing.run(faults.edited_prefix(bench.runtime, edit), bench.row), bench.row))
            for name, edit in (("dropped", faults.dropped), ("duplicated", faults.duplicated))]


def batch_cells(bench: Bench) -> list[Cell]:
    desynced = crossing.run(faults.desynced_copy(bench.runtime), bench.row)
    return [judged("batch copy 1 perturbed (its first token)", "physical-batch desync: row fails closed",
                   _excluded(bench.crossing), _excluded(desynced))]


def transplant_cells(bench: Bench) -> list[Cell]:
    """The transplant row as the family runs it (its arms, the seam's provenance checks, the validity
    control), judged by gates.transplant_row. Run in the control role whatever the row's crossing did: a
    control row needs no layer search, and a divergent row that is not testable (its first suffix tokens
    differ) could not be judged in the divergent role."""
    fault, check = "transplant swaps nothing", "transplant (control role): provenance, validity"
    if bench.crossing.comparisons[CROSS].cache_exact:  # seen with DEFAULT kernels: no check could tell them apart
        return [Cell(fault, check, NOT_RUN, f"{bench.crossing.title}: the incremental and prefill caches are bitwise "
                                            "equal here, so a swap that copies nothing is a swap")]
    judge = _gate(lambda r: bench.contract.gates.transplant_row(r, "control"))

    def finding(runtime: Backend) -> Finding:
        return judge(transplant.run(runtime, bench.row, bench.crossing, "control"))

    return [judged(fault, check, finding(bench.runtime), finding(faults.swaps_nothing(bench.runtime)))]


def _flip_lowest_bit(value: float) -> float:
    (bits,) = struct.unpack("<Q", struct.pack("<d", value))
    return struct.unpack("<d", struct.pack("<Q", bits ^ 1))[0]


def ledger_cells(bench: Bench) -> list[Cell]:
    """A saved ledger line with one leaf one bit off (the crossing's K relative drift), audited against the
    recomputation; the control audits the unchanged line."""
    line = bench.crossing.to_json()
    metrics = line["comparisons"][CROSS]
    metrics["k_rel_l2"] = _flip_lowest_bit(metrics["k_rel_l2"])
    tampered = Record.from_json(line)
    return [judged(f"ledger leaf {CROSS} k_rel_l2 1 bit off", "ledger audit (outputs/audit.py, gates.audit)",
                   _audited(bench, bench.crossing, bench.recomputed), _audited(bench, tampered, bench.recomputed))]


ROWS_FOR_RATES = 12  # rows of the two record sets: 8 new divergences of 12 give McNemar p = 0.0078


def _record_set(template: Record, diverging: int) -> list[Record]:
    """`ROWS_FOR_RATES` copies of a crossing record under other row ids, the first `diverging` with their
    headline suffixes diverging at index 0 and the others equal."""
    records = []
    for index in range(ROWS_FOR_RATES):
        line = template.to_json() | {"row": f"selftest-{index:02d}"}
        line["comparisons"][CROSS] |= ({"suffix_equal": False, "first_divergence": 0} if index < diverging else
                                       {"suffix_equal": True, "first_divergence": None})
        records.append(Record.from_json(line))
    return records


def rates_cells(bench: Bench) -> list[Cell]:
    """Two record sets built from this run's crossing record; compared at --gate rates (exact McNemar)."""
    def finding(new: list[Record]) -> Finding:
        result = compare(_record_set(bench.crossing, 0), new, gates=bench.contract.gates, gate="rates")
        return None if result.passed else "; ".join(result.reasons)

    found = finding(_record_set(bench.crossing, 8))
    return [judged("baseline rate differs (0/12 vs 8/12)", "run rates: compare --gate rates (McNemar)",
                   finding(_record_set(bench.crossing, 0)),
                   found if found is None or RATES_REASON in found else f"(not the rates check) {found}")]


def _env_drift(contract_path: Path, variables: dict[str, str]) -> Finding:
    """`replaytests env` in a child process with the dispatch variables given: its cpu_isa drift line."""
    environ = {k: v for k, v in os.environ.items() if k not in (cpu_isa.ATEN, cpu_isa.ONEDNN, cpu_isa.MARK)}
    done = subprocess.run([sys.executable, "-m", "replaytests.cli", "env", "--contract", str(contract_path)],
                          env=environ | variables, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode:
        return f"replaytests env exited {done.returncode}: {done.stderr.strip()[-200:]}"
    return next((line.strip() for line in done.stdout.splitlines() if line.strip().startswith("environment.cpu_isa:")),
                None)


def isa_cells(bench: Bench) -> list[Cell]:
    """A child process dispatching BF16 kernels to AVX-512 where the contract pins AVX2: drift reported."""
    fault, check = f"kernels at AVX512, contract pins {bench.contract.cpu_isa}", "platform drift (replaytests env)"
    pinned, level = bench.contract.cpu_isa, cpu_isa.LEVELS["AVX512"]
    flags = cpu_isa.cpu_flags() or set()
    if pinned in (None, "AVX512"):
        return [Cell(fault, check, NOT_RUN, f"the contract pins cpu_isa {pinned}: no other level to drift from")]
    if missing := [flag for flag in level.flags if flag not in flags]:
        return [Cell(fault, check, NOT_RUN, f"this CPU lacks AVX-512 ({', '.join(missing)})")]
    return [judged(fault, check, _env_drift(bench.contract.path, {}),
                   _env_drift(bench.contract.path, {cpu_isa.ATEN: level.aten, cpu_isa.ONEDNN: level.onednn}))]


def serving_cells(bench: Bench) -> list[Cell]:
    return [Cell("prefix-cache hit on a stale block", "serving live~prefix_hit (families/serving.py)",
                 NOT_RUN, f"needs a serving backend (one with {', '.join(sorted(SERVING))}: "
                          f"{', '.join(serving_backends())}); its own tests run it")]


def serving_backends() -> list[str]:
    """The registered backends with a serving engine's capabilities (replaytests.backends)."""
    return [name for name, declared in declarations().items() if declared.capabilities >= SERVING]


TRIALS = (ulp_cells, mask_cells, position_cells, token_cells, batch_cells, transplant_cells, ledger_cells,
          rates_cells, isa_cells, serving_cells)


def run_all(bench: Bench) -> list[Cell]:
    """Every trial's cells; a trial that raises is one failing cell naming the exception (the others run)."""
    cells = []
    for trial in TRIALS:
        try:
            cells += trial(bench)
        except Exception as exc:  # reported as the trial's cell, which fails the selftest
            cells.append(Cell(trial.__name__.removesuffix("_cells"), "(the trial raised)", ERROR,
                              f"{type(exc).__name__}: {exc}"))
    return cells
