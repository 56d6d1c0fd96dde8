"""`replaytests compare BASELINE NEW`: the gate between a baseline run and a new one (issue 5).

The new run fails, with one reason per finding, when a replica pair is not exact, the bridge is not
bit-exact, a record present in both runs changed (a trajectory, a digest or any other leaf), a
headline divergence rate changed beyond chance (exact McNemar on the rows paired by id), donor
recovery fell below its gate (or more transplant controls than allowed took a third trajectory), or a
whole family/precision of the baseline is missing. Rows present in one run only are noted, not
failed.

The text explains before it lists: its first line is the result with the root cause when there is one
(the platform, the inputs or the contract differ between the two run.json files), then the causes,
the per-family, per-quantity table with counts, then at most a few examples of each kind of reason
(all of them with `verbose`), and the result again as the last line (docs/nightly.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from replaytests.errors import ConfigError
from replaytests.inputs.contract import default_gates, load_contract
from replaytests.inputs.gates import BRIDGE_PAIR, Gates, inexact, replica_pairs
from replaytests.inputs.platforms import platform_differences
from replaytests.outputs import ledger
from replaytests.outputs.audit import audit_record
from replaytests.outputs.report import (
    DIVERGENCES,
    FLAGS,
    MANIFEST_DIGESTS,
    SHAPES,
    collate,
    get_path,
    mcnemar_paired,
    read_run,
)
from replaytests.outputs.stats import wilson
from replaytests.outputs.tables import Table, plain

LEVEL = 0.05
TRANSPLANT = "transplant"
HEADER = ("family", "precision", "measure", "rows", "baseline [Wilson 95%]", "new [Wilson 95%]", "p", "verdict")
Group = tuple[str, str]  # (family, precision)


def transplant_outcomes(record: dict) -> dict[str, str]:
    """Each direction's outcome ("follows_donor", "keeps_own" or "third") of an ok transplant record
    (families/transplant.py): the one place that reads the transplant record's shape."""
    return {name: result["outcome"] for name, result in record.get("transplants", {}).items()}


def gates_of(contract: Path | None = None) -> Gates:
    """The gates of a contract (docs/contract.md); without one, the contract defaults."""
    return load_contract(contract).gates if contract is not None else default_gates()


@dataclass(frozen=True)
class Verdict:
    """One line of the verdict table."""

    group: Group
    measure: str
    rows: int
    baseline: tuple[int, int] | None
    new: tuple[int, int] | None
    p: float | None
    ok: bool
    allowed: bool = False  # a failure that only informs (`allow_changes`)

    def cells(self) -> tuple[str, ...]:
        counts = ["-" if c is None else _with_interval(*c) for c in (self.baseline, self.new)]
        verdict = "ok" if self.ok else "changed (allowed)" if self.allowed else "FAIL"
        return (*self.group, self.measure, str(self.rows), *counts, "-" if self.p is None else f"{self.p:.3g}", verdict)


def _with_interval(k: int, n: int) -> str:
    """`k/n [low, high]%`: the count with its Wilson 95% interval."""
    w = wilson(k, n)
    return f"{k}/{n} [{100 * w.ci_low:.1f}, {100 * w.ci_high:.1f}]%" if n else "0/0"


EXAMPLES = 3  # reasons shown of each kind without --verbose


@dataclass
class Comparison:
    lines: list[Verdict] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)  # what differs between the runs' run.json (platform, inputs)

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def result(self) -> str:
        return "PASS" if self.passed else f"FAIL: {len(self.reasons)} reasons"

    def text(self, verbose: bool = False) -> str:
        first = self.result + (f"; the runs differ in {self.causes[0]}" if self.causes else "")
        out = [first, *(f"cause: {cause}" for cause in self.causes), "",
               plain(Table("verdict", HEADER, tuple(line.cells() for line in self.lines)))]
        out += [f"note: {note}" for note in self.notes]
        kinds: dict[str, list[str]] = defaultdict(list)
        for reason in self.reasons:
            kinds[reason.partition(":")[0]].append(reason)
        for kind, reasons in kinds.items():
            shown = reasons if verbose else reasons[:EXAMPLES]
            out += [f"reason: {reason}" for reason in shown]
            if len(reasons) > len(shown):
                out.append(f"reason: ... and {len(reasons) - len(shown)} more {kind} reasons (--verbose lists them)")
        return "\n".join([*out, self.result])


