"""The short per-family, per-precision table printed after a run and written to summary.md."""

from __future__ import annotations

from collections import defaultdict

COLUMNS = ("family", "precision", "rows", "excluded", "replicas exact", "cache exact",
           "suffix div.", "answer div.", "correct. flips")


def _count(records: list[dict], test) -> str:
    return f"{sum(1 for r in records if test(r))}/{len(records)}"


def _row(family: str, precision: str, records: list[dict]) -> list[str]:
    ok = [r for r in records if r["status"] == "ok"]
    cross = "incremental~prefill" if family == "crossing" else "live~incremental"
    replicas = [name for name in ("incremental~incremental_replica", "prefill~prefill_replica")
                if ok and name in ok[0]["comparisons"]]

    def replicas_exact(r: dict) -> bool:
        return all(r["comparisons"][n]["cache_exact"] and r["comparisons"][n]["suffix_equal"] for n in replicas)

    return [
        family, precision, str(len(records)), str(len(records) - len(ok)),
        _count(ok, replicas_exact) if replicas else "-",
        _count(ok, lambda r: r["comparisons"][cross]["cache_exact"]),
        _count(ok, lambda r: not r["comparisons"][cross]["suffix_equal"]),
        _count(ok, lambda r: not r["comparisons"][cross]["answer_equal"]),
        _count(ok, lambda r: not r["comparisons"][cross]["correct_equal"]),
    ]


def table_rows(records: list[dict]) -> list[list[str]]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["family"], record["precision"])].append(record)
    return [_row(family, precision, groups[(family, precision)]) for family, precision in sorted(groups)]


def text_table(records: list[dict]) -> str:
    rows = [list(COLUMNS), *table_rows(records)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def markdown(records: list[dict], header: dict[str, str]) -> str:
    lines = ["# replaytests run summary", ""]
    lines += [f"- **{name}**: {value}" for name, value in header.items()]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(records)]
    lines += ["", "Divergence columns compare incremental with prefill (crossing) or live with incremental "
              "(bridge); each count is k/n over the rows that passed every fail-closed check.", ""]
    excluded = [r for r in records if r["status"] != "ok"]
    if excluded:
        lines += ["## Excluded rows", ""] + [f"- {r['family']} {r['row']} {r['precision']}: {r['reason']}"
                                              for r in excluded] + [""]
    return "\n".join(lines)
