"""docs/architecture.md matches the tree: its generated parts are tools/architecture.py's output (every module of
the package with its docstring's first sentence, the capabilities, the import-linter contracts), every module file
is listed, and every path its prose names exists. A module added, removed or renamed without the document fails
here, and so does a renamed file the prose still names; the comparison is seen failing on a copy of the tree."""

from __future__ import annotations

import importlib.util
import re
import shutil

import pytest

from replaytests.inputs.options import REPO

SPEC = importlib.util.spec_from_file_location("architecture", REPO / "tools" / "architecture.py")
TOOL = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(TOOL)

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "src" / "replaytests"
FIX = "run `python tools/architecture.py --write` and commit docs/architecture.md"
# Paths "Adding a runtime" names that the runtime refactor adds. Once one exists, remove it from here.
# A path the prose names: folders with a file of these kinds (`engine/hf/runtime.py`, docs/vllm.md), or, in
# backticks, a folder (`engine/hf/`) or a bare module name (`forward.py`). `<name>` is a placeholder, not a path.
FILE = re.compile(r"(?<![\w./<>-])((?:[\w.<>-]+/)+[\w.<>-]+\.(?:py|sh|md|yaml|toml))\b")
FOLDER = re.compile(r"`((?:[\w.<>-]+/)+)`")
BARE = re.compile(r"`([\w-]+\.(?:py|sh|toml))`")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _problems(doc: str, name: str, made: str) -> str | None:
    """Why the document's part `name` is not `made` (the generator's output), or None."""
    documented = TOOL.documented(doc, name)
    if documented == made:
        return None
    found = TOOL.differences(documented, made) if name == "modules" else [f"the tree gives:\n{made}"]
    return f"docs/architecture.md's {name} part differs from the tree:\n" + "\n".join(found) + f"\n{FIX}"


@pytest.mark.parametrize("name", list(TOOL.PARTS))
def test_the_generated_part_is_the_trees(name):
    problem = _problems(_doc(), name, TOOL.PARTS[name]())
    assert problem is None, problem


def _line(module) -> str:
    """How the modules part lists a module file: its own line, or for an `__init__.py` its folder's heading."""
    relative = module.relative_to(PACKAGE)
    if module.name != "__init__.py":
        return f"- `{relative.as_posix()}`:"
    return "**the top level**:" if module.parent == PACKAGE else f"**`{relative.parent.as_posix()}/`**:"


def test_every_module_file_is_listed():
    """Independently of the generator: each module under src/replaytests/ has its line, each package its heading."""
    part = TOOL.documented(_doc(), "modules")
    unlisted = [p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
                if "__pycache__" not in p.parts and _line(p) not in part]
    assert not unlisted, f"docs/architecture.md does not list {unlisted}: {FIX}"


def _hand_written(doc: str) -> str:
    for name in TOOL.PARTS:
        doc = doc.replace(TOOL.documented(doc, name), "")
    return doc


def named_paths(text: str) -> set[str]:
    """Every path the text names (FILE, FOLDER, BARE), placeholders left out."""
    found = set(FILE.findall(text)) | set(FOLDER.findall(text)) | set(BARE.findall(text))
    return {path for path in found if "<" not in path}


def missing_paths(text: str) -> list[str]:
    """The paths `text` names that exist neither from the repository's root nor from src/replaytests/ (a bare
    module name: nowhere under src/, tests/ or tools/)."""
    here = {p.name for folder in ("src", "tests", "tools") for p in (REPO / folder).rglob("*")}
    return sorted(path for path in named_paths(text)
                  if not ((REPO / path).exists() or (PACKAGE / path).exists() or ("/" not in path and path in here)))


def test_every_path_the_prose_names_exists():
    missing = missing_paths(_hand_written(_doc()))
    assert not missing, f"docs/architecture.md names paths the tree does not hold: {missing}"


# ---- the checks seen failing, on a copy of the tree -------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    """A copy of src/replaytests/'s modules, and the document as the real tree generates it."""
    copy = tmp_path / "replaytests"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors"))
    return copy, TOOL.rewrite(_doc(), {"modules": TOOL.render_modules(TOOL.packages(PACKAGE))})


