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
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import NamedTuple

from replaytests.errors import ConfigError
from replaytests.inputs.blocks import direction
from replaytests.inputs.cells import divergence_gate
from replaytests.inputs.gates import ROLLOUT_CONTROL, ROLLOUT_RECOMPUTE
from replaytests.inputs.schema import MAX_BATCH, MAX_COUNT, NUMBER, ListOf, Section, Value, pin

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


class Control(NamedTuple):
    """A pair a family's records hold that checks the measurement itself: two constructions that make the same calls,
    bit-exact in every layer, the logits and the suffix (the bridge's fresh live boundary vs the incremental cache of
    its tokens; a rollout's teacher-forced replay on the live schedule), judged by gates.control."""

    pair: str
    gate: str  # the key of its gate section that says whether it must be exact (false: a difference is recorded)
    name: str  # as compare's table and a report's check name it


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
    # report: the outputs module that makes its causal outcomes per cell from the run's records (the paper's Tables 5
    # and 6) and renders them everywhere they are shown (outputs/causal.py says what it holds); "" for none
    outcome: str = ""
    # report: the outputs module of its own report section instead of a headline table (its report.json keys and their
    # part of every renderer: outputs/family_sections.py says what it holds); "" for none
    report_section: str = ""
    # the file its settings carry as `bank`: "rows", the bank itself (a sweep's batch axis draws the other rows), or
    # "conversations", the conversation bank beside it (without which the family is not run); None: neither
    bank_file: str | None = None
    # The contract sections it owns (inputs/contract.py builds its schema from them; docs/contract.md names every key),
    # each an inputs.schema node; families that share a section declare the same node, or none:
    panel_schema: Value | Section | None = None  # `panels.<panel>`
    settings_schema: Section | None = None  # `<settings>:`, the section its `run` takes
    # the rules that relate its settings' fields: check(settings, error), error(field, message) raising one line
    check_settings: Callable[[dict, Callable[[str, str], Exception]], None] | None = None
    gates_schema: Section | None = None  # `gates.<gate_section>`, what its judgements read
    gates: str = ""  # the `gates:` section its judgements read (its name where empty)
    control: Control | None = None  # the pair that checks its measurement itself, where it has one

    @property
    def gate_section(self) -> str:
        """The `gates:` section its judgements read."""
        return self.gates or self.name

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


def _gates(**keys) -> Section:
    return Section(keys, default={})


def _exact() -> Value:
    return Value(bool, default=True)


_DIVERGENCE_GATES = _gates(replicas_exact=_exact(), suffix_divergence_allowed=divergence_gate())
# The family whose divergence gate is the contract's per cell (Contract.may_diverge): every other family's
# `suffix_divergence_allowed` takes its value for a cell it leaves unnamed.
DIVERGENCE_REFERENCE = "crossing"
# The family whose finished records of earlier runs `--panel-from` supplies: the transplant's panel is drawn from them
PANEL_SOURCE = "crossing"
_BRIDGE_PANEL = Value(int, default=12, low=1, high=MAX_COUNT)

_CROSSING_PAIRS = (("incremental", "incremental_replica"), ("prefill", "prefill_replica"), ("incremental", "prefill"))
_TRANSPLANT_PAIRS = (*((direction(r, d), d) for r, d in DIRECTIONS), *VALIDITY_PAIRS)
_BATCH = ("incremental", "prefill")
# The serving family's arms, in the order its requests run: the prefix hit right after the live request
# whose cache it reads; every other reconstruction on an empty cache (engine.vllm.runtime).
SERVING = "serving"
SERVING_ARMS = ("live", "prefix_hit", "live_replica", "prefill", "prefill_replica", "chunked", "batched")
_SERVING_PAIRS = (("live", "live_replica"), ("prefill", "prefill_replica"), ("live", "prefix_hit"),
                  ("live", "prefill"), ("prefill", "chunked"), ("prefill", "batched"))

# The rollout families (families/rollout.py): the live rollout, the trainer's recompute (prefill) and teacher
# forcing on the live schedule (incremental), each with a replica. live~incremental must be bit-exact (the
# control); live~prefill is the training-inference mismatch.
ROLLOUT_FAMILIES = ("rollout", "rollout_sampled")
ROLLOUT_ARMS = _with_replicas("live", "incremental", "prefill")
_ROLLOUT_PAIRS = (("live", "live_replica"), ("incremental", "incremental_replica"), ("prefill", "prefill_replica"),
                  ("live", "incremental"), ("live", "prefill"))
