"""`replaytests compare BASELINE NEW`: the gate between a baseline run and a new one.

A change between the runs is judged at one of three levels (LEVELS, `--gate`), strictest first:

- `bits`: a record present in both runs changed in any leaf (a digest, a drift, a trajectory);
- `trajectories`: a suffix, answer or correctness label (or a live z, a transplant outcome: any leaf
  that is not a numeric fingerprint, records.BITS) changed on a paired row;
- `rates`: a headline divergence rate changed beyond chance (exact McNemar on the rows paired by id; for the
  conversation family, at each turn index; for the edge sweep, the continuations at each swept value, on the rows
  where both runs hold the point and its premise held); for the rollout families, the trainer's recompute's per-row
  mismatch (k3, mean |delta logp|) moved beyond chance (a paired sign-flip permutation test on the rows paired by id).

A gate at a level fails on findings at that level and every coarser one; finer findings are notes.
Whatever the level, the new run fails when a replica pair is not exact (or an ok record lacks one its
family compares), the bridge or a rollout's control (live~incremental) is not bit-exact, a rollout's recompute
passes the contract's rollout bounds, a conversation fails its gates at some turn (its replicas, the turn-1
control, assistant turns in a cell the contract requires exact), an edge sweep fails its gates at some point (its
replicas, continuations in a cell the contract requires exact), a headline pair diverges in a cell where the
contract forbids it, a transplant family's donor recovery fell below its gate (or more of its controls than allowed
took a third trajectory: the transplant's, the conversation transplant's), a whole family/cell of the baseline is
missing, rows the baseline judged were excluded in the new run (or a family/cell has no testable row), or a cell's
definition changed. A cell whose gates are unknown is refused (check_cells): never taken for one allowed to
diverge. An expected-state file (outputs/expected.py) accepts known changes per family and cell, and fails where one
no longer occurs ("improved"). Rows present in one run only are noted.

What the checks find, and its text, are outputs/findings.py's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from replaytests.backends import DEFAULT
from replaytests.errors import ConfigError
from replaytests.families.registry import FAMILIES
from replaytests.files import lookup
from replaytests.inputs.contract import default_gates, load_contract
from replaytests.inputs.gates import LEVELS, Gates, inexact, replica_pairs
from replaytests.inputs.platforms import platform_differences, retired
from replaytests.outputs import causal, family_sections, localization
from replaytests.outputs.audit import audit_record
from replaytests.outputs.expected import Expected
from replaytests.outputs.findings import RATES_REASON, Findings, Group, Measure, Rows, ok_records
from replaytests.outputs.ledger import cell_digests, collate
from replaytests.outputs.records import Record
from replaytests.outputs.rundir import ledger_of
from replaytests.outputs.runs import MANIFEST_DIGESTS, read_run
from replaytests.outputs.shapes import DIVERGENCES, FLAGS, SHAPES, missing_replicas
from replaytests.outputs.stats import mcnemar_paired
from replaytests.outputs.tables import first

ALPHA = 0.05  # the significance of the rates level (McNemar; the rollouts' sign-flip test)


def gates_of(contract: Path | None = None) -> Gates:
    """The gates of a contract (docs/contract.md); without one, the contract defaults."""
    return load_contract(contract).gates if contract is not None else default_gates()


def check_gate(gate: str) -> str:
    if gate not in LEVELS:
        raise ConfigError(f"--gate {gate!r}: expected one of {', '.join(LEVELS)}")
    return gate


def _groups(records: list[Record]) -> dict[Group, Rows]:
    """(family, cell) -> row id -> record."""
    out: dict[Group, Rows] = defaultdict(dict)
    for record in records:
        out[(record.family, record.precision)][record.row] = record
    return out


def _inexact(record: Record, pairs: list[str]) -> list[str]:
    """`pair (field false, ...)` for each pair of the record that is not bit-exact (cache, logits, suffix), and
    `pair (not recorded)` for each it does not carry."""
    return [f"{pair} (not recorded)" if pair not in record.comparisons else
            f"{pair} ({', '.join(f'{f} false' for f in failed)})" for pair in pairs
            if pair not in record.comparisons or (failed := inexact(record.comparisons[pair]))]


def _replicas(record: Record) -> list[str]:
    """The record's replica pairs: those it carries, then those its family compares that it lacks."""
    return [*replica_pairs(record), *missing_replicas(record)]


