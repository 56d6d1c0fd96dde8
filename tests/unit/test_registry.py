"""Meta-tests of the family registry: every registered family has conformance tests in the fidelity
layers it names (and no layer reads a family that does not name it), and every registry fact is
consistent with itself."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from replaytests.errors import ConfigError
from replaytests.families import registry
from replaytests.families.registry import FAMILIES
from replaytests.inputs.contract import default_gates
from replaytests.inputs.schema import Section, Value

SRC = Path(__file__).resolve().parents[2] / "src" / "replaytests"
CONFORMANCE = SRC / "conformance"
LAYER_MODULES = {"replica": "test_replica_stability.py", "token_identity": "test_token_identity.py",
                 "fidelity": "test_live_state_fidelity.py", "causal": "test_causal_sufficiency.py"}


def families_read(layer: str) -> set[str]:
    """The families a layer's conformance module reads records of: record("<family>", ...)."""
    return set(re.findall(r'record\(\s*"(\w+)"', (CONFORMANCE / LAYER_MODULES[layer]).read_text()))


@pytest.mark.parametrize(("family", "layer"), [pytest.param(f.name, layer, id=f"{f.name}-{layer}")
                                               for f in FAMILIES.values() for layer in f.layers])
def test_each_family_has_tests_in_its_layers(family, layer):
    if layer == "replica":  # one test judges every family that names the layer, from the registry alone
        spec = FAMILIES[family]
        assert spec.replicas, f"{family} names the replica layer and has no replica pair (X~X_replica) to judge"
        assert not spec.divergent_cells_only, f"{family}: the replica layer runs on every selected cell"
        assert "test_replica_exact(" in (CONFORMANCE / LAYER_MODULES[layer]).read_text(), "the replica test is gone"
        return
    assert family in families_read(layer), f"{LAYER_MODULES[layer]} reads no {family} record"


@pytest.mark.parametrize("layer", sorted(LAYER_MODULES))
def test_a_layer_reads_only_the_families_that_name_it(layer):
    strays = {f for f in families_read(layer) if f not in FAMILIES or layer not in FAMILIES[f].layers}
    assert not strays, f"{LAYER_MODULES[layer]} reads {sorted(strays)}, whose registry records do not name {layer}"


@pytest.mark.parametrize("family", [pytest.param(f, id=f.name) for f in FAMILIES.values()])
def test_pairs_headline_and_replicas_name_the_family_arms(family):
    arms = set(family.arms)
    assert {a for pair in family.pairs for a in pair} <= arms, f"{family.name}: a pair names an arm it lacks"
    pairs = {f"{a}~{b}" for a, b in family.pairs}
    assert set(family.headline) <= pairs and set(family.replicas) <= pairs, f"{family.name}: headline {family.headline}"
    assert set(family.layers) <= set(LAYER_MODULES), f"{family.name}: unknown layers {family.layers}"


def _comparison(exact: bool) -> SimpleNamespace:
    sizes = dict.fromkeys(("k_rel_l2", "k_max_abs", "v_rel_l2", "v_max_abs", "logits_max_abs"), 0.5)
    return SimpleNamespace(cache_exact=exact, logits_exact=exact, suffix_equal=exact, steps_exact=None,
                           logprobs_exact=None, first_divergence=3, margins_at_divergence=(0.1, None), **sizes)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "differs"])
def test_the_replica_layer_requires_a_family_the_gates_do_not_name_bit_exact(exact):
    """A family known only to the registry (a plugin's) is judged by the replica layer as every other: bit-exact
    unless its gates say otherwise; nothing in the contract has to name it first."""
    record = SimpleNamespace(family="unnamed", title="unnamed row r (fp32)", turns=None, sweep=None,
                             comparisons={"a~a_replica": _comparison(exact)})
    judged = default_gates().replicas_at_every_step(record, "a~a_replica")
    assert judged.outcome == ("pass" if exact else "fail"), judged
    assert exact or "a~a_replica caches differ" in judged.message, judged


# Plugins' families whose contract sections a built-in's contradict, or that no family declares (below).
_PAIRS = (("a", "a_replica"),)
CLASHING_PANEL = registry.Family("clash", ("a", "a_replica"), _PAIRS, (), "bridge", ("replica",),
                                 panel_schema=Value(int, default=3))
CLASHING_GATES = registry.Family("clash", ("a", "a_replica"), _PAIRS, (), "all", ("replica",), gates="rollout",
                                 gates_schema=Section({"replicas_exact": Value(bool, default=False)}, default={}))
BARE_SETTINGS = registry.Family("bare", ("a", "a_replica"), _PAIRS, (), "all", ("replica",), settings="nowhere")
NO_SECTION = registry.Family("lost", ("a", "a_replica"), _PAIRS, (), "all", ("replica",),
                             report_section="replaytests.outputs.no_such_section", outcome="no_such_package.outcome")