def _found(copy, doc) -> str | None:
    return _problems(doc, "modules", TOOL.render_modules(TOOL.packages(copy)))


def test_the_copy_matches_before_any_change(tree):
    assert _found(*tree) is None


def test_a_module_added_without_the_document_fails(tree):
    copy, doc = tree
    (copy / "engine" / "added.py").write_text('"""The environment a run executes in."""\n', encoding="utf-8")
    problem = _found(copy, doc)
    assert problem is not None and "missing from the document: engine/added.py" in problem, problem
    assert FIX in problem, problem


def test_a_package_added_without_the_document_fails(tree):
    copy, doc = tree
    (copy / "engine" / "sglang").mkdir()
    (copy / "engine" / "sglang" / "__init__.py").write_text('"""SGLang."""\n', encoding="utf-8")
    (copy / "engine" / "sglang" / "runtime.py").write_text('"""SGLang as the runtime under test."""\n')
    problem = _found(copy, doc)
    assert problem is not None and "missing from the document: engine/sglang/" in problem, problem
    assert "missing from the document: engine/sglang/runtime.py" in problem, problem


def test_a_module_removed_or_renamed_without_the_document_fails(tree):
    copy, doc = tree
    (copy / "engine" / "stop.py").rename(copy / "engine" / "halt.py")
    problem = _found(copy, doc)
    assert problem is not None, "a renamed module passed"
    assert "missing from the document: engine/halt.py" in problem, problem
    assert "in the document but not the tree: engine/stop.py" in problem, problem


def test_a_changed_docstring_fails(tree):
    copy, doc = tree
    (copy / "files.py").write_text('"""File helpers, changed."""\n', encoding="utf-8")
    problem = _found(copy, doc)
    assert problem is not None and "changed: files.py: " in problem and "File helpers, changed." in problem, problem


def test_a_path_the_prose_names_that_is_gone_fails():
    text = ("`engine/hf/runtime.py` and docs/vllm.md, `engine/hf/`, `forward.py`; `engine/<name>/runtime.py`; "
            "`engine/hf/transplant.py`, docs/sglang.md, `engine/sglang/`, `transplants.py`")
    assert missing_paths(text) == ["docs/sglang.md", "engine/hf/transplant.py", "engine/sglang/", "transplants.py"]


def test_rewrite_replaces_only_between_the_markers():
    start, end = TOOL._markers("modules")
    doc = f"before\n{start}\nold\n{end}\nafter\n"
    assert TOOL.rewrite(doc, {"modules": "new"}) == f"before\n{start}\nnew\n{end}\nafter\n"
    with pytest.raises(ValueError, match="lacks the markers"):
        TOOL.documented("no markers", "modules")


@pytest.mark.parametrize(("docstring", "sentence"), [
    pytest.param("One sentence.", "One sentence.", id="one"),
    pytest.param("First. Second.", "First.", id="two"),
    pytest.param("First line\ngoes on. Second.", "First line goes on.", id="wrapped"),
    pytest.param("Audit (docs/protocol.md §7.4): re-run. More.", "Audit (docs/protocol.md §7.4): re-run.",
                 id="dot-in-a-path"),
    pytest.param("Set (e.g. one. two) here. More.", "Set (e.g. one. two) here.", id="inside-parentheses"),
    pytest.param("Run `a. b` now. More.", "Run `a. b` now.", id="inside-backticks"),
    pytest.param("Pick one, e.g. this one. More.", "Pick one, e.g. this one.", id="abbreviation"),
    pytest.param("A list follows:\n\n- one", "A list follows.", id="introducing-a-list"),
    pytest.param("No full stop\n\nSecond paragraph.", "No full stop", id="no-full-stop"),
    pytest.param(None, TOOL.NO_DOCSTRING, id="none"),
])
def test_first_sentence(docstring, sentence):
    assert TOOL.first_sentence(docstring) == sentence