def _exactness(out: Findings, group: Group, base: Rows, new: Rows, measure: str,
               pairs: Callable[[Record], list[str]], required: bool) -> None:
    """A gate on the new run: every ok record's `pairs` bit-exact (the baseline's count informs); where
    the contract does not require it, an inexact pair is a note. A pair the record's family compares and the
    record lacks fails at every level: the check was never made."""
    def split(rows: Rows) -> tuple[int, list[tuple[Record, list[str]]]]:
        """Ok records carrying the pairs, and (record, its inexact pairs) for each that is not exact."""
        carrying = [r for r in ok_records(rows) if pairs(r)]
        return len(carrying), [(r, bad) for r in carrying if (bad := _inexact(r, pairs(r)))]

    (n_base, bad_base), (n_new, bad_new) = split(base), split(new)
    if n_new:
        out.lines.append(Measure(group, measure, n_new, (n_base - len(bad_base), n_base) if n_base else None,
                                 (n_new - len(bad_new), n_new), None, not bad_new, not required))
    for record, bad in bad_new:
        (out.reasons if required or missing_replicas(record) else out.notes).append(
            f"{measure}: {record.label} {'; '.join(bad)}")


def _excluded(out: Findings, group: Group, base: Rows, new: Rows) -> None:
    """Records excluded by fail-closed checks in the new run. Rows the baseline judged (ok there) that the
    new run excluded fail at every level, as does a family and cell of the new run with no ok record: a
    gate met on rows nobody could test is vacuous. Other exclusions (rows the baseline also excluded, or
    does not hold) are noted."""
    cell = "/".join(group)
    lost = [row for row in sorted(new) if not new[row].ok and row in base and base[row].ok]
    if lost:
        out.reasons.append(f"excluded: {cell}: {len(lost)} of {len(ok_records(base))} rows ok in the baseline failed "
                           f"closed in the new run ({first(lost)}; {lost[0]}: {new[lost[0]].reason})")
    if not ok_records(new):
        out.reasons.append(f"no testable row: {cell}: each of the new run's {len(new)} records was excluded "
                           "(fail-closed checks): nothing in this family and cell could be judged")
    if others := [row for row in sorted(new) if not new[row].ok and row not in lost]:
        out.notes.append(f"{cell}: {len(others)} records excluded in the new run (fail-closed checks): "
                         f"{', '.join(others)}")


def _definitions(out: Findings, baseline: list[Record], new: list[Record]) -> None:
    """A cell whose definition (its records' cell_digest) differs between the runs is another cell under
    the same name: its records are not comparable, a reason at every level."""
    before, after = cell_digests(baseline), cell_digests(new)
    for cell in sorted(before.keys() & after.keys()):
        if before[cell] != after[cell]:
            out.reasons.append(f"cell {cell}: definition changed (digest {before[cell][:12]}… vs {after[cell][:12]}…, "
                               "baseline vs new): its records are of another cell under the same name")


def _changes(out: Findings, group: Group, base: Rows, new: Rows) -> None:
    """Every record in both runs reproduces leaf by leaf (level bits) and trajectory by trajectory (level
    trajectories); the first change named is the most telling."""
    both = sorted(base.keys() & new.keys())
    if not both:
        return
    audits = [(new[row], audit) for row in both if not (audit := audit_record(base[row], new[row])).reproduced]
    moved = 0
    for record, audit in audits:
        trajectory = audit.trajectory_changes
        shown = trajectory or audit.changes
        more = f" (and {len(audit.changes) - 1} more leaves)" if len(audit.changes) > 1 else ""
        if trajectory:
            moved += 1
            out.finding("trajectories", group, f"trajectory changed: {record.label}: {shown[0]}{more}")
        else:
            out.finding("bits", group, f"changed: {record.label}: {shown[0]}{more}")
    for measure, level, changed in (("records reproduce", "bits", len(audits)),
                                    ("trajectories reproduce", "trajectories", moved)):
        out.lines.append(Measure(group, measure, len(both), None, (len(both) - changed, len(both)), None,
                                 not changed, not out.gated(level)))


