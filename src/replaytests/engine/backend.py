"""The runtime under test, as the families see it: a Backend and the capabilities it declares.

A family asks its backend for boundaries (`build`, `live`), continues them (`suffix`) and, where the
runtime exposes K/V tensors, moves caches between them (`transplant`); it never touches the runtime's
own objects. Each backend declares what it can do in `capabilities`; a family declares what it needs
(families.registry), and a family whose needs a backend lacks is skipped with the reason `missing`
gives, never faked. Hugging Face transformers is the first backend (engine/hf/).

No torch here: the plugin reads the capability names before any model work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from replaytests import backends
from replaytests.errors import ConfigError, ReplaytestsError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from replaytests.backends import Declaration
    from replaytests.engine.boundary import Boundary, Suffix
    from replaytests.engine.conversation import TurnState
    from replaytests.engine.protocol import Grammar
    from replaytests.engine.rollout import Rollout
    from replaytests.inputs.cells import Cell
    from replaytests.inputs.contract import Contract

# Every capability a backend may declare, and what a family that needs it reads from the runtime.
CAPABILITIES = {
    "kv_tensors": "every layer's K and V at the boundary (cache digests, drift, bit-exact caches)",
    "state_copy": "a boundary's K/V copied, storage-isolated, into another construction (transplant, batch views)",
    "role_visibility": "the protocol's six-role visibility passed as a 4D mask on every forward call",
    "structural_mask": "the structural logits mask applied to every greedy choice",
    "physical_batch": "every forward call carries duplicate copies of the row, compared bitwise",
    "batch_size": "the same row run as a singleton and as the duplicated pair",
    "full_logits": "the boundary's whole logit row (else top-k logprobs only)",
    "prefix_cache": "a prefix cache the engine reuses across requests, with its own count of the tokens it reused",
    "chunked_prefill": "a prefill split into chunks under a token budget, the chunks observed in the scheduler",
    "rollout_logprobs": "a rollout decoded live with each chosen token's log-probability over the full vocabulary, "
                        "and replays that score the same tokens",
    "conversation": "a conversation's turns: one session cache carried across turns, its token history replayed "
                    "(one call, one token per call) and its messages rendered by a chat template",
    "position_splice": "a conversation turn's K/V over its first positions replaced, storage-isolated, by another "
                       "construction's, and the assistant turn decoded from the result (the conversation transplant)",
    "edge_sweep": "the axes along which the engine's edges lie (block, chunk and batch sizes, a quantized cache's "
                  "residual), and a reference and an edge construction at each point of one (the edge sweep)",
}
SERVING = frozenset({"prefix_cache", "chunked_prefill"})  # what a serving engine has and one forward call has not


class Unsupported(ReplaytestsError):
    """An operation the backend cannot serve: it lacks the capability named in the message."""


def missing(capabilities: frozenset[str], required: Sequence[str], backend: str) -> str | None:
    """The one-line reason a family needing `required` cannot run on a backend, or None if it can."""
    if lacking := [name for name in required if name not in capabilities]:
        return f"backend {backend} lacks {', '.join(lacking)} ({'; '.join(CAPABILITIES[n] for n in lacking)})"
    return None


@runtime_checkable
class Backend(Protocol):
    """One model at one cell on one runtime."""

    name: str
    cell: str  # the cell's name (inputs/cells.py); the cell itself is contract.cell(cell)
    cell_digest: str  # what its records carry: the cell's definition and any library it runs through
    capabilities: frozenset[str]
    grammar: Grammar  # the protocol's delimiters, caps and structural mask, resolved for this model
    visibility: str  # the contract's protocol.visibility it runs under ("causal" for a runtime without masks)

    def activate(self) -> None:
        """Re-apply this cell's numeric settings (another backend may have changed them)."""

    def build(self, construction: str, z: list[int]) -> Boundary:
        """`incremental` or `prefill` (or a `*_replica` of one) of the prefix z, ending at <|merge|>."""

    def live(self, prompt_block: list[int], construction: str = "live") -> Boundary:
        """Greedy generation from the prompt block until it has consumed <|merge|>."""

    def suffix(self, boundary: Boundary) -> Suffix:
        """The shared suffix decoder, from a boundary through <|/answer|>."""

    def rollout(self, z: list[int], length: int, seed: int | None, construction: str = "live") -> Rollout:
        """A live rollout of `length` tokens from the boundary of z (engine/rollout.py): greedy where `seed` is
        None, else sampled at temperature 1, top-p 1 with that seed; `live_replica` names a second one."""

    def replay(self, construction: str, z: list[int], response: list[int]) -> Rollout:
        """`incremental` or `prefill` (or a `*_replica`) over z + response: the response's log-probabilities
        as that replay computes them."""

    def session(self, users: list[list[int]], cap: int, closer: int,
                construction: str = "session") -> list[TurnState]:
        """A conversation's session (engine/conversation.py): each user turn's segment appended in one call,
        each assistant turn decoded live on the same cache up to the closer (the template's end-of-turn token,
        chosen or forced after `cap` content tokens); `session_replica` names a second one."""

    def replayed(self, construction: str, histories: list[list[int]], cap: int, closer: int) -> list[TurnState]:
        """`replay`, `rerendered` (one call over each turn's history) or `incremental` (one token per call),
        or a `*_replica`: each turn's state and the assistant turn decoded from it."""

    def render(self, template: str, messages: list[dict], generation_prompt: bool) -> str:
        """Chat messages through a chat template, as text (what a server tokenizes for a client)."""

    def transplant(self, recipient: Boundary, donor: Boundary, layers: Sequence[int] | None = None,
                   parts: Sequence[str] = ("k", "v")) -> Boundary:
        """The recipient's boundary with the selected layers' K and/or V copied from the donor; Unsupported
        where the backend has no `state_copy`."""

    def splice(self, recipient: Boundary, donor: Boundary, end: int) -> Boundary:
        """A conversation turn's state (engine/turn_splice.py) with every layer's K and V over positions [0, end)
        copied from the donor's, nothing recomputed (its boundary logits its own); Unsupported where the backend
        has no `position_splice`."""

    def answer(self, boundary: Boundary, cap: int, closer: int) -> Suffix:
        """The assistant turn decoded from a turn state (a spliced one), as `session` decodes it (`position_splice`)."""

    def encode(self, text: str) -> list[int]:
        """`text` in the model's own tokenizer, without added special tokens (a problem's prompt)."""

    def decode(self, ids: list[int]) -> str:
        """Token ids as text in the model's own tokenizer (what a client keeps of an assistant turn)."""

    def probe(self, tokens: list[int]):
        """The last position's logits (a [vocab] tensor) of one call over `tokens`, any prefix the grammar
        accepts (check-model's mask probe); Unsupported where the runtime shows no whole logit row."""

    def sweep_axes(self, settings: dict) -> tuple[Axis, ...]:
        """The axes this backend sweeps at this cell (`edge_sweep`), their edges read from the contract, the cell and
        the contract's `sweep` section (`settings`)."""

    def sweep(self, axis: Axis, z: list[int], values: Sequence[int], continuation: int):
        """Each point of `axis` at `values`: (value, {arm: (Boundary, Suffix)}) for the sweep's arms (reference, edge
        and a replica of each) over the point's prefix of z, each continued greedily for `continuation` tokens under
        the structural mask; a backend with engine counters puts them in each boundary's `state.served`."""

    def with_batch(self, batch: int) -> Backend:
        """The same model and cell with another physical batch; Unsupported without `batch_size`."""

    def first_copy(self, boundary: Boundary) -> Boundary:
        """The first copy of a physical batch as a storage-isolated singleton boundary (`batch_size`)."""


