"""The family registry: every fact about an experiment family, in one record per family (no torch).

The suite plans rows, panels and worker groups from it and dispatches `run` through it; the outputs
(report shapes, summary, compare) and the conformance tests read it. A family module holds only its
`run` (and what it alone needs); adding a family is one new module plus one entry here, or, outside the
package, one module whose `Family` an entry point of the group `replaytests.families` names (its `module` says
where its `run` is). A meta-test checks that every registered family has conformance tests in the layers it
names; the replica layer judges every family's replica pairs from this registry alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import NamedTuple

from replaytests.engine.rollout import MODES
from replaytests.errors import ConfigError
from replaytests.inputs.blocks import direction
from replaytests.inputs.gates import ROLLOUT_FAMILIES, ROLLOUT_RECOMPUTE

CROSS = "incremental~prefill"  # the crossing pair, also the transplant's and the replication's headline
# The transplant: (recipient, donor) in each direction, and the validity control (each construction's
# cache copied into its own fresh replica), whose arm must reproduce that construction's trajectory.
TRANSPLANT_CONSTRUCTIONS = ("incremental", "prefill")
DIRECTIONS = (("prefill", "incremental"), ("incremental", "prefill"))
TRANSPLANTS = tuple(direction(recipient, donor) for recipient, donor in DIRECTIONS)
REPLICA_DIRECTIONS = tuple((f"{c}_replica", c) for c in TRANSPLANT_CONSTRUCTIONS)
SELF_TRANSPLANTS = tuple(direction(replica, c) for replica, c in REPLICA_DIRECTIONS)
VALIDITY_PAIRS = tuple(zip(SELF_TRANSPLANTS, TRANSPLANT_CONSTRUCTIONS, strict=True))  # (self-transplant, own)
ROLES = ("divergent", "control")  # why a row is in the transplant panel


class Panel(NamedTuple):
    """The panel of a family that reads another's records (the transplants), drawn from that family's outcomes."""

    rows: list[tuple[str, str]]  # (row id, role): divergent rows, then controls, each by prefix (or history) length
    not_testable: list[tuple[str, str]]  # (row id, reason): divergent rows whose first tokens differ


# The four fidelity layers (pytest markers), in the order a report shows them, and what each checks.
LAYERS = {
    "replica": ("Replica stability", "Two executions of the same construction are bit-exact (cache, logits, "
                "suffix); without it no other comparison means anything, so a failure here fails the run."),
    "token_identity": ("Token identity", "Every construction consumed the same integer tokens, roles, "
                       "visibility, positions and padding as the bank row; a row that fails a fail-closed check is "
                       "excluded from every denominator, with its reason."),
    "fidelity": ("Live-state fidelity", "Does a reconstruction preserve the state the live decoder reached? Live "
                 "and incremental are expected bit-exact; prefill may differ at BF16 (the contract's gates say "
                 "what is allowed)."),
    "causal": ("Causal state sufficiency", "Does the cache carry the trajectory? Whole K/V caches transplanted "
               "between incremental and prefill: a recipient that follows its donor shows the cache decides."),
}
# Every pytest marker the conformance families use, registered by the plugin.
MARKERS = {
    "gpu": "conformance targets on a CUDA device (under -m gpu the default contract is contracts/h200.yaml)",
    **{name: f"fidelity layer {n}: {title.lower()}" for n, (name, (title, _)) in enumerate(LAYERS.items(), start=1)},
    "slow": "long-running conformance targets",
}


@dataclass(frozen=True)
class Family:
    """One experiment family, as every layer of the suite sees it."""

    name: str
    arms: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]  # the arm pairs its records compare
    headline: tuple[str, ...]  # the pairs ("A~B") its divergence counts read
    # the rows it runs on: "all", or its contract panel: "bridge", "live", "replication", "transplant", ...; a family
    # that `reads` another's records runs on the rows that family's outcomes put in its panel (its module's `panel`)
    panel: str
    layers: tuple[str, ...]  # the fidelity layers (pytest markers) whose conformance tests read its records
    # runs only on the cells whose crossing may diverge (its panel is drawn from their divergent rows):
    # in the paper's contract, bf16
    divergent_cells_only: bool = False
    accuracy: tuple[str, str] | None = None  # report: (first, second) arms whose accuracies are compared
    reductions: bool = False  # report: BF16 -> FP32 reductions of its headline divergences
    headline_table: bool = True  # report: the paper's headline table (the causal families have their own)
    title: str = ""  # as a report names it
    requires: tuple[str, ...] = ()  # the backend capabilities it needs (engine.backend.CAPABILITIES)
    reads: tuple[str, ...] = ()  # the families whose finished records (same row and cell) it reads
    settings: str | None = None  # the contract section its `run` takes as a third argument
    # its panel's size in the contract's panels (the path under `panels:`); None: every selected row, or a panel read
    # from another family's outcomes (its module's `panel`)
    panel_size: tuple[str, ...] | None = None
    row_fixture: str = ""  # the conformance tests' fixture of its rows (`<name>_row` where empty)
    later_model: bool = False  # runs on the later checkpoint (--replication-model), on no row without one
    module: str = ""  # the module whose `run` it is (`replaytests.families.<name>` where empty)
    # the file its settings carry as `bank`: "rows", the bank itself (a sweep's batch axis draws the other rows), or
    # "conversations", the conversation bank beside it (without which the family is not run); None: neither
    bank_file: str | None = None

    @property
    def fixture(self) -> str:
        """The conformance tests' fixture of its rows."""
        return self.row_fixture or f"{self.name}_row"

    @property
    def replicas(self) -> tuple[str, ...]:
        """Its replica pairs, `X~X_replica`."""
        return tuple(f"{a}~{b}" for a, b in self.pairs if b == f"{a}_replica")

    @property
    def run(self) -> Callable:
        """Its `run`, imported on first use (the registry itself loads no engine)."""
        return self._module().run

    @property
    def draw_panel(self) -> Callable[..., Panel]:
        """A family that `reads` another's records: its module's `panel(records, cell, divergent, controls)`."""
        return self._module().panel

    def _module(self):
        return importlib.import_module(self.module or f"replaytests.families.{self.name}")


