"""What a replay process loads once is frozen out of the garbage collector's passes (suite/heap.py)."""

import gc
import weakref

import pytest

from replaytests.suite import heap


class Node:
    """A weakly referable object that can sit in a reference cycle."""


@pytest.fixture
def collector_state():
    """The collector as the test found it, restored (enabled or not; nothing the test froze stays frozen)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("enabled", [pytest.param(True, id="collector-on"), pytest.param(False, id="collector-off")])
def test_what_is_kept_for_the_run_is_frozen_and_the_collector_restored(collector_state, enabled):
    (gc.enable if enabled else gc.disable)()
    frozen = gc.get_freeze_count()
    with heap.kept_for_the_run():
        assert not gc.isenabled(), "the collector ran while the kept objects were made"
        node = Node()
        node.cycle = node  # garbage only the cyclic collector could free
        kept = weakref.ref(node)
        del node
    assert gc.isenabled() is enabled, f"the collector is {'on' if gc.isenabled() else 'off'}, was {enabled}"
    assert gc.get_freeze_count() > frozen, "nothing was frozen"
    gc.collect()
    assert kept() is not None, "a full collection walked what was frozen"
    gc.unfreeze()
    gc.collect()
    assert kept() is None, "the control: unfrozen, the same cycle is collected"


def test_the_collector_is_restored_when_the_load_fails(collector_state):
    gc.enable()
    with pytest.raises(RuntimeError), heap.kept_for_the_run():
        raise RuntimeError("a load that failed")
    assert gc.isenabled(), "a failed load left the collector off"


@pytest.mark.model
def test_a_session_freezes_its_imports_and_each_model_it_loads(collector_state):
    """The session's open and each cell's load end frozen (a count that grows at each). That the records are
    unchanged by it, the committed baselines show (every run audits against them)."""
    from replaytests.inputs.options import Options
    from replaytests.suite.session import ReplaySession

    gc.unfreeze()
    session = ReplaySession.open(Options(rows="1", precision="fp32"))
    opened = gc.get_freeze_count()
    assert opened > 0, "the open froze nothing"
    session.runtime("fp32")
    assert gc.get_freeze_count() > opened, "the model's load froze nothing"