class Axis(NamedTuple):
    """An axis the edge sweep moves along (families/sweep.py), as a backend declares it (`sweep_axes`)."""

    name: str  # "position": the prefix's length; "batch": the requests beside the row; "start": cold and warm ...
    reference: str  # the reference construction at a point, in words
    edge: str  # the construction whose edge the axis crosses, in words
    # the engine's edge sizes on a position axis, by the contract field that sets each: the sweep's points sit at their
    # multiples, one before and one after
    edges: tuple[tuple[str, int], ...] = ()
    values: tuple[int, ...] = ()  # an axis of counts: its points as the contract lists them (the field in `field`)
    field: str | None = None  # the contract field that lists `values`


class ModelFacts(NamedTuple):
    """What a backend reads of a model before loading its weights (its `inspect`): the session validates
    the bank and the sequence lengths against it before any model work."""

    grammar: Grammar  # the contract's delimiters, caps and banned tokens resolved in the model's vocabulary
    max_positions: int  # the longest sequence the model takes
    sliding_window: int | None  # the attention window some layer applies; None where every layer sees all
    summary: str  # architecture and layer count, as check-model prints them
    source: str  # the file a limit was read from, named in errors


def check_window(facts: ModelFacts, longest: int) -> None:
    """A model whose layers attend through a sliding window shorter than the longest sequence a row
    needs is refused: its cache would drop keys the visibility contract keeps visible, so no replay of
    it means what the protocol says."""
    window = facts.sliding_window
    if window is not None and window < longest:
        raise ConfigError(f"{facts.source}: sliding_window {window} is shorter than the longest sequence "
                          f"this bank needs ({longest} tokens, prefix and suffix): the visibility contract "
                          "cannot be expressed with it")