def _groups(records: list[dict]) -> dict[Group, dict[str, dict]]:
    """(family, precision) -> row id -> record."""
    out: dict[Group, dict[str, dict]] = defaultdict(dict)
    for record in records:
        out[(record["family"], record["precision"])][record["row"]] = record
    return out


def _ok(rows: dict[str, dict]) -> list[dict]:
    return [rows[row] for row in sorted(rows) if rows[row]["status"] == "ok"]


def _where(record: dict) -> str:
    return "/".join(ledger.key(record))


def _inexact(record: dict, pairs: list[str]) -> list[str]:
    """`pair (field false, ...)` for each pair of the record that is not bit-exact (cache, logits, suffix)."""
    return [f"{pair} ({', '.join(f'{f} false' for f in failed)})" for pair in pairs
            if (failed := inexact(record["comparisons"][pair]))]


def _exactness(out: Comparison, group: Group, base: dict, new: dict, measure: str,
               pairs: Callable[[dict], list[str]], required: bool) -> None:
    """A gate on the new run: every ok record's `pairs` bit-exact (the baseline's count informs); where
    the contract does not require it, an inexact pair is a note."""
    def split(rows: dict) -> tuple[int, list[tuple[dict, list[str]]]]:
        """Ok records carrying the pairs, and (record, its inexact pairs) for each that is not exact."""
        carrying = [r for r in _ok(rows) if pairs(r)]
        return len(carrying), [(r, bad) for r in carrying if (bad := _inexact(r, pairs(r)))]

    (n_base, bad_base), (n_new, bad_new) = split(base), split(new)
    if n_new:
        out.lines.append(Verdict(group, measure, n_new, (n_base - len(bad_base), n_base) if n_base else None,
                                 (n_new - len(bad_new), n_new), None, not bad_new, not required))
    (out.reasons if required else out.notes).extend(f"{measure}: {_where(r)} {'; '.join(bad)}" for r, bad in bad_new)


def _bridge(record: dict) -> list[str]:
    return [BRIDGE_PAIR] if record["family"] == "bridge" and BRIDGE_PAIR in record["comparisons"] else []


def _changes(out: Comparison, group: Group, base: dict, new: dict, allow: bool) -> None:
    """Every record in both runs must reproduce leaf by leaf; the first change named is the most telling."""
    both = sorted(base.keys() & new.keys())
    if not both:
        return
    changed = [(new[row], audit) for row in both if not (audit := audit_record(base[row], new[row])).reproduced]
    lines = [f"changed: {_where(record)}: {audit.changes[0]}"
             + (f" (and {len(audit.changes) - 1} more leaves)" if len(audit.changes) > 1 else "")
             for record, audit in changed]
    (out.notes if allow else out.reasons).extend(lines)
    out.lines.append(Verdict(group, "records reproduce", len(both), None, (len(both) - len(changed), len(both)), None,
                             not changed, allow))


