"""Experiment families: each turns rows of a bank into ledger records.

`registry` holds every fact about a family (arms, pairs, headline, rows, layers, report shape) and
loads no engine; each family module holds its `run(runtime, row) -> record` (the transplant's also
takes the row's crossing record and its panel role; the session dispatches it). `skeleton` is what
they share, `panels` how rows are chosen without reading outcomes.
"""