def _with_replicas(*constructions: str) -> tuple[str, ...]:
    return tuple(arm for c in constructions for arm in (c, f"{c}_replica"))


_CROSSING_PAIRS = (("incremental", "incremental_replica"), ("prefill", "prefill_replica"), ("incremental", "prefill"))
_TRANSPLANT_PAIRS = (*((direction(r, d), d) for r, d in DIRECTIONS), *VALIDITY_PAIRS)
_BATCH = ("incremental", "prefill")
# The serving family's arms, in the order its requests run: the prefix hit right after the live request
# whose cache it reads; every other reconstruction on an empty cache (engine.vllm.runtime).
SERVING_ARMS = ("live", "prefix_hit", "live_replica", "prefill", "prefill_replica", "chunked", "batched")
_SERVING_PAIRS = (("live", "live_replica"), ("prefill", "prefill_replica"), ("live", "prefix_hit"),
                  ("live", "prefill"), ("prefill", "chunked"), ("prefill", "batched"))

# The rollout families (families/rollout.py): the live rollout, the trainer's recompute (prefill) and teacher
# forcing on the live schedule (incremental), each with a replica. live~incremental must be bit-exact (the
# control); live~prefill is the training-inference mismatch.
ROLLOUT_ARMS = _with_replicas("live", "incremental", "prefill")
_ROLLOUT_PAIRS = (("live", "live_replica"), ("incremental", "incremental_replica"), ("prefill", "prefill_replica"),
                  ("live", "incremental"), ("live", "prefill"))