def _exact_cell_divergence(out: Findings, group: Group, new: Rows, gates: Gates) -> None:
    """The zero-divergence gate of an exact cell, at every level: a headline pair of the new run whose
    suffixes diverge in a cell where the contract (gates.<family>.suffix_divergence_allowed.<cell>: false)
    does not allow it. A family without divergence gates (the bridge: gates.bridge.exact) is not judged here;
    a cell its gates do not name is exact (compare_paths refuses one before any gate: check_cells)."""
    family, cell = group
    if family not in gates.suffix_divergence_allowed or gates.suffix_divergence_allowed[family].get(cell, False):
        return
    for record in ok_records(new):
        for pair in SHAPES[family].headline:
            metrics = record.comparisons.get(pair)
            if metrics is not None and not metrics.suffix_equal:
                out.reasons.append(f"{cell} divergence: {record.label} {pair} suffixes diverge at suffix index "
                                   f"{metrics.first_divergence} (gate {family}.suffix_divergence_allowed.{cell}: "
                                   "false)")


def _rates(out: Findings, group: Group, base: Rows, new: Rows, alpha: float) -> None:
    """Each headline divergence, paired by row: exact McNemar between the runs, p < level fails."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys()) if base[row].ok and new[row].ok]
    for pair in SHAPES[group[0]].headline:
        paired = [(b.comparisons[pair], n.comparisons[pair]) for b, n in both
                  if pair in b.comparisons and pair in n.comparisons]
        for name in DIVERGENCES if paired else ():
            flag = FLAGS[name][0]
            x, y = [not getattr(b, flag) for b, _ in paired], [not getattr(n, flag) for _, n in paired]
            test = mcnemar_paired(x, y)
            counts = (sum(x), len(paired)), (sum(y), len(paired))
            out.lines.append(Measure(group, f"{pair} {name.replace('_', ' ')}", len(paired), *counts, test.p,
                                     test.p >= alpha))
            if test.p < alpha:
                measure = f"{'/'.join(group)} {pair} {name.replace('_', ' ')}"
                out.finding("rates", group,
                            f"{RATES_REASON}: {measure}: baseline "
                            f"{counts[0][0]}/{len(paired)}, new {counts[1][0]}/{len(paired)} (baseline only "
                            f"{test.b}, new only {test.c}), McNemar p = {test.p:.3g} < {alpha:g}")


def _presence(out: Findings, base: dict[Group, Rows], new: dict[Group, Rows]) -> None:
    """A (family, cell) of the baseline with no record in the new run fails; rows in one run only
    are noted, one line per family and side (its cells and the first few row ids)."""
    one_side: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for group in sorted(base.keys() | new.keys()):
        if group not in new:
            out.reasons.append(f"{'/'.join(group)}: {len(base[group])} records in the baseline, none in the new run")
        elif group not in base:
            out.notes.append(f"{'/'.join(group)}: new in this run ({len(new[group])} records)")
        else:
            for name, rows in (("baseline", base[group].keys() - new[group].keys()),
                               ("new run", new[group].keys() - base[group].keys())):
                for row in rows:
                    one_side[(group[0], name)][row].add(group[1])
    for (family, name), rows in sorted(one_side.items()):
        cells = sorted({p for ps in rows.values() for p in ps})
        out.notes.append(f"{family}: {len(rows)} rows only in the {name} ({', '.join(cells)}: "
                         f"{first(sorted(rows))})")


def causes(base_run: dict | None, new_run: dict | None) -> list[str]:
    """What differs between two runs' run.json that explains changed numbers: the platform, the
    inputs (bank, model, tokenizer digests) and the contract (by sha256, not by path)."""
    if not base_run or not new_run:
        return []
    out = []
    if base_run.get("platform") != new_run.get("platform"):
        differences = platform_differences(base_run.get("platform"), new_run.get("platform") or {}, "baseline", "new",
                                           retired(lookup(new_run, "options", "backend") or DEFAULT))
        out.append("the platform: " + "; ".join(differences))
    manifests = [run.get("manifest") or {} for run in (base_run, new_run)]
    same_schema = manifests[0].get("schema") == manifests[1].get("schema")  # model and tokenizer digests are
    for name, path in MANIFEST_DIGESTS.items():                            # defined by the manifest's schema
        before, after = (lookup(manifest, *path) for manifest in manifests)
        if before != after and name != "contract_sha256" and (same_schema or name == "bank_sha256"):
            out.append(f"the input {name.removesuffix('_sha256')}: sha256 {str(before)[:12]}… (baseline) vs "
                       f"{str(after)[:12]}… (new)")
    before, after = ((run.get("contract") or {}).get("sha256") for run in (base_run, new_run))
    if before != after:
        out.append(f"the contract: sha256 {str(before)[:12]}… (baseline) vs {str(after)[:12]}… (new)")
    return out


def _cross_runtime(out: Findings, group: Group, base: Rows, new: Rows, runtimes: tuple[str, str]) -> None:
    """Runs of two runtimes on one bank: per arm both ran (live, incremental, prefill and their replicas),
    the rows whose z and suffix are the same on both, with its Wilson interval (informs; the gate judges
    the trajectories)."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys()) if base[row].ok and new[row].ok]
    arms = [arm for arm in FAMILIES[group[0]].arms if all(arm in b.arms and arm in n.arms for b, n in both)]
    for arm in arms if both else ():
        same = sum(b.arms[arm].suffix == n.arms[arm].suffix and b.arms[arm].z_sha256 == n.arms[arm].z_sha256
                   for b, n in both)
        out.lines.append(Measure(group, f"{arm}: same z and suffix, {runtimes[0]} vs {runtimes[1]}", len(both), None,
                                 (same, len(both)), None, same == len(both), not out.gated("trajectories")))