# The rollout families' contract sections (docs/protocol.md §15), which both share: how long a rollout is, the
# sampler's seed, and the thresholds a token's log-probability ratio r = p_replay / p_live and |delta logp| are
# measured against; replicas bit-exact; the teacher-forced replay on the live schedule bit-exact with the live
# log-probabilities (the control); per row, bounds on the trainer's recompute (live~prefill): the k3 estimate of
# KL(live || replay) per token and the share of tokens with r outside ratio_bounds (null: measured and recorded, not
# gated).
_ROLLOUT_PANEL = pin(int, low=1, high=MAX_COUNT)  # null: every selected row
_ROLLOUT_SETTINGS = Section({
    "length": Value(int, default=32, low=1, high=MAX_COUNT),
    "seed": Value(int, default=0, low=0, high=2**63 - 1),
    "ratio_bounds": ListOf(Value(NUMBER, low=0, high=MAX_COUNT), default=[0.5, 2.0]),
    "delta_threshold": Value(NUMBER, default=0.05, low=0, high=MAX_COUNT),
}, default={})
_ROLLOUT_GATES = _gates(replicas_exact=_exact(), live_incremental_exact=_exact(),
                        k3_max=pin(NUMBER, low=0, high=MAX_COUNT), outside_bounds_max=pin(NUMBER, low=0, high=1))


def _check_rollout(settings: dict, error: Callable[[str, str], Exception]) -> None:
    bounds = settings["ratio_bounds"]
    if len(bounds) != 2 or not 0 < bounds[0] <= 1 <= bounds[1]:
        raise error("ratio_bounds", f"expected [low, high] with 0 < low <= 1 <= high (bounds on p_replay / p_live), "
                                    f"got {bounds}")


# The conversation family (families/conversation.py): four constructions of turn k, each with a replica.
# session~replay is a server's cached turn against the same turn sent again after an eviction; session~rerendered
# what a client sending text gets; at turn 1 session and replay are the same one call (the control).
CONVERSATION = "conversation"
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
SWEEP = "sweep"
SWEEP_ARMS = _with_replicas("reference", "edge")
SWEEP_HEADLINE = "reference~edge"
_SWEEP_PAIRS = (("reference", "reference_replica"), ("edge", "edge_replica"), ("reference", "edge"))

# The sweep's contract section (docs/protocol.md §17): on a position axis, the points at the first and the last
# `multiples` multiples of each engine edge, one before and one after each, and the row's whole prefix; `stride` is
# the edge of a position axis where the engine names none; `continuation`, the tokens decoded greedily from each arm's
# state.
_SWEEP_SETTINGS = Section({
    "multiples": Value(int, default=2, low=1, high=MAX_COUNT),
    "stride": Value(int, default=64, low=2, high=MAX_COUNT),
    "continuation": Value(int, default=8, low=1, high=MAX_COUNT),
    # a batch axis (vLLM): the row as a needle among this many other requests (other rows' prefixes, with it at most
    # MAX_BATCH requests), at a position drawn with `seed`
    "batch_sizes": ListOf(Value(int, low=1, high=MAX_BATCH - 1), default=[1, 2, 3, 4, 7, 8, 9, 15, 16, 17]),
    "seed": Value(int, default=0, low=0, high=2**63 - 1),
    # the axes swept, by name, among those the backend declares (empty: every one)
    "axes": ListOf(Value(str, pattern=r"[a-z0-9_]+", expect="an axis name"), default=[]),
}, default={})