def _rates(out: Comparison, group: Group, base: dict, new: dict, level: float) -> None:
    """Each headline divergence, paired by row: exact McNemar between the runs, p < level fails."""
    both = [(base[row], new[row]) for row in sorted(base.keys() & new.keys())
            if base[row]["status"] == new[row]["status"] == "ok"]
    for pair in SHAPES[group[0]].headline:
        paired = [(b["comparisons"][pair], n["comparisons"][pair]) for b, n in both
                  if pair in b["comparisons"] and pair in n["comparisons"]]
        for name in DIVERGENCES if paired else ():
            flag = FLAGS[name][0]
            if any(flag not in c for comps in paired for c in comps):
                continue
            x, y = [not b[flag] for b, _ in paired], [not n[flag] for _, n in paired]
            test = mcnemar_paired(x, y)
            counts = (sum(x), len(paired)), (sum(y), len(paired))
            out.lines.append(Verdict(group, f"{pair} {name.replace('_', ' ')}", len(paired), *counts, test.p,
                                     test.p >= level))
            if test.p < level:
                out.reasons.append(
                    f"divergence rate changed beyond chance: {'/'.join(group)} {pair} {name.replace('_', ' ')}: "
                    f"baseline {counts[0][0]}/{len(paired)}, new {counts[1][0]}/{len(paired)} (baseline only "
                    f"{test.b}, new only {test.c}), McNemar p = {test.p:.3g} < {level:g}")


def _outcome_counts(rows: dict, role: str, outcome: str) -> dict[str, tuple[int, int]]:
    """Per direction: (records of `role` with `outcome`, records of `role`) over the ok records."""
    seen = [transplant_outcomes(r) for r in _ok(rows) if r.get("role") == role]
    return {name: (sum(o[name] == outcome for o in seen), len(seen)) for name in sorted({n for o in seen for n in o})}


def _transplant(out: Comparison, group: Group, base: dict, new: dict, gates: Gates) -> None:
    """Donor recovery per direction on the divergent rows, third trajectories on the controls (new run),
    judged by gates.transplant."""
    follows, thirds = _outcome_counts(new, "divergent", "follows_donor"), _outcome_counts(new, "control", "third")
    failed = [j.message for j in gates.transplant_family(follows, thirds) if j.failed]
    for label, role, outcome, counts in (("follows donor", "divergent", "follows_donor", follows),
                                         ("third trajectory", "control", "third", thirds)):
        before = _outcome_counts(base, role, outcome)
        for name, (k, n) in counts.items():
            ok = not any(m.startswith(f"{name}: {label} ") for m in failed)
            out.lines.append(Verdict(group, f"{name} {label}", n, before.get(name), (k, n), None, ok))
    out.reasons += [f"transplant gate: {'/'.join(group)} {message}" for message in failed]


def _presence(out: Comparison, base: dict[Group, dict], new: dict[Group, dict]) -> None:
    for group in sorted(base.keys() | new.keys()):
        if group not in new:
            out.reasons.append(f"{'/'.join(group)}: {len(base[group])} records in the baseline, none in the new run")
        for name, rows in (("baseline", base.get(group, {}).keys() - new.get(group, {}).keys()),
                           ("new run", new.get(group, {}).keys() - base.get(group, {}).keys())):
            if rows and group in base and group in new:
                shown = sorted(rows)
                out.notes.append(f"{'/'.join(group)}: {len(rows)} rows only in the {name} "
                                 f"({', '.join(shown[:5])}{', ...' if len(rows) > 5 else ''})")
            elif rows and group not in base:
                out.notes.append(f"{'/'.join(group)}: new in this run ({len(rows)} records)")


def causes(base_run: dict | None, new_run: dict | None) -> list[str]:
    """What differs between two runs' run.json that explains changed numbers: the platform, the
    inputs (bank, model, tokenizer digests) and the contract (by sha256, not by path)."""
    if not base_run or not new_run:
        return []
    out = []
    if base_run.get("platform") != new_run.get("platform"):
        differences = platform_differences(base_run.get("platform"), new_run.get("platform") or {}, "baseline", "new")
        out.append("the platform: " + "; ".join(differences))
    manifests = [run.get("manifest") or {} for run in (base_run, new_run)]
    same_schema = manifests[0].get("schema") == manifests[1].get("schema")  # model and tokenizer digests are
    for name, path in MANIFEST_DIGESTS.items():                            # defined by the manifest's schema
        before, after = (get_path(manifest, *path) for manifest in manifests)
        if before != after and name != "contract_sha256" and (same_schema or name == "bank_sha256"):
            out.append(f"the input {name.removesuffix('_sha256')}: sha256 {str(before)[:12]}… (baseline) vs "
                       f"{str(after)[:12]}… (new)")
    before, after = ((run.get("contract") or {}).get("sha256") for run in (base_run, new_run))
    if before != after:
        out.append(f"the contract: sha256 {str(before)[:12]}… (baseline) vs {str(after)[:12]}… (new)")
    return out


