"""The conformance suite: one test module per fidelity layer (docs/protocol.md §6).

Run with `pytest --pyargs replaytests.conformance [--model ... --bank ... --contract ...]`
(or `replaytests audit`). Parameters come from the plugin: `precision`, `bank_row`, `bridge_row`.
"""