BUILT_IN = {family.name: family for family in (
    Family("live", _with_replicas("live", "prefill"), (("live", "live_replica"), ("prefill", "prefill_replica"),
                                                      ("live", "prefill")), ("live~prefill",), "live",
           ("replica", "token_identity", "fidelity"), accuracy=("live", "prefill"), reductions=True,
           title="Live matrix: live vs prefill of the live prefix", panel_size=("live",),
           panel_schema=pin(int, low=1, high=MAX_COUNT), gates_schema=_DIVERGENCE_GATES),
    Family("crossing", _with_replicas("incremental", "prefill"), _CROSSING_PAIRS, (CROSS,), "all",
           ("replica", "token_identity", "fidelity"), accuracy=("incremental", "prefill"), reductions=True,
           title="Fixed-prefix crossing (2x2: construction x precision)", row_fixture="bank_row",
           gates_schema=_DIVERGENCE_GATES),
    Family("bridge", ("live", "incremental"), (("live", "incremental"),), ("live~incremental",), "bridge",
           ("fidelity",), title="Bridge: a fresh live boundary vs the incremental cache of its tokens",
           requires=("kv_tensors",), panel_size=("bridge",), row_fixture="panel_row", panel_schema=_BRIDGE_PANEL,
           gates_schema=_gates(exact=_exact()), control=Control("live~incremental", "exact", "bridge")),
    Family("batch", tuple(f"{c}_{size}" for c in _BATCH for size in ("pair", "singleton")),
           tuple((f"{c}_pair", f"{c}_singleton") for c in _BATCH),
           tuple(f"{c}_pair~{c}_singleton" for c in _BATCH), "bridge", ("token_identity", "fidelity"),
           title="Batch composition: duplicated pair vs singleton", requires=("batch_size", "state_copy"),
           panel_size=("bridge",), panel_schema=_BRIDGE_PANEL,
           gates_schema=_gates(suffix_divergence_allowed=divergence_gate())),
    Family("transplant", (*_with_replicas(*TRANSPLANT_CONSTRUCTIONS), *TRANSPLANTS, *SELF_TRANSPLANTS),
           (("incremental", "prefill"), *_TRANSPLANT_PAIRS), (CROSS,), "transplant", ("causal",),
           divergent_cells_only=True, headline_table=False, title="Transplant (Table 5)",
           requires=("kv_tensors", "state_copy"), reads=("crossing",),
           outcome="replaytests.outputs.transplant_outcome",
           panel_schema=Section({"divergent": Value(int, default=24, low=1, high=MAX_COUNT),
                                 "exact_controls": Value(int, default=8, low=1, high=MAX_COUNT),
                                 "layers": Value(str, default="all", choices=("all",)),
                                 "directions": Value(str, default="both", choices=("both",))}, default={}),
           gates_schema=_gates(donor_recovery=Value(NUMBER, default=1.0, low=0, high=1),
                               controls_third_trajectory=Value(int, default=0, low=0, high=MAX_COUNT))),
    Family("replication", (*_with_replicas(*TRANSPLANT_CONSTRUCTIONS), *TRANSPLANTS, *SELF_TRANSPLANTS),
           (*_CROSSING_PAIRS, *_TRANSPLANT_PAIRS), (CROSS,), "replication", ("causal",), divergent_cells_only=True,
           headline_table=False, title="Replication on a later checkpoint (Table 6)",
           requires=("kv_tensors", "state_copy"), panel_size=("replication", "rows"), later_model=True,
           outcome="replaytests.outputs.replication_outcome",
           panel_schema=Section({"rows": Value(int, default=48, low=1, high=MAX_COUNT),
                                 "min_exact_controls": Value(int, default=6, low=1, high=MAX_COUNT)}, default={}),
           gates="transplant"),
    Family(SERVING, SERVING_ARMS, _SERVING_PAIRS, tuple(f"{a}~{b}" for a, b in _SERVING_PAIRS[2:]), "all",
           ("replica", "fidelity"), accuracy=("live", "prefill"), reductions=True,
           title="Serving engine: prefix-cache hit, fresh, chunked and batched prefill vs live",
           requires=("prefix_cache", "chunked_prefill"), gates_schema=_DIVERGENCE_GATES),
    *(Family(name, ROLLOUT_ARMS, _ROLLOUT_PAIRS, (ROLLOUT_RECOMPUTE,), "rollout", ("replica", "fidelity"),
             headline_table=False, title=f"Rollout fidelity, {mode}: the trainer's recompute of a live rollout",
             requires=("rollout_logprobs",), settings="rollout", panel_size=("rollout",), row_fixture="rollout_row",
             panel_schema=_ROLLOUT_PANEL, settings_schema=_ROLLOUT_SETTINGS, check_settings=_check_rollout,
             gates_schema=_ROLLOUT_GATES, gates="rollout", report_section="replaytests.outputs.rollout_section",
             control=Control(ROLLOUT_CONTROL, "live_incremental_exact", "rollout control"))
      for name, mode in zip(ROLLOUT_FAMILIES, ("greedy", "sampled"), strict=True)),
    # The conversation family (docs/protocol.md §16): `cap`, the content tokens an assistant turn may hold (its
    # conversation bank's manifest must record the same cap: the session reproduces the bank under it); every turn's
    # replicas bit-exact; at turn 1 the session and the replay are the same one call over the first user turn (the
    # control), bit-exact; re-rendered ids that differ from the generated ones at a turn are recorded (true: a failure).
    Family("conversation", CONVERSATION_ARMS, _CONVERSATION_PAIRS, ("session~replay", "session~rerendered"),
           "conversation", ("replica", "fidelity"), headline_table=False,
           title="Conversations: turn k of a cached chat, replayed and re-rendered",
           requires=("conversation",), settings="conversation", panel_size=("conversation",),
           bank_file="conversations", panel_schema=Value(int, default=12, low=1, high=MAX_COUNT),  # conversations run
           settings_schema=Section({"cap": Value(int, default=12, low=1, high=MAX_COUNT)}, default={}),
           gates_schema=_gates(replicas_exact=_exact(), control_exact=_exact(),
                               rerendered_ids_equal=Value(bool, default=False)),
           report_section="replaytests.outputs.conversation_section"),
    # Its panel: divergent conversations among the conversation family's, and controls (conversations whose
    # constructions agree at every turn: each costs a splice per turn and direction); judged under the transplant's
    # gates.
    Family("conversation_transplant", (*_with_replicas(*CONVERSATION_SPLICE), *SPLICES, *(n for n, _ in SELF_SPLICES)),
           _SPLICE_PAIRS, ("session~replay",), "conversation_transplant", ("causal",), divergent_cells_only=True,
           headline_table=False, title="Conversation transplant: the earliest turn whose K/V carries the divergence",
           requires=("conversation", "kv_tensors", "position_splice"), reads=("conversation",),
           settings="conversation", panel_size=("conversation",),  # its candidates: the conversation family's rows
           bank_file="conversations",
           panel_schema=Section({"divergent": Value(int, default=12, low=1, high=MAX_COUNT),
                                 "exact_controls": Value(int, default=2, low=1, high=MAX_COUNT)}, default={}),
           gates="transplant", outcome="replaytests.outputs.conversation_transplant_outcome"),
    # Its gates: every point's replicas bit-exact; reference~edge continuations that diverge at a point are recorded
    # where the cell may diverge, a failure where it may not.
    Family(SWEEP, SWEEP_ARMS, _SWEEP_PAIRS, (SWEEP_HEADLINE,), "sweep", ("replica", "token_identity", "fidelity"),
           headline_table=False, title="Edge sweep: where a replay breaks, along each edge of the engine",
           requires=("edge_sweep",), settings="sweep", panel_size=("sweep",), bank_file="rows",
           panel_schema=Value(int, default=4, low=1, high=MAX_COUNT),  # its rows, each a sweep of every axis
           settings_schema=_SWEEP_SETTINGS, gates_schema=_DIVERGENCE_GATES,
           report_section="replaytests.outputs.sweep_section"),
)}

