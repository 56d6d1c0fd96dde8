"""The conformance suite: one test module per fidelity layer (docs/protocol.md §6).

Run with `pytest --pyargs replaytests.conformance [--model ... --bank ... --contract ...]`
(or `replaytests audit`). Parameters come from the plugin (suite.parameters): `cell`
and `causal_cell` (the selected cells), one row fixture per family (suite.planner.ROW_FIXTURES: `bank_row`,
`live_row`, `panel_row`, ...), the replica layer's (`replica_family`, `replica_row`, `replica_pair`: every
family that names the layer), `transplant_family`, and the baseline records a run audits.
"""