def compare(baseline: list[dict], new: list[dict], level: float = LEVEL, gates: Gates | None = None,
            allow_changes: bool = False) -> Comparison:
    """The gate of `new` against `baseline` (ledger records)."""
    gates = gates or default_gates()
    out = Comparison()
    base_groups, new_groups = _groups(baseline), _groups(new)
    _presence(out, base_groups, new_groups)
    for group in sorted(new_groups):
        base, current = base_groups.get(group, {}), new_groups[group]
        if excluded := sorted(row for row, r in current.items() if r["status"] != "ok"):
            out.notes.append(f"{'/'.join(group)}: {len(excluded)} records excluded in the new run "
                             f"(fail-closed checks): {', '.join(excluded)}")
        _exactness(out, group, base, current, "replicas exact", replica_pairs,
                   gates.replicas_exact.get(group[0], True))
        _exactness(out, group, base, current, "bridge bit exact", _bridge, gates.bridge_exact)
        _changes(out, group, base, current, allow_changes)
        if group[0] in SHAPES:
            _rates(out, group, base, current, level)
        if group[0] == TRANSPLANT:
            _transplant(out, group, base, current, gates)
    return out


def compare_paths(baseline: Path, new: Path, level: float = LEVEL, contract: Path | None = None,
                  allow_changes: bool = False, across_inputs: bool = False,
                  accept_interrupted: bool = False) -> Comparison:
    """compare() on two ledgers (files, run directories or report roots), with the causes their
    run.json files give. Refused (check_comparable) where the comparison would have nothing to say."""
    base_records, new_records = collate([baseline]), collate([new])
    base_run, new_run = read_run(baseline), read_run(new)
    check_comparable((baseline, base_records, base_run), (new, new_records, new_run), across_inputs,
                     accept_interrupted)
    out = compare(base_records, new_records, level, gates_of(contract), allow_changes)
    out.causes = causes(base_run, new_run)
    return out


def check_comparable(baseline: tuple[Path, list[dict], dict | None], new: tuple[Path, list[dict], dict | None],
                     across_inputs: bool, accept_interrupted: bool) -> None:
    """A ConfigError, one line, where a comparison could only pass vacuously or mislead: a side that is an
    interrupted run (unless accept_interrupted), runs made on other inputs (bank, model or tokenizer
    digests; unless across_inputs), or no (family, row, precision) record in common. Each side is its
    (path, records, run.json)."""
    for name, (path, _, run) in (("baseline", baseline), ("new", new)):
        if get_path(run or {}, "run", "interrupted") and not accept_interrupted:
            raise ConfigError(f"compare: {path} ({name}) is an interrupted run (it holds only what it finished); "
                              "pass --accept-interrupted to compare it anyway")
    (base_path, base, base_run), (new_path, new_records, new_run) = baseline, new
    inputs = [c for c in causes(base_run, new_run) if c.startswith("the input ")]
    if inputs and not across_inputs:
        raise ConfigError(f"compare {base_path} {new_path}: the runs were made on other inputs ({'; '.join(inputs)});"
                          " pass --across-inputs to compare them anyway")
    if not {ledger.key(r) for r in base} & {ledger.key(r) for r in new_records}:
        rows = [sorted({r["row"] for r in records}) for records in (base, new_records)]
        shown = [", ".join(r[:2]) + (", ..." if len(r) > 2 else "") for r in rows]
        raise ConfigError(f"compare {base_path} {new_path}: no (family, row, precision) record in common (baseline "
                          f"rows {shown[0]}; new rows {shown[1]}): nothing to compare")