# The conversation family (families/conversation.py): four constructions of turn k, each with a replica.
# session~replay is a server's cached turn against the same turn sent again after an eviction; session~rerendered
# what a client sending text gets; at turn 1 session and replay are the same one call (the control).
CONVERSATION_ARMS = _with_replicas("session", "replay", "rerendered", "incremental")
_CONVERSATION_PAIRS = (*((c, f"{c}_replica") for c in ("session", "replay", "rerendered", "incremental")),
                       ("session", "replay"), ("session", "incremental"), ("session", "rerendered"),
                       ("replay", "rerendered"))

# The conversation transplant (families/conversation_transplant.py): at a turn where session and replay diverge,
# each recipient given the other's K/V over the positions of turns 1..j; the self-transplant into each
# construction's replica (the whole history) is the validity control.
CONVERSATION_SPLICE = ("session", "replay")
SPLICE_DIRECTIONS = (("replay", "session"), ("session", "replay"))
SPLICES = tuple(direction(recipient, donor) for recipient, donor in SPLICE_DIRECTIONS)
SELF_SPLICES = tuple((direction(f"{c}_replica", c), c) for c in CONVERSATION_SPLICE)  # (self-splice, own)
_SPLICE_PAIRS = (("session", "replay"), *((c, f"{c}_replica") for c in CONVERSATION_SPLICE),
                 *((direction(r, d), d) for r, d in SPLICE_DIRECTIONS), *SELF_SPLICES)

# The edge sweep (families/sweep.py): at each point of an axis the backend sweeps (engine.backend.Axis), its reference
# construction and the construction whose edge the axis moves across, each with a replica, and a short continuation
# decoded from each; reference~edge is the headline, at every point.
SWEEP_ARMS = _with_replicas("reference", "edge")
SWEEP_HEADLINE = "reference~edge"
_SWEEP_PAIRS = (("reference", "reference_replica"), ("edge", "edge_replica"), ("reference", "edge"))