@pytest.mark.parametrize(("name", "value", "message"), [
    pytest.param("odd", "replaytests.families.registry:CROSS",
                 r"expected a replaytests.families.registry.Family named 'odd', got 'incremental~prefill'",
                 id="not-a-family"),
    pytest.param("other", "replaytests.families.registry:BUILT_IN", r"expected .* named 'other', got \{", id="a-dict"),
    pytest.param("crossing", "m:F", r"family crossing is registered already", id="a-built-in-name"),
    pytest.param("gone", "no_such_module:FAMILY", r"cannot import it: No module named 'no_such_module'", id="missing"),
    pytest.param("clash", "test_registry:CLASHING_PANEL", r"family clash: its panel_schema for the contract's panels "
                 r"section 'bridge' differs from another family's", id="a-panel-another-family-declares-otherwise"),
    pytest.param("clash", "test_registry:CLASHING_GATES", r"family clash: its gates_schema for the contract's gates "
                 r"section 'rollout' differs", id="gates-another-family-declares-otherwise"),
    pytest.param("bare", "test_registry:BARE_SETTINGS", r"family bare: its settings section 'nowhere' is declared by "
                 r"no family", id="settings-no-family-declares"),
    pytest.param("lost", "test_registry:NO_SECTION", r"its outcome 'no_such_package.outcome' names no module that can "
                 r"be imported; its report_section 'replaytests.outputs.no_such_section' names no module",
                 id="output-modules-missing"),
])
def test_a_family_entry_point_that_is_not_a_new_family_of_its_name_is_refused_in_one_line(monkeypatch, name, value,
                                                                                          message):
    point = metadata.EntryPoint(name, value, registry.ENTRY_POINTS)
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [point] if group == registry.ENTRY_POINTS
                        else [])
    found, problem = registry._plugins()
    assert found == {} and re.match(rf"^entry point {name} = {value} \(replaytests.families\): {message}", problem), (
        problem)
    assert "\n" not in problem, problem
    monkeypatch.setattr(registry, "_PROBLEM", problem)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        registry.check_plugins()


@pytest.mark.e2e  # child processes
@pytest.mark.parametrize("command", [["-m", "replaytests.cli", "env"],
                                     ["-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"]],
                         ids=["cli", "pytest"])
def test_a_bad_family_entry_point_stops_the_cli_and_pytest_in_one_line(tmp_path, command):
    """Where a bad entry point is installed, the CLI and any pytest run stop before anything runs, non-zero, with
    its one line (not a traceback of pytest's plugin loading); the control: the same folder without it runs."""
    info = tmp_path / "site" / "bad_family-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-family\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[replaytests.families]\nodd = json:dumps\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(info.parent), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "entry point odd = json:dumps" in line]
    assert proc.returncode != 0 and len(errors) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Error while loading plugin" not in proc.stdout + proc.stderr, (
        proc.stdout[-2000:] + proc.stderr[-2000:])
    (info / "entry_points.txt").unlink()
    control = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             check=False, timeout=300)
    assert "entry point" not in control.stdout + control.stderr and control.returncode in (0, 5), (
        control.stdout[-2000:] + control.stderr[-2000:])
# ---- where a built-in family is still named outside families/ (issue 50, item 2: a ratchet)

# How many string constants in each module's code (docstrings aside) spell a built-in family's name, outside
# families/. "live" and "batch" are left out (arm and capability words too); a constant imported from the registry
# (CROSS, CONVERSATION, SWEEP, ...) is not counted. A count may fall, never rise: lower it here when it does.
# What remains: the conformance tests (their names and the records they read: tests, user-visible ids); words a family
# shares with the engine (the boundary check `bridge`, the backend capability `conversation`, the function
# `transplant`) and the vLLM backend's check of the sweep settings it cannot take (engine/vllm/sweep.py: engine/ does
# not import the registry).
FAMILY_MENTIONS = {
    "conformance/test_causal_sufficiency.py": 12, "conformance/test_live_state_fidelity.py": 13,
    "conformance/test_token_identity.py": 2, "engine/backend.py": 1, "engine/checks.py": 6,
    "engine/hf/declaration.py": 1, "engine/llamacpp/declaration.py": 1, "engine/transplant.py": 1,
    "engine/vllm/declaration.py": 1, "engine/vllm/sweep.py": 1,
}


def family_mentions(path: Path) -> int:
    """The string constants of a module's code (not its docstrings) that spell a built-in family's name."""
    names = set(registry.BUILT_IN) - {"live", "batch"}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names
               and id(node) not in docstrings)


def test_no_module_names_a_built_in_family_more_often_than_it_did():
    found = {str(path.relative_to(SRC)): family_mentions(path) for path in sorted(SRC.rglob("*.py"))
             if not str(path.relative_to(SRC)).startswith("families/")}
    grown = {path: (count, FAMILY_MENTIONS.get(path, 0)) for path, count in found.items()
             if count > FAMILY_MENTIONS.get(path, 0)}
    assert not grown, f"modules name a built-in family more often than they did (now, listed): {grown}; read its " \
                      "facts from its registry record (families/registry.py) instead"
    fallen = {path: (found.get(path, 0), listed) for path, listed in FAMILY_MENTIONS.items()
              if found.get(path, 0) < listed}
    assert not fallen, f"lower FAMILY_MENTIONS where a module names the families less often (now, listed): {fallen}"


def test_the_family_counter_sees_a_name_in_code_and_not_in_a_docstring(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""The crossing."""\n# transplant\nX = "crossing"\nY = ("sweep", "live", "crossings")\n')
    assert family_mentions(module) == 2