def compare(baseline: list[Record], new: list[Record], alpha: float = ALPHA, gates: Gates | None = None,
            gate: str = "bits", expected: Expected | None = None,
            runtimes: tuple[str, str] | None = None) -> Findings:
    """The gate of `new` against `baseline` (ledger records) at `gate` (LEVELS). With `runtimes` (the two
    runs' backends, where they differ) the families only one runtime serves are noted, not required, and
    each arm both ran is counted row by row across the runtimes."""
    gates = gates or default_gates()
    out = Findings(check_gate(gate), expected, across_runtimes=bool(runtimes))
    base_groups, new_groups = _groups(baseline), _groups(new)
    if runtimes:
        base_families, new_families = ({family for family, _ in groups} for groups in (base_groups, new_groups))
        for name, side, only in (("baseline", runtimes[0], base_families - new_families),
                                 ("new run", runtimes[1], new_families - base_families)):
            if only:
                out.notes.append(f"families only the {name} ({side}) ran, not compared: {', '.join(sorted(only))}")
        common = base_groups.keys() & new_groups.keys()
        base_groups = {g: rows for g, rows in base_groups.items() if g in common}
        new_groups = {g: rows for g, rows in new_groups.items() if g in common}
    _presence(out, base_groups, new_groups)
    _definitions(out, baseline, new)
    for group in sorted(new_groups):
        base, current = base_groups.get(group, {}), new_groups[group]
        _excluded(out, group, base, current)
        _exactness(out, group, base, current, "replicas exact", _replicas,
                   gates.replicas_exact.get(group[0], True))
        if (control := gates.controls.get(group[0])) is not None:  # the bridge's, a rollout's (registry)
            _exactness(out, group, base, current, f"{FAMILIES[group[0]].control.name} bit exact",
                       lambda r: [pair] if (pair := gates.control_pair(r)) else [], control.required)
        _changes(out, group, base, current)
        if group[0] in SHAPES:
            _exact_cell_divergence(out, group, current, gates)
            _rates(out, group, base, current, alpha)
        for module in (family_sections.of(group[0]), causal.of(group[0])):  # its report section's, its outcomes'
            if module is not None:
                module.compare(out, group, base, current, gates, alpha)
        if runtimes and group[0] in FAMILIES:
            _cross_runtime(out, group, base, current, runtimes)
    if expected is not None:
        compared = base_groups.keys() & new_groups.keys()
        out.reasons += expected.improved(out.seen, compared) + expected.unmatched(compared)
    out.moved = localization.lines(baseline, new)
    return out


