"""Replication on another checkpoint: the crossing and the transplant, outcome-blind.

With a new checkpoint and an existing bank, the panel is frozen from prefix lengths and row ids
alone, before any result exists. Six arms per row: incremental and prefill, a replica of each, and
the two all-layer transplants (prefill <- incremental, incremental <- prefill); plus the validity
control (each construction's cache in its replica must reproduce its own trajectory). A divergent
row is testable where the first suffix tokens agree; `outputs.replication_outcome` reads the records
("strong replication" needs at least the registered minimum of exact controls besides full donor
recovery and no third trajectory).
"""

from __future__ import annotations

from replaytests.engine.backend import Backend
from replaytests.families.registry import DIRECTIONS, FAMILIES, REPLICA_DIRECTIONS
from replaytests.families.skeleton import evaluate
from replaytests.families.transplant import check_valid, outcome
from replaytests.inputs.bank import BankRow
from replaytests.inputs.blocks import direction
from replaytests.outputs.records import Record, title

FAMILY = FAMILIES["replication"]
CROSSING_ARMS = FAMILIES["crossing"].arms


def run(runtime: Backend, row: BankRow) -> Record:
    def build():
        built = {}
        for arm in CROSSING_ARMS:
            built[arm] = runtime.build(arm, row.tokens)
            yield built[arm]
        for recipient, donor in (*DIRECTIONS, *REPLICA_DIRECTIONS):
            yield runtime.transplant(built[recipient], built[donor])

    def outcomes(fields: dict) -> dict:
        """The validity control (TransplantInvalid excludes the row), then each direction's outcome."""
        check_valid(fields["comparisons"], title(FAMILY.name, row.id, runtime.cell))
        suffix = {arm: values["suffix"] for arm, values in fields["arms"].items()}
        return fields | {"transplants": {direction(r, d): outcome(suffix[direction(r, d)], suffix[d], suffix[r])
                                         for r, d in DIRECTIONS}}

    return evaluate(runtime, row, FAMILY, build, outcomes)
