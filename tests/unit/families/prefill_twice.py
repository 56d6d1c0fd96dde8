"""A family the suite has never seen, to prove the family seam (replaytests.families.registry): the bank's prefix
built by one prefill call, twice, each continued greedily; the two must agree bit for bit.

It is added the way a new family is from outside the package: this module (its `Family` and its `run`), and one
registry line, the entry point beside it (replaytests_new_family-0.dist-info/entry_points.txt), seen where this
folder is on the path. It names the replica layer only, whose one test judges every family's replica pairs from the
registry; tests/unit/test_backend.py runs it beside the fourth backend and proves that no other file names it. It owns a
contract section, `gates.prefill_twice` (whether its replicas must be bit-exact), which the contract accepts where its
entry point is seen and nowhere else.
"""

from __future__ import annotations

from replaytests.families.registry import Family
from replaytests.inputs.schema import Section, Value

FAMILY = Family("prefill_twice", ("prefill", "prefill_replica"), (("prefill", "prefill_replica"),), (), "all",
                ("replica",), headline_table=False, title="Prefill twice: one call over the prefix, made twice",
                module=__name__, gates_schema=Section({"replicas_exact": Value(bool, default=True)}, default={}))


def run(runtime, row):
    from replaytests.families.skeleton import evaluate

    return evaluate(runtime, row, FAMILY, lambda: [runtime.build("prefill", row.tokens) for _ in FAMILY.arms])
