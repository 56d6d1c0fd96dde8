"""Experiment families (SPEC §7): each turns rows of a bank into ledger records.

Every family module names FAMILY, its ARMS, the arm PAIRS it compares, HEADLINE (the pairs its
divergence counts read), REPLICAS (its replica pairs) and `run(runtime, row) -> record`.
"""

from replaytests.families import batch, bridge, crossing, live

FAMILIES = {module.FAMILY: module for module in (crossing, live, bridge, batch)}
