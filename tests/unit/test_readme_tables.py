"""README's tables are tools/readme_tables.py's output over the committed ledgers, line for line: a
number in README that no committed ledger gives fails here."""

from __future__ import annotations

import importlib.util

import pytest

from replaytests.inputs.options import REPO

SPEC = importlib.util.spec_from_file_location("readme_tables", REPO / "tools" / "readme_tables.py")
TABLES = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(TABLES)


@pytest.mark.parametrize("name", list(TABLES.TABLES))
def test_readme_shows_the_table_the_committed_ledgers_give(name):
    table = TABLES.TABLES[name]()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert table in readme, f"README's {name} table differs from `python tools/readme_tables.py`:\n{table}"