def require_causal(contract: Contract, runtime: str, docs: str) -> None:
    """A runtime that attends causally and takes no role masks replays only a causal contract's banks."""
    if contract.visibility != "causal":
        raise ConfigError(f"{contract.path}: protocol.visibility is {contract.visibility!r}, but {runtime} attends "
                          "causally and takes no role masks: freeze and replay a bank under a contract with "
                          f"protocol: {{visibility: causal}} ({docs})")


def library_problem(module: str, install: str) -> str | None:
    """Why a cell's library cannot run here, in words, or None: not installed (`install` says how), or
    installed but failing to import (a broken build, a missing native dependency), which would otherwise
    surface as one ImportError traceback per test."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:  # anything a broken library raises at import
        absent = isinstance(exc, ModuleNotFoundError) and exc.name is not None
        if absent and (module == exc.name or module.startswith(exc.name + ".")):  # it, or a parent package
            return f"{module} is not installed here ({install})"
        first = next(iter(str(exc).strip().splitlines()), "")
        return f"{module} is installed but fails to import ({type(exc).__name__}: {first})"
    return None


def cell_digest(backend: type[Declaration], cell: Cell) -> str:
    """The digest a backend's records of `cell` carry: its definition and, where the backend runs it through a
    library (its `cell_versions`), that library's version."""
    return cell.digest(backend.cell_versions(cell) or None)


def check_cell(backend: type, contract: Contract, name: str) -> str | None:
    """Refuse, in one line naming the contract, the cell and the field, a cell the backend never runs;
    return the reason to skip a cell whose library is not installed here (else None). A cell is never run
    in another format than the one it names."""
    problem = backend.cell_problem(contract.cell(name))
    if problem is None:
        return None
    line = f"{contract.path}: cells.{name}.{problem.field}: {problem.message}"
    if problem.missing_library:
        return line
    raise ConfigError(line)


def resolve(spec: str) -> type:
    """The runtime class `spec` names: a registered backend's name (replaytests.backends) or `module:Class`
    (importable here), a subclass of replaytests.backends.Declaration with `load(model_dir, contract, cell,
    device)` and capabilities from CAPABILITIES."""
    declared = backends.load(spec, f"--backend {spec!r}") if ":" in spec else backends.declared(spec)
    found = backends.runtime_class(declared)
    if not hasattr(found, "load") or found.capabilities - CAPABILITIES.keys():
        raise ConfigError(f"--backend {spec!r}: {found.__qualname__} is not a backend class (expected capabilities "
                          f"from {', '.join(CAPABILITIES)}, and load)")
    return found