def compare_paths(baseline: Path, new: Path, alpha: float = ALPHA, contract: Path | None = None,
                  gate: str = "bits", across_inputs: bool = False, accept_interrupted: bool = False,
                  expected: Path | None = None) -> Findings:
    """compare() on two ledgers (files, run directories or report roots), with the causes their
    run.json files give. Refused (check_comparable) where the comparison would have nothing to say."""
    check_gate(gate)
    known = Expected.load(expected) if expected is not None else None
    base_records, new_records = collate([baseline]), collate([new])
    base_run, new_run = read_run(baseline), read_run(new)
    check_comparable((baseline, base_records, base_run), (new, new_records, new_run), across_inputs,
                     accept_interrupted)
    runtimes = tuple(lookup(run or {}, "options", "backend") or DEFAULT for run in (base_run, new_run))
    if runtimes[0] == runtimes[1]:
        runtimes = None
    elif gate == "bits":
        raise ConfigError(f"compare {baseline} {new}: the runs were made by other runtimes ({runtimes[0]} vs "
                          f"{runtimes[1]}), whose fingerprints are of different things (one a whole logit row and its "
                          "K/V, the other top-k logits): no bit can match; pass --gate trajectories or --gate rates")
    gates = gates_of(contract)
    check_cells([*base_records, *new_records], gates, contract, base_run or new_run)
    out = compare(base_records, new_records, alpha, gates, gate, known, runtimes)
    out.causes = causes(base_run, new_run)
    # One run given twice (the same ledger file, or copies of one run: the same run name and start time);
    # two runs whose records are equal are not that, they are an upgrade that moved nothing.
    base_id, new_id = (lookup(run or {}, "run") for run in (base_run, new_run))
    out.same = ledger_of(Path(baseline)).resolve() == ledger_of(Path(new)).resolve() or (
        base_id is not None and base_id == new_id)
    return out


def check_comparable(baseline: tuple[Path, list[Record], dict | None], new: tuple[Path, list[Record], dict | None],
                     across_inputs: bool, accept_interrupted: bool) -> None:
    """A ConfigError, one line, where a comparison could only pass vacuously or mislead: a side that is an
    interrupted run (unless accept_interrupted), runs made on other inputs (bank, model or tokenizer
    digests; unless across_inputs), or no (family, row, cell) record in common. Each side is its
    (path, records, run.json)."""
    for name, (path, _, run) in (("baseline", baseline), ("new", new)):
        if lookup(run or {}, "run", "interrupted") and not accept_interrupted:
            raise ConfigError(f"compare: {path} ({name}) is an interrupted run (it holds only what it finished); "
                              "pass --accept-interrupted to compare it anyway")
    (base_path, base, base_run), (new_path, new_records, new_run) = baseline, new
    inputs = [c for c in causes(base_run, new_run) if c.startswith("the input ")]
    if inputs and not across_inputs:
        raise ConfigError(f"compare {base_path} {new_path}: the runs were made on other inputs ({'; '.join(inputs)});"
                          " pass --across-inputs to compare them anyway")
    common = {r.key for r in base} & {r.key for r in new_records}
    if not common:
        rows = [sorted({r.row for r in records}) for records in (base, new_records)]
        shown = [", ".join(r[:2]) + (", ..." if len(r) > 2 else "") for r in rows]
        raise ConfigError(f"compare {base_path} {new_path}: no (family, row, cell) record in common (baseline "
                          f"rows {shown[0]}; new rows {shown[1]}): nothing to compare")
    judged = [{r.key for r in records if r.ok} & common for records in (base, new_records)]
    if not judged[0] & judged[1]:
        raise ConfigError(f"compare {base_path} {new_path}: each of the {len(common)} records in common failed closed "
                          "(excluded) in one run or both: nothing could be judged")


def check_cells(records: list[Record], gates: Gates, contract: Path | None, run: dict | None) -> None:
    """A ConfigError, one line, where the runs hold a cell whose gates compare does not know (not declared by
    --contract; without one, not one of the paper's cells the contract defaults judge): compare never takes
    an unknown cell for one allowed to diverge. `run` is a run.json, which names the contract of its run."""
    known = gates.may_diverge
    unknown = sorted({r.precision for r in records} - known.keys())
    if not unknown:
        return
    made = lookup(run or {}, "contract", "path")
    hint = f" (run.json names {made})" if made else ""
    which = (f"not declared by --contract {contract}" if contract is not None else
             f"without --contract, compare knows only the paper's cells: {', '.join(known)}")
    raise ConfigError(f"compare: the gates of cell {', '.join(unknown)} are unknown ({which}); pass --contract with "
                      f"the contract the runs were made under{hint}")
