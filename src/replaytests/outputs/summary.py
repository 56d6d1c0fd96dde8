"""The short per-family, per-cell table printed after a run and written to summary.md."""

from __future__ import annotations

from collections import defaultdict

from replaytests.families.registry import FAMILIES
from replaytests.inputs.gates import (
    Gates,
    replica_pairs,
    unmeasured,
)
from replaytests.outputs import causal, family_sections, verdict
from replaytests.outputs.records import Record
from replaytests.outputs.shapes import NO_REPLICAS, own_comparisons, replicas_hold
from replaytests.outputs.tables import Table, md_cell, plain
from replaytests.outputs.tables import markdown as md_table

# each family's headline pairs, as the notes under the table name them, with how its report section reads them (a
# conversation's: at every turn)
HEADLINE_PAIRS = "; ".join(f"{name}: {' and '.join(f.headline) or 'none'}"
                           + (f", {section.HEADLINE_SCOPE}" if (section := family_sections.of(name))
                              and section.HEADLINE_SCOPE else "")
                           for name, f in FAMILIES.items())
HEADLINE_NOTE = (f"Cache and divergence columns compare each family's headline arms ({HEADLINE_PAIRS}); each count "
                 "is k/n over the rows that passed every fail-closed check.")
COLUMNS = ("family", "precision", "rows", "excluded", "replicas exact", "cache exact",
           "suffix div.", "answer div.", "correct. flips")
METRICS = ("cache_exact", "logits_exact", "k_rel_l2", "v_rel_l2", "logits_max_abs", "suffix_equal",
           "margins_at_divergence",
           "first_divergence", "answer_equal", "correct_equal")


def _count(records: list[Record], test) -> str:
    return f"{sum(1 for r in records if test(r))}/{len(records)}"


def _row(family: str, cell: str, records: list[Record]) -> list[str]:
    ok = [r for r in records if r.ok]
    known = FAMILIES.get(family)
    if known is None:  # a family this version does not know: counts only
        return [family, cell, str(len(records)), str(len(records) - len(ok))] + ["?"] * 5

    # what the row reads of a record: as its family's report section reads it (`headline_comparisons`: a
    # conversation's pairs at every turn, a sweep's at every point whose premise held), else the record's own
    section = family_sections.of(family)
    read = section.headline_comparisons if section is not None else own_comparisons

    def every(field: str, pairs: tuple[str, ...]):
        return lambda r: all(getattr(c, field) for p in pairs for c in read(r, p))

    def some_not(field: str):
        return lambda r: not every(field, known.headline)(r)

    replicas = "-" if not known.replicas else _count(ok, replicas_hold) if replicas_recorded(ok) else NO_REPLICAS
    if not known.headline:  # no headline pair: nothing to count (a count over no pair would be a vacuous k/n)
        return [family, cell, str(len(records)), str(len(records) - len(ok)), replicas, *["-"] * 4]
    measured = not any(unmeasured(c) for r in ok for p in known.headline for c in read(r, p))
    divergences = ([_count(ok, some_not(name)) for name in ("suffix_equal", "answer_equal", "correct_equal")]
                   if section is None or section.HEADLINE_DIVERGENCES else ["-"] * 3)
    return [
        family, cell, str(len(records)), str(len(records) - len(ok)), replicas,
        _count(ok, every("cache_exact", known.headline)) if measured else "not measured", *divergences]


def replicas_recorded(ok: list[Record]) -> bool:
    """Whether any of these ok records carries a replica pair (none: the replica check is missing, not met);
    without ok records, nothing was expected."""
    return not ok or any(replica_pairs(r) for r in ok)


def table_rows(records: list[Record]) -> list[list[str]]:
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in records:
        groups[(record.family, record.precision)].append(record)
    order = {name: n for n, name in enumerate(FAMILIES)}  # the registry's order, then families it does not know
    return [_row(family, cell, groups[(family, cell)])
            for family, cell in sorted(groups, key=lambda g: (order.get(g[0], len(order)), g))]


def text_table(built: dict) -> str:
    """The headline table of a built report for a terminal, then the conversation family's turns and the edge sweep's
    values where they ran."""
    text = plain(Table("summary", COLUMNS, tuple(map(tuple, built["headline"]["rows"]))))
    for table in (module.summary_table(built) for module in family_sections.modules() if module.TERMINAL):
        text += f"\n\n{table.title} ({table.note})\n{plain(table)}" if table else ""
    return text


def audit_line(audits: list[dict]) -> str:
    """One line: how many baseline records reproduced, over how many leaves, and which did not."""
    changed = ["/".join(a["key"]) for a in audits if a["changes"]]
    line = (f"ledger audit: {len(audits) - len(changed)}/{len(audits)} baseline records reproduce "
            f"({sum(a['leaves'] for a in audits)} leaves compared)")
    shown = ", ".join(sorted(changed)[:10]) + (f", ... ({len(changed) - 10} more)" if len(changed) > 10 else "")
    return line + (f"; changed: {shown}" if changed else "")


def causal_lines(built: dict, gates: Gates) -> list[str]:
    """The causal families' outcomes of a built report (`causal_cells`), with Wilson 95% intervals and the
    verdict of their gates, each family's cells in turn (outputs/causal.py: each family's outcome module)."""
    found = built.get("causal_cells") or {}
    return [line for family, outcome in causal.outcomes().items() for cell, by_family in found.items()
            if family in by_family for line in outcome.terminal_lines(family, cell, by_family[family], gates)]


def metrics(record: Record) -> dict:
    """The compact per-test view of a record: its key, status and each comparison's headline metrics."""
    return {
        "family": record.family, "row": record.row, "precision": record.precision, "status": record.status,
        "comparisons": {pair: {name: getattr(values, name) for name in METRICS}
                        for pair, values in record.comparisons.items()},
    }


def markdown(built: dict, header: dict[str, str], audits: list[dict] = (), causal: list[str] = (),
             outcome: dict | None = None) -> str:
    """summary.md of a built report: the verdict, the run's header, the headline table, the rollout, conversation
    and sweep tables, the audit, the causal lines and the excluded rows."""
    lines = ["# replaytests run summary", "", *(f"    {line}" for line in verdict.lines(outcome)), ""]
    lines += [f"- **{name}**: {md_cell(str(value))}" for name, value in header.items()]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(map(md_cell, row)) + " |" for row in built["headline"]["rows"]]
    lines += ["", HEADLINE_NOTE, ""]
    lines += [line for module in family_sections.modules() if (table := module.summary_table(built))
              for line in md_table(table, 2)]
    if audits:
        lines += [md_cell(audit_line(audits)), ""]  # its keys name bank rows: text, never markup
    if causal:
        lines += ["```", *causal, "```", ""]
    if excluded := built["excluded"]:
        lines += ["## Excluded rows", ""] + [md_cell(f"- {r['family']} {r['row']} {r['precision']}: {r['reason']}")
                                              for r in excluded] + [""]
    return "\n".join(lines)