# The contract sections a family may own: kind -> (its Family field, the section's name from its record).
SECTIONS = {"panels": ("panel_schema", lambda family: family.panel),
            "settings": ("settings_schema", lambda family: family.settings),
            "gates": ("gates_schema", lambda family: family.gate_section)}


def declared(kind: str, families: dict[str, Family] | None = None) -> dict[str, object]:
    """The contract sections of one kind (SECTIONS) that the families declare, by section name, in the registry's
    order. Families sharing a section declare the same node or none; two different nodes under one name, or a
    family's settings section that no family declares, is one line."""
    attribute, name_of = SECTIONS[kind]
    families = FAMILIES if families is None else families
    found: dict[str, object] = {}
    for family in families.values():
        node = getattr(family, attribute)
        if node is not None and found.setdefault(name_of(family), node) != node:
            raise ConfigError(f"family {family.name}: its {attribute} for the contract's {kind} section "
                              f"{name_of(family)!r} differs from another family's (families sharing a section declare "
                              "the same node)")
    if kind == "settings" and (bare := [f.name for f in families.values() if f.settings and f.settings not in found]):
        raise ConfigError(f"family {bare[0]}: its settings section {families[bare[0]].settings!r} is declared by no "
                          "family (a settings_schema)")
    return found


ENTRY_POINTS = "replaytests.families"  # a plugin's family: `name = module:FAMILY`, a Family of that name


def _importable(name: str) -> bool:
    """Whether a module of that dotted name can be found (its parent packages are imported; the module is not)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or an empty name part
        return False


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
        if missing := [f"its {field} {name!r} names no module that can be imported"
                       for field in ("outcome", "report_section") if (name := getattr(family, field))
                       and not _importable(name)]:
            return found, f"{where}: {'; '.join(missing)}"
        try:
            for kind in SECTIONS:
                declared(kind, BUILT_IN | found | {point.name: family})
        except ConfigError as exc:
            return found, f"{where}: {exc}"
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
