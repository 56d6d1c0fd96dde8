"""Experiment families (SPEC §7): each turns rows of a bank into ledger records.

Every family module names FAMILY, its ARMS, the arm PAIRS it compares, HEADLINE (the pairs its
divergence counts read), REPLICAS (its replica pairs) and `run(runtime, row) -> record` (transplant's
run also takes the row's crossing record and its panel role; the session dispatches it).
"""

from replaytests.families import batch, bridge, crossing, live, replication, transplant

FAMILIES = {module.FAMILY: module for module in (crossing, live, bridge, batch, transplant, replication)}
