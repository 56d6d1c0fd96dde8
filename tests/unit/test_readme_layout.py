"""README's layout section matches the tree: every module of the package, every test folder and every tool
is named there, and every module it names exists (a renamed or removed file fails here)."""

from __future__ import annotations

import re

import pytest

from replaytests.inputs.options import REPO

PACKAGE = REPO / "src" / "replaytests"


def _layout() -> str:
    """The fenced tree under README's `## Layout`."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n", 2)[1]


def _named(layout: str) -> set[str]:
    return set(re.findall(r"[\w-]+\.(?:py|sh)\b", layout))


def _files() -> list[str]:
    modules = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" and "conformance" not in p.parts]  # named by folder, with its layers
    return modules + [f"{p.parent.name}/{p.name}" for p in (REPO / "tools").iterdir() if p.suffix in (".py", ".sh")]


@pytest.mark.parametrize("path", _files())
def test_every_module_and_tool_is_in_the_layout(path):
    assert path.rpartition("/")[2] in _named(_layout()), f"README's layout does not name {path}"


@pytest.mark.parametrize("folder", sorted(p.name for p in (REPO / "tests").iterdir() if p.is_dir()
                                          and not p.name.startswith((".", "_"))))
def test_every_test_folder_is_in_the_layout(folder):
    assert f"tests/{folder}/" in _layout(), f"README's layout does not name tests/{folder}/"


def test_every_module_the_layout_names_exists():
    existing = {p.name for folder in ("src", "tests", "tools", "benchmarks") for p in (REPO / folder).rglob("*")
                if p.suffix in (".py", ".sh")}
    missing = sorted(name for name in _named(_layout()) if name not in existing)
    assert not missing, f"README's layout names files the tree does not hold: {missing}"