BUILT_IN = {family.name: family for family in (
    Family("live", _with_replicas("live", "prefill"), (("live", "live_replica"), ("prefill", "prefill_replica"),
                                                      ("live", "prefill")), ("live~prefill",), "live",
           ("replica", "token_identity", "fidelity"), accuracy=("live", "prefill"), reductions=True,
           title="Live matrix: live vs prefill of the live prefix", panel_size=("live",)),
    Family("crossing", _with_replicas("incremental", "prefill"), _CROSSING_PAIRS, (CROSS,), "all",
           ("replica", "token_identity", "fidelity"), accuracy=("incremental", "prefill"), reductions=True,
           title="Fixed-prefix crossing (2x2: construction x precision)", row_fixture="bank_row"),
    Family("bridge", ("live", "incremental"), (("live", "incremental"),), ("live~incremental",), "bridge",
           ("fidelity",), title="Bridge: a fresh live boundary vs the incremental cache of its tokens",
           requires=("kv_tensors",), panel_size=("bridge",), row_fixture="panel_row"),
    Family("batch", tuple(f"{c}_{size}" for c in _BATCH for size in ("pair", "singleton")),
           tuple((f"{c}_pair", f"{c}_singleton") for c in _BATCH),
           tuple(f"{c}_pair~{c}_singleton" for c in _BATCH), "bridge", ("token_identity", "fidelity"),
           title="Batch composition: duplicated pair vs singleton", requires=("batch_size", "state_copy"),
           panel_size=("bridge",)),
    Family("transplant", (*_with_replicas(*TRANSPLANT_CONSTRUCTIONS), *TRANSPLANTS, *SELF_TRANSPLANTS),
           (("incremental", "prefill"), *_TRANSPLANT_PAIRS), (CROSS,), "transplant", ("causal",),
           divergent_cells_only=True, headline_table=False, title="Transplant (Table 5)",
           requires=("kv_tensors", "state_copy"), reads=("crossing",)),
    Family("replication", (*_with_replicas(*TRANSPLANT_CONSTRUCTIONS), *TRANSPLANTS, *SELF_TRANSPLANTS),
           (*_CROSSING_PAIRS, *_TRANSPLANT_PAIRS), (CROSS,), "replication", ("causal",), divergent_cells_only=True,
           headline_table=False, title="Replication on a later checkpoint (Table 6)",
           requires=("kv_tensors", "state_copy"), panel_size=("replication", "rows"), later_model=True),
    Family("serving", SERVING_ARMS, _SERVING_PAIRS, tuple(f"{a}~{b}" for a, b in _SERVING_PAIRS[2:]), "all",
           ("replica", "fidelity"), accuracy=("live", "prefill"), reductions=True,
           title="Serving engine: prefix-cache hit, fresh, chunked and batched prefill vs live",
           requires=("prefix_cache", "chunked_prefill")),
    *(Family(name, ROLLOUT_ARMS, _ROLLOUT_PAIRS, (ROLLOUT_RECOMPUTE,), "rollout", ("replica", "fidelity"),
             headline_table=False, title=f"Rollout fidelity, {mode}: the trainer's recompute of a live rollout",
             requires=("rollout_logprobs",), settings="rollout", panel_size=("rollout",), row_fixture="rollout_row")
      for name, mode in zip(ROLLOUT_FAMILIES, MODES, strict=True)),
    Family("conversation", CONVERSATION_ARMS, _CONVERSATION_PAIRS, ("session~replay", "session~rerendered"),
           "conversation", ("replica", "fidelity"), headline_table=False,
           title="Conversations: turn k of a cached chat, replayed and re-rendered",
           requires=("conversation",), settings="conversation", panel_size=("conversation",),
           bank_file="conversations"),
    Family("conversation_transplant", (*_with_replicas(*CONVERSATION_SPLICE), *SPLICES, *(n for n, _ in SELF_SPLICES)),
           _SPLICE_PAIRS, ("session~replay",), "conversation_transplant", ("causal",), divergent_cells_only=True,
           headline_table=False, title="Conversation transplant: the earliest turn whose K/V carries the divergence",
           requires=("conversation", "kv_tensors", "position_splice"), reads=("conversation",),
           settings="conversation", panel_size=("conversation",),  # its candidates: the conversation family's rows
           bank_file="conversations"),
    Family("sweep", SWEEP_ARMS, _SWEEP_PAIRS, (SWEEP_HEADLINE,), "sweep", ("replica", "token_identity", "fidelity"),
           headline_table=False, title="Edge sweep: where a replay breaks, along each edge of the engine",
           requires=("edge_sweep",), settings="sweep", panel_size=("sweep",), bank_file="rows"),
)}

ENTRY_POINTS = "replaytests.families"  # a plugin's family: `name = module:FAMILY`, a Family of that name


def _plugins() -> tuple[dict[str, Family], str | None]:
    """The families registered by entry points (group `replaytests.families`), in their names' order, and the first
    bad entry point's one-line error (None where there is none), which stops the reading."""
    found = {}
    for point in sorted(metadata.entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        where = f"entry point {point.name} = {point.value} ({ENTRY_POINTS})"
        if point.name in BUILT_IN:
            return found, f"{where}: family {point.name} is registered already"
        try:
            family = point.load()
        except (ImportError, AttributeError) as exc:
            return found, f"{where}: cannot import it: {exc}"
        if not isinstance(family, Family) or family.name != point.name:
            return found, (f"{where}: expected a replaytests.families.registry.Family named {point.name!r}, "
                           f"got {family!r:.80}")
        found[point.name] = family
    return found, None


# The registry is read while modules import it, so a bad entry point is not raised here (it would surface as a
# traceback of pytest's plugin loading): the pytest plugin and the CLI call check_plugins first.
_FOUND, _PROBLEM = _plugins()
FAMILIES = BUILT_IN | _FOUND


def check_plugins() -> None:
    """Raise the first bad family entry point's one-line error, if there is one."""
    if _PROBLEM:
        raise ConfigError(_PROBLEM)
