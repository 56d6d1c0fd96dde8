"""What a conformance test's report says of the records it read: each record's key facts, riding on the
report's user_properties (suite.fixtures puts them there), and the properties a JUnit XML or JSON report
carries of them and of each audit."""

from __future__ import annotations

import json

from replaytests.families.registry import CROSS, FAMILIES
from replaytests.outputs.records import Record


def facts(record: Record) -> dict:
    """What a test's report says of a record it read: its key and status and, per headline pair, the first
    divergence and the margins there (the record itself reaches the ledger from the run's records)."""
    pairs = FAMILIES[record.family].headline if record.family in FAMILIES else (CROSS,)  # a plugin not installed here
    return {"key": list(record.key), "status": record.status,
            "headline": {pair: [c.first_divergence, c.margins_at_divergence]
                         for pair in pairs if (c := record.comparisons.get(pair)) is not None}}


def properties(user_properties: list[tuple[str, object]], record_property: str,
               audit_property: str) -> list[tuple[str, object]]:
    """A test's properties as a JUnit XML or JSON report carries them: each record it read as its key,
    status and, per headline pair, the first divergence and the decision margins there (facts); an audit
    as the leaves that changed. Properties of other plugins are kept as they are."""
    out = []
    for name, value in user_properties:
        if name == record_property:
            fact = json.loads(value)
            key = "replaytests." + ".".join(fact["key"])
            out.append((f"{key}.status", fact["status"]))
            for pair, (first, margins) in fact["headline"].items():
                out += [(f"{key}.{pair}.first_divergence", first), (f"{key}.{pair}.margins_at_divergence", margins)]
        elif name == audit_property:
            audit = json.loads(value)
            out.append((f"replaytests.audit.{'.'.join(audit['key'])}", f"{audit['changes']} of {audit['leaves']} "
                                                                     "leaves changed"))
        else:
            out.append((name, value))
    return out
