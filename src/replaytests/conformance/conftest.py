"""Without the replaytests plugin (`pytest -p no:replaytests --pyargs replaytests.conformance`) no
family can run: its options and fixtures come from the plugin. Say so in one line (exit 4) instead of
one "fixture not found" error per test."""

from __future__ import annotations

import pytest

from replaytests.families.registry import MARKERS

PLUGIN = "replaytests"
MODULE = "replaytests.suite.plugin"  # the name the plugin has when loaded with -p (where it is not installed)


def _loaded(config: pytest.Config) -> bool:
    return any(config.pluginmanager.has_plugin(name) for name in (PLUGIN, MODULE))


def pytest_configure(config: pytest.Config) -> None:
    if not _loaded(config):  # else each family's mark warns as unknown
        for name, text in MARKERS.items():
            config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config) -> None:
    if not _loaded(config):
        raise pytest.UsageError(
            f"replaytests.conformance: the {PLUGIN} pytest plugin is disabled (-p no:{PLUGIN}), and every family "
            f"needs its options and fixtures; drop -p no:{PLUGIN}, or check that replaytests is installed in this "
            "environment (pip show replaytests)")
