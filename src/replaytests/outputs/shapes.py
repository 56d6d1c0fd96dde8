"""How the report reads each family's records: which pairs are its result, which must be exact, and the
comparison fields each report measure counts or summarises. The report, its renderers and compare all read
these; they import nothing of the report's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replaytests.backends import DEFAULT
from replaytests.families.registry import FAMILIES
from replaytests.files import lookup
from replaytests.inputs.gates import bit_exact, replicas_exact

if TYPE_CHECKING:
    from replaytests.outputs.records import Record


@dataclass(frozen=True)
class Shape:
    """How the report reads a family: which pairs are its result and which must be exact."""

    headline: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()
    accuracy: tuple[str, str] | None = None  # (first, second): difference = second - first
    reductions: bool = False


# From the family registry (the report reads the ledger format, not the engine): families with a headline
# table; the causal ones have tables of their own (their outcome modules: outputs/causal.py), and families it does
# not know are rendered generically.
SHAPES = {f.name: Shape(f.headline, f.replicas, f.accuracy, f.reductions) for f in FAMILIES.values()
          if f.headline_table}
# report name: (comparison field, whether the count is of rows where the field is false)
FLAGS = {
    "cache_exact": ("cache_exact", False),
    "logits_exact": ("logits_exact", False),
    "argmax_differs": ("argmax_equal", True),
    "suffix_divergence": ("suffix_equal", True),
    "answer_divergence": ("answer_equal", True),
    "correctness_divergence": ("correct_equal", True),
    "steps_exact": ("steps_exact", False),  # a serving engine: every suffix step's top-k logits bitwise equal
}
DIVERGENCES = ("suffix_divergence", "answer_divergence", "correctness_divergence")
# report name: the comparison fields whose per-row maximum it summarises
SPREADS = {"cache_max_abs": ("k_max_abs", "v_max_abs"), "k_rel_l2": ("k_rel_l2",), "v_rel_l2": ("v_rel_l2",),
           "logits_max_abs": ("logits_max_abs",), "steps_max_abs": ("steps_max_abs",)}
PER_LAYER = ("k_rel_l2_per_layer", "v_rel_l2_per_layer")
# What a report shows for a family with replica pairs whose ok records carry none (report.json: null): the
# replica check is missing, never met.
NO_REPLICAS = "none recorded"


def missing_replicas(record: Record) -> list[str]:
    """The replica pairs the record's family compares (the registry's) that the record does not carry; for
    a family the registry does not know, none."""
    family = FAMILIES.get(record.family)
    return [pair for pair in (family.replicas if family else ()) if pair not in record.comparisons]


def replicas_hold(record: Record) -> bool:
    """The record carries every replica pair its family compares, and each is bit-exact (gates.replicas_exact);
    a record of turns (a conversation), at every turn, and a record of points (an edge sweep), at every point: a
    record without its replica comparisons was never checked, which is no pass."""
    pairs = FAMILIES[record.family].replicas if record.family in FAMILIES else ()
    steps = (*(record.turns or ()), *(record.sweep or ()))
    return not missing_replicas(record) and replicas_exact(record) and all(
        pair in t.comparisons and bit_exact(t.comparisons[pair]) for t in steps for pair in pairs)


def own_comparisons(record: Record, pair: str) -> list:
    """The record's own comparison of `pair` (none where it lacks the pair): what the headline table reads of a record
    whose family has no report section, or whose section reads it so."""
    return [record.comparisons[pair]] if pair in record.comparisons else []


def runtime(meta: dict) -> str:
    """The backend that made the records (run.json `options.backend`; the runs' where several were collated)."""
    runs = list((meta.get("runs") or {}).values()) or [meta]
    names = sorted({lookup(run, "options", "backend") or DEFAULT for run in runs
                    if isinstance(run.get("options"), dict)})
    return ", ".join(names) if names else "not recorded"


def replica_counts(family: str, summary: dict) -> list[tuple[str, str, str, dict | None]]:
    """A family's replica pairs per cell as a built report keeps them (report.json `families`): (family, cell, pair,
    the Wilson proportion of rows bit-exact)."""
    return [(family, cell, pair, lookup(s, "pairs", pair, "bit_exact")) for cell, s in summary["precisions"].items()
            for pair in FAMILIES[family].replicas if pair in s["pairs"]]
