"""A runtime is one package (or module) plus one registry line (replaytests.backends).

What each backend declares is read by name through the registry: the contract's `runtime.<name>` schema, the
cells' formats, the platform's fields, the report's runtime line. A fourth backend (tests/unit/backends/
logprobs_only.py, registered by the entry point beside it) gets all of them from its module and that line alone,
and no other file of the suite names it. The built-in backends are named outside their packages only where a
line of EXEMPT says why (a ratchet: a new mention fails).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from replaytests import backends
from replaytests.backends import REGISTRY, Declaration, declarations
from replaytests.engine.backend import CAPABILITIES
from replaytests.inputs.cells import Cell, KVCache, Weights
from replaytests.inputs.platforms import BASE, platform_differences, platform_of

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "replaytests"
TEST_BACKENDS = Path(__file__).parent / "backends"
FOURTH = "logprobs-only"
FOURTH_SPELLINGS = ("logprobs-only", "logprobs_only", "LogprobsOnly")

# Files of the package that still name a built-in backend in their code (docstrings and comments aside), and why.
EXEMPT = {
    "backends.py": "the registry",
    "cli.py": "`models gguf --type` converts through llama.cpp's converter; help names the GGUF a llamacpp run takes",
    "inputs/options.py": "the committed baselines: each bank, contract and ledger with the backend that made it",
    "inputs/rollout_formats.py": "vLLM's server response is a rollout dump format users bring, not a backend",
    "rollouts/check.py": "`rollouts check` recomputes with the Hugging Face model (the trainer's forward)",
    "selftest/command.py": "the selftest injects faults into K/V tensors and forward calls: the Hugging Face backend",
    "selftest/faults.py": "the faults wrap the Hugging Face forward step",
}
BUILT_IN_WORDS = ("vllm", "llamacpp", "llama_cpp", "hf")


def _package(name: str) -> str:
    """The package (as a path under src/replaytests) a registered backend's declaration lives in."""
    module = REGISTRY[name].partition(":")[0]
    return "/".join(module.split(".")[1:-1])


def _named_in_code(path: Path, words: tuple[str, ...], root: Path = SRC) -> list[str]:
    """Where the module's code (not its docstrings, not its comments) names one of `words`: an import, an
    identifier, an attribute, or a string constant holding it as a word or dotted part."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [getattr(node, "module", None) or "", *(alias.name for alias in node.names)]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value]
        else:
            continue
        parts = {part for name in names for part in name.replace("/", ".").replace(" ", ".").split(".")}
        found += [f"{path.relative_to(root)}:{node.lineno}: {word}" for word in words if word in parts]
    return found


def test_no_module_names_a_built_in_backend_outside_its_package_the_registry_or_an_exemption():
    packages = {_package(name) for name in REGISTRY}
    found = [hit for path in sorted(SRC.rglob("*.py"))
             if not any(str(path.relative_to(SRC)).startswith(f"{package}/") for package in packages)
             and str(path.relative_to(SRC)) not in EXEMPT
             for hit in _named_in_code(path, BUILT_IN_WORDS)]
    assert not found, "a backend named outside its package (read it from its Declaration, through " \
                      "replaytests.backends, or say why in EXEMPT):\n" + "\n".join(found)


def test_every_exemption_is_still_needed():
    stale = [path for path in EXEMPT if path != "backends.py" and not _named_in_code(SRC / path, BUILT_IN_WORDS)]
    assert not stale, f"EXEMPT lists files that no longer name a backend: {stale}"


def test_the_finder_sees_a_backend_named_in_code_and_not_in_a_docstring(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""About vllm."""\n# llamacpp\nfrom replaytests.engine.vllm import runtime\n'
                      'X = "runtime.llamacpp"\n')
    hits = _named_in_code(module, BUILT_IN_WORDS, tmp_path)
    assert hits == ["m.py:3: vllm", "m.py:4: llamacpp"], hits


def test_the_lint_contract_keeps_every_built_in_package_out_of_the_inputs_and_outputs():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    wanted = {f"replaytests.{_package(name).replace('/', '.')}" for name in REGISTRY}
    kept = [c for c in contracts if {"replaytests.inputs", "replaytests.outputs"} <= set(c.get("source_modules", ()))
            and wanted <= set(c.get("forbidden_modules", ()))]
    assert kept, f"no import-linter contract forbids {sorted(wanted)} to replaytests.inputs and replaytests.outputs"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_built_in_declares_known_capabilities_formats_and_a_settings_schema(name):
    declared = declarations()[name]
    assert declared.capabilities and declared.capabilities <= CAPABILITIES.keys(), sorted(declared.capabilities)
    owners = [other for other, d in declarations().items() if other != name
              and set(d.kv_formats) & set(declared.kv_formats)]
    assert not owners, f"{name} and {owners} declare the same K/V format: a cell's format names one runtime"
    assert issubclass(backends.runtime_class(declared), declared), f"{name}'s runtime is not its declaration's class"


def test_a_cell_in_another_backends_format_is_refused_naming_whose_it_is():
    cell = Cell("float32", kv_cache=KVCache("q8_0"), weights=Weights())
    problem = declarations()["hf"].cell_problem(cell)
    assert problem is not None and problem.field == "kv_cache.format", problem
    assert problem.message == "q8_0 is a K/V cache format of llama.cpp; backend hf runs native, quantized", problem
    assert declarations()["llamacpp"].cell_problem(cell) is None, "llama.cpp refused its own q8_0 cache"


