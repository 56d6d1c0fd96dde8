"""Meta-test: every key of the contract schema has a reader.

A key is read when (1) validation is its reader: it admits one value only, the one the engine does;
(2) drift compares it: the captured environment holds the same path; or (3) a named function reads
it: its source spells the key. A new key with none of these fails here, and so does a gate that the
typed Gates object carries but no judging method uses.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest
from test_contract import schema_paths

from replaytests.engine import environment
from replaytests.engine.hf import adapter, forward, inspection, runtime, weights
from replaytests.engine.hf import sweep as hf_sweep
from replaytests.engine.llamacpp import runtime as llamacpp_runtime
from replaytests.engine.protocol import Delimiters
from replaytests.engine.vllm import runtime as vllm_runtime
from replaytests.engine.vllm import sweep as vllm_sweep
from replaytests.families import conversation, rollout, sweep
from replaytests.families.registry import FAMILIES
from replaytests.inputs import contract, gates
from replaytests.inputs.blocks import Caps
from replaytests.inputs.cells import PAPER
from replaytests.inputs.contract import SCHEMA
from replaytests.inputs.schema import Value
from replaytests.outputs import replication_outcome
from replaytests.suite import artifacts, planner, session

# A panel size the planner reads through the family registry: some family declares its path (Family.panel_size).
PANEL_SIZE = object()
# A control's gate, read through the family registry: some family judged by that section declares the key its control's
# (Family.control), which Gates.from_settings reads for each family's control.
CONTROL_GATE = object()
# path (as schema_paths spells it) -> the function that reads it (its source must name the key's last part).
READERS = {
    "name": contract.load_contract,
    "extends": contract._resolve,
    "description": artifacts.run_metadata,
    "environment.attention": forward.load_cell,
    "environment.cache": runtime.Runtime.load,
    "protocol.visibility": runtime.Runtime.load,
    "environment.cpu_isa": session.ReplaySession.open,
    "precisions": contract.load_contract,
    "precisions.<precision>.dtype": forward.load_cell,
    "cells": contract.load_contract,
    "cells.<cell>.dtype": forward.load_cell,
    "cell_pairs": artifacts.run_metadata,
    **{f"{cells}.kv_cache.{key}": adapter.new_cache for cells in ("precisions.<precision>", "cells.<cell>")
       for key in ("format", "library", "bits", "group_size", "residual_length")},
    **{f"{cells}.weights.{key}": reader for cells in ("precisions.<precision>", "cells.<cell>")
       for key, reader in (("format", weights._config), ("library", runtime.Runtime.cell_problem),
                           ("group_size", weights._config))},
    "decoding.physical_batch": runtime.Runtime.load,
    "caps.branch": Caps.of,
    "caps.merge": Caps.of,
    "caps.answer": Caps.of,
    "delimiters": Delimiters.resolve,
    "banned_tokens": inspection.inspect,
    "boundary_checks": contract._check_together,
    "panels.live": PANEL_SIZE,
    "panels.bridge": PANEL_SIZE,
    "panels.transplant.divergent": session.ReplaySession.panel,
    "panels.transplant.exact_controls": session.ReplaySession.panel,
    "panels.conversation_transplant.divergent": session.ReplaySession.panel,
    "panels.conversation_transplant.exact_controls": session.ReplaySession.panel,
    "panels.replication.rows": PANEL_SIZE,
    "panels.replication.min_exact_controls": replication_outcome.min_exact_controls,
    "gates.audit.reproduce": gates.Gates.from_settings,
    **{f"gates.{section}.replicas_exact": gates.Gates.replicas_exact.func
       for section in ("crossing", "live", "serving", "rollout", "conversation", "sweep")},
    **{f"gates.{section}.suffix_divergence_allowed": gates.Gates.suffix_divergence_allowed.func
       for section in ("crossing", "live", "batch", "serving", "sweep")},
    # a family's own gate keys, read by key (Gates.setting) where it is judged
    "gates.transplant.donor_recovery": gates.Gates.transplant_family,
    "gates.transplant.controls_third_trajectory": gates.Gates.transplant_family,
    "gates.rollout.k3_max": gates.Gates.rollout_recompute,
    "gates.rollout.outside_bounds_max": gates.Gates.rollout_recompute,
    "gates.conversation.control_exact": gates.Gates.conversation_control,
    "gates.conversation.rerendered_ids_equal": gates.Gates.conversation_rerendered,
    "gates.bridge.exact": CONTROL_GATE,
    "gates.rollout.live_incremental_exact": CONTROL_GATE,
    "panels.sweep": PANEL_SIZE,
    "sweep.multiples": sweep.points,
    "sweep.stride": hf_sweep.axes,
    "sweep.continuation": sweep.run,
    "sweep.batch_sizes": vllm_sweep.axes,
    "sweep.seed": vllm_sweep._others,
    "sweep.axes": sweep.run,
    "panels.conversation": PANEL_SIZE,
    "conversation.cap": conversation.run,
    "panels.rollout": PANEL_SIZE,
    **{f"rollout.{key}": rollout.settings for key in ("length", "seed", "ratio_bounds", "delta_threshold")},
    "runtime.vllm.version": vllm_runtime.Runtime._check_pins,
    "runtime.vllm.attention_backend": vllm_runtime.Runtime._check_pins,
    "runtime.vllm.block_size": vllm_runtime.Runtime.load,
    "runtime.vllm.enforce_eager": vllm_runtime.Runtime._engine,
    "runtime.vllm.prefix_caching": vllm_runtime.Runtime._engine,
    "runtime.vllm.max_num_seqs": vllm_runtime.Runtime._engine,
    "runtime.vllm.logprobs": vllm_runtime.Runtime._engine,
    "runtime.vllm.chunk_budget": vllm_runtime.Runtime.chunked_engine.fget,
    "runtime.vllm.kv_cache_gib": vllm_runtime.environment,
    "runtime.llamacpp.version": llamacpp_runtime.Runtime.load,
    "runtime.llamacpp.n_ctx": llamacpp_runtime.Runtime._context,
    "runtime.llamacpp.chunk": llamacpp_runtime.Runtime.build,
    "runtime.llamacpp.flash_attention": llamacpp_runtime.Runtime._context,
}


def _node(path: str):
    node = SCHEMA
    for key in path.replace(".<precision>", "").replace(".<cell>", "").split("."):
        node = node.keys[key] if hasattr(node, "keys") else node.value.keys[key]
    return node


def _locked(path: str) -> bool:
    """Validation is the reader: the key admits a single value (what the engine does)."""
    node = _node(path)
    return isinstance(node, Value) and len(node.choices) == 1


@pytest.fixture(scope="module")
def captured(opened_session) -> set[str]:
    """The dotted paths of the environment a run captures (with its inputs), which drift compares."""
    env = opened_session().environment
    return {path for path, _ in environment._leaves(env, "")}


@pytest.mark.parametrize("path", [pytest.param(p, id=p) for p in schema_paths(SCHEMA)])
def test_every_contract_key_has_a_reader(path, captured):
    # a cell's numeric flags are read back and captured as the paper's cells' are (environment.precisions)
    paper = path.replace("cells.<cell>", "precisions.<precision>")
    concrete = [paper.replace("<precision>", p) for p in PAPER] if "<precision>" in paper else [path]
    if _locked(path) or all(p in captured for p in concrete):
        return
    reader = READERS.get(path)
    if reader is PANEL_SIZE:
        declared = {f.panel_size for f in FAMILIES.values()}
        assert tuple(path.split(".")[1:]) in declared, f"contract key {path!r}: no family declares it its panel_size"
        assert spelled_in_code(planner.Plan.panel_size, "panel_size"), "Plan.panel_size reads no family's panel_size"
        return
    if reader is CONTROL_GATE:
        _, section, key = path.split(".")
        declared = {(f.gate_section, f.control.gate) for f in FAMILIES.values() if f.control}
        assert (section, key) in declared, f"contract key {path!r}: no family judged by {section!r} declares it its " \
                                           "control's gate"
        assert spelled_in_code(gates.Gates.from_settings, "controls"), "Gates.from_settings reads no family's control"
        return
    assert reader is not None, f"contract key {path!r} has no reader: validation admits more than one value, drift " \
                               f"does not compare it and READERS names no function that reads it"
    word = path.rpartition(".")[2]
    assert spelled_in_code(reader, word), (
        f"contract key {path!r}: its reader {reader.__qualname__} never names {word!r} in its code")


def spelled_in_code(function, word: str) -> bool:
    """Whether `function`'s code (not its docstring, not a comment) names `word`: as an identifier, an
    attribute, an argument or keyword, or a whole word of a string constant (a key such as "branch")."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    pattern = re.compile(rf"\b{re.escape(word)}\b")
    for node in (n for statement in body for n in ast.walk(statement)):
        found = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                 else node.arg if isinstance(node, ast.arg | ast.keyword) else
                 node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if found and pattern.search(found):
            return True
    return False


def _named_in_a_comment_only(settings):
    """Reads branch."""
    # branch
    return settings["merge"]


def _named_in_code(settings):
    return settings["caps"]["branch"], settings.branch


@pytest.mark.parametrize(("function", "named"), [
    pytest.param(_named_in_a_comment_only, False, id="comment-and-docstring-only"),
    pytest.param(_named_in_code, True, id="key-and-attribute"),
])
def test_a_key_named_only_in_a_comment_has_no_reader(function, named):
    assert spelled_in_code(function, "branch") == named


@pytest.mark.parametrize("field", [pytest.param(f, id=f) for f in gates.Gates.__dataclass_fields__])
def test_every_gate_is_judged(field):
    judges = [name for name, method in inspect.getmembers(gates.Gates, inspect.isfunction)
              if not name.startswith("__") and f"self.{field}" in inspect.getsource(method)]
    assert judges, f"Gates.{field} is read from the contract but no judging method of Gates uses it"