def _env(**software) -> dict:
    return {"hardware": {"device_kind": "cpu", "cpu": "c"}, "environment": {"device": "cpu", "cpu_isa": "AVX2",
                                                                            "cpu_threads": 1},
            "software": {"torch": "2", **software}, "runtime": {}}


def test_a_platform_holds_every_runs_fields_and_its_own_backends():
    env = _env(transformers="5", llama_cpp="0.3")
    env["runtime"]["llamacpp"] = {"n_ctx": 1024}
    hf, llamacpp = platform_of(env, declarations()["hf"]), platform_of(env, declarations()["llamacpp"])
    assert set(hf) == {*BASE["cpu"], "software.transformers"}, sorted(hf)
    assert set(llamacpp) == {*BASE["cpu"], "software.llama_cpp", "runtime.llamacpp"}, sorted(llamacpp)


def test_a_retired_field_of_an_older_baseline_is_not_compared_and_any_other_is():
    here = platform_of(_env(llama_cpp="0.3"), declarations()["llamacpp"])
    older = {**here, "software.transformers": "5.3.0"}
    retired = declarations()["llamacpp"].retired_platform
    assert platform_differences(older, here, "baseline", retired_fields=retired) == []
    assert platform_differences(older, here, "baseline") == ["software.transformers 5.3.0 (baseline) vs null (here)"]
    changed = {**older, "software.llama_cpp": "0.2"}
    assert platform_differences(changed, here, "baseline", retired_fields=retired) == [
        "software.llama_cpp 0.2 (baseline) vs 0.3 (here)"]


def test_a_declaration_that_names_itself_otherwise_is_refused(monkeypatch):
    class Misnamed(Declaration):
        name = "other"

    monkeypatch.setitem(sys.modules, "misnamed_backend", type(sys)("misnamed_backend"))
    sys.modules["misnamed_backend"].Misnamed = Misnamed
    monkeypatch.setitem(REGISTRY, "misnamed", "misnamed_backend:Misnamed")
    declarations.cache_clear()
    try:
        with pytest.raises(backends.ConfigError,
                           match=r"^backend misnamed: its Declaration .*Misnamed names itself 'other'$"):
            declarations()
    finally:
        monkeypatch.undo()
        declarations.cache_clear()


# ---- the fourth backend: its module and its entry point, nothing else


# Each plugin of the tests: the words that name it, and the files that may (its module, its entry point, its tests)
PLUGINS = {
    "the fourth backend": (FOURTH_SPELLINGS, {"tests/unit/backends/logprobs_only.py", "tests/unit/backends/"
                                              "replaytests_fourth_backend-0.dist-info/entry_points.txt",
                                              "tests/unit/test_backend.py", "tests/unit/test_backend_registry.py"}),
    "the new family": (("prefill_twice", "prefill-twice", "PrefillTwice"), {
        "tests/unit/families/prefill_twice.py", "tests/unit/families/replaytests_new_family-0.dist-info/"
        "entry_points.txt", "tests/unit/test_backend.py", "tests/unit/test_backend_registry.py"}),
}


def _names(path: Path, spellings: tuple[str, ...]) -> bool:
    """Whether the file spells one of `spellings`, read once and searched as bytes (the spellings are ASCII): the
    committed ledgers' 100 MB are not decoded."""
    data = path.read_bytes()
    return any(word.encode("ascii") in data for word in spellings)


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_no_other_file_names_a_plugin(plugin):
    spellings, own = PLUGINS[plugin]
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    naming = sorted(path for path in listed if not path.startswith("docs/") and path != "README.md"
                    and (REPO / path).is_file() and path not in own and _names(REPO / path, spellings))
    assert not naming, f"files besides its module, its registry line and its tests name {plugin}: {naming}"


def _child(*args: str) -> subprocess.CompletedProcess:
    """`replaytests ...` in a child process that sees the fourth backend's entry point."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(TEST_BACKENDS), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "replaytests.cli", *args], capture_output=True, text=True,
                          env=env, check=False, timeout=300)


def _contract(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "contract.yaml"
    path.write_text(f"schema: replaytests.contract/1\nname: fourth\nextends: {REPO / 'contracts' / 'cpu-tiny.yaml'}\n"
                    f"{body}")
    return path


@pytest.mark.e2e  # child processes
def test_the_fourth_backends_settings_are_read_from_the_contract_and_recorded_in_its_platform(tmp_path):
    proc = _child("env", "--backend", FOURTH, "--contract", str(_contract(tmp_path, f"runtime:\n  {FOURTH}:\n"
                                                                                     "    top_k: 3\n")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.split()[:1] == [f"runtime.{FOURTH}.top_k"] and line.split()[-1] == "3"
               for line in proc.stdout.splitlines()), proc.stdout[-2000:]


@pytest.mark.e2e
def test_the_fourth_backends_settings_are_validated_by_its_declared_schema(tmp_path):
    proc = _child("env", "--backend", FOURTH, "--contract", str(_contract(tmp_path, f"runtime:\n  {FOURTH}:\n"
                                                                                     "    top_k: 0\n")))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert f"runtime.{FOURTH}.top_k: expected" in lines[0], lines[0]


@pytest.mark.e2e
def test_without_its_registry_line_the_fourth_backends_section_is_unknown(tmp_path):
    """The control: where its entry point is not seen, the contract has no such section."""
    contract = _contract(tmp_path, f"runtime:\n  {FOURTH}:\n    top_k: 3\n")
    proc = subprocess.run([sys.executable, "-m", "replaytests.cli", "env", "--contract", str(contract)],
                          capture_output=True, text=True, check=False, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and f"unknown field '{FOURTH}'" in lines[0], proc.stderr[-2000:]
