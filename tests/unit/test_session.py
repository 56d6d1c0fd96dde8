"""The session's row selection: --rows, panels, --shard i/N, and one GPU per xdist worker."""

import dataclasses

import pytest
import torch

from replaytests.errors import ConfigError
from replaytests.families import conversation_transplant, transplant
from replaytests.families.registry import FAMILIES
from replaytests.inputs import conversations
from replaytests.inputs.options import Options, parse_shard
from replaytests.suite.devices import pinned_device
from replaytests.suite.session import ReplaySession


@pytest.fixture(scope="module")
def session(opened_session) -> ReplaySession:
    return opened_session()


def sharded(session: ReplaySession, spec: str) -> ReplaySession:
    return dataclasses.replace(session, options=dataclasses.replace(session.options, shard=spec))


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_bad_shard_is_a_one_line_error(spec):
    with pytest.raises(ConfigError, match=r"--shard: expected i/N with 1 <= i <= N \(e\.g\. 2/4\), got"):
        parse_shard(spec)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("count", [2, 3, 5])
def test_shards_partition_each_family_rows(session, family, count):
    whole = [r.id for r in session.plan.family_rows(family)]
    shares = [[r.id for r in sharded(session, f"{i}/{count}").plan.family_rows(family)] for i in range(1, count + 1)]
    together = sorted(row for share in shares for row in share)
    assert together == sorted(whole), f"{family} shards of {count} do not cover the unsharded rows exactly once"
    panel = len(whole) < len(session.rows)  # a panel drawn by prefix length is not balanced by position
    assert panel or max(map(len, shares)) - min(map(len, shares)) <= 1, \
        f"{family} shares are unbalanced: {list(map(len, shares))}"


def test_panels_are_drawn_before_sharding(session):
    """A shard runs its share of the unsharded panel, not a panel of its own rows."""
    panel = {r.id for r in session.plan.family_rows("bridge")}
    share = {r.id for r in sharded(session, "1/2").plan.family_rows("bridge")}
    assert share < panel and len(panel) == 12, (share, panel)


def test_a_family_gets_the_bank_file_its_registry_record_names(session, tmp_path):
    """The edge sweep's settings carry the bank, the conversation families' the conversation bank beside it, and
    without that file those two are not run, saying which file is missing."""
    bank = session.options.bank
    assert session.family_settings("sweep")["bank"] == bank
    assert session.family_settings("conversation")["bank"] == conversations.path_for(bank)
    assert "bank" not in session.family_settings("rollout")
    assert session.unavailable("conversation") is None, "the embedded bank has its conversations"
    moved = dataclasses.replace(session, options=dataclasses.replace(session.options, bank=tmp_path / bank.name))
    for family in ("conversation", "conversation_transplant"):
        assert moved.unavailable(family) == (f"no conversation bank beside the bank "
                                             f"({conversations.path_for(tmp_path / bank.name).name})"), family
    assert moved.unavailable("sweep") is None


@pytest.mark.parametrize("family", ["transplant", "conversation_transplant"])
def test_each_transplant_panel_is_drawn_with_its_own_contract_sizes(monkeypatch, session, family):
    """panels.transplant sizes the transplant's panel and panels.conversation_transplant the conversation
    transplant's (the transplant once read the other's: 12 divergent rows and 2 controls instead of 24 and 8)."""
    session = dataclasses.replace(session, panels={})  # a copy of its own: its read is replaced, its panels kept
    panels = session.contract.panels
    sizes = {name: (panels[name]["divergent"], panels[name]["exact_controls"])
             for name in ("transplant", "conversation_transplant")}
    assert len(set(sizes.values())) == 2, f"the contract sizes both panels alike, so the test cannot tell: {sizes}"
    drawn = []
    module = {"transplant": transplant, "conversation_transplant": conversation_transplant}[family]
    monkeypatch.setattr(module, "panel", lambda records, cell, divergent, controls: drawn.append((divergent, controls)))
    monkeypatch.setattr(session, "read", lambda source, rows, cell: [])
    session.panel(family, "bf16")
    assert drawn == [sizes[family]], f"the {family} panel was drawn with {drawn}, not panels.{family} {sizes[family]}"


@pytest.mark.parametrize(("device", "worker", "gpus", "expected"), [
    pytest.param("cuda", "gw0", 4, "cuda:0", id="first-worker"),
    pytest.param("cuda", "gw5", 4, "cuda:1", id="restarted-worker-wraps"),
    pytest.param("cuda", None, 4, "cuda", id="no-xdist"),
    pytest.param("cuda:2", "gw1", 4, "cuda:2", id="explicit-index-kept"),
    pytest.param("cpu", "gw1", 4, "cpu", id="cpu"),
])
def test_each_xdist_worker_pins_one_gpu(monkeypatch, device, worker, gpus, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert pinned_device(device, worker) == expected


@pytest.mark.parametrize(("cell", "contract", "refreezes"), [
    pytest.param("bf16", "cpu-tiny.yaml", True, id="bank-precision-caps-and-cache"),
    pytest.param("fp32", "cpu-tiny.yaml", False, id="other-precision"),
    pytest.param("bf16", "cpu-tiny-static.yaml", False, id="other-cache-class"),
])
def test_live_generation_refreezes_only_the_bank_s_own_setting(cell, contract, refreezes, repo, opened_session):
    # The committed manifest predates the cache class: it was frozen with dynamic caches, and a static
    # cache alone changes BF16 live trajectories (README, Architectures), so no re-freeze is expected.
    replay = opened_session(repo / "contracts" / contract)
    assert replay.refreezes(cell) is refreezes, f"refreezes({cell}) under {contract}"


# ---------------------------------------------------------------------------------------------
# The weights that run are the weights verified when the run opened


def _copy_inputs(tmp_path):
    import shutil

    from replaytests.inputs.bank import manifest_path
    from replaytests.inputs.options import DEFAULT_BANK, DEFAULT_MODEL

    model, bank = tmp_path / "model", tmp_path / "bank.jsonl"
    shutil.copytree(DEFAULT_MODEL, model)
    shutil.copy(DEFAULT_BANK, bank)
    shutil.copy(manifest_path(DEFAULT_BANK), manifest_path(bank))
    return model, bank


def _rewrite_weights(model, scale: float) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(model / "model.safetensors")
    weights["model.norm.weight"].mul_(scale)
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("how", ["renamed-over", "rewritten-in-place"])
def test_weights_swapped_after_the_run_opened_are_refused_at_load(tmp_path, how):
    model, bank = _copy_inputs(tmp_path)
    replay = ReplaySession.open(Options(model=model, bank=bank, rows="1", baseline=None))
    if how == "renamed-over":
        other = tmp_path / "other"
        other.mkdir()
        (other / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes())
        _rewrite_weights(other, 1.5)
        (other / "model.safetensors").rename(model / "model.safetensors")
    else:
        _rewrite_weights(model, 1.5)
    with pytest.raises(ConfigError, match=r"/model: the model's files changed during this run \(sha256 \w{12}… when "
                                          r"it started, \w{12}… after loading\); refused"):
        replay.runtime("fp32")


def test_a_loaded_model_does_not_change_when_its_file_does(tmp_path):
    # The weights are copied out of the file's memory map at load: bytes overwritten in place later
    # (cp over the file) do not change the numbers of the model already running. Loaded at the file's
    # own dtype (bf16), where a map would otherwise be used as it is.
    from replaytests.engine.hf import adapter

    model, _ = _copy_inputs(tmp_path)
    loaded = adapter.load_model(model, "bfloat16", "cpu")
    before = {name: p.detach().clone() for name, p in loaded.named_parameters()}
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = bytes(b ^ 0xFF for b in data[header:])
    with weights.open("r+b") as handle:  # the same inode, rewritten: what a map sees
        handle.write(data)
    changed = [name for name, p in loaded.named_parameters() if not torch.equal(p, before[name])]
    assert not changed, f"parameters {changed[:3]} changed with the file after the model was loaded"


@pytest.mark.parametrize(("unserved", "skipped"), [
    pytest.param(set(), False, id="every-causal-family"),
    pytest.param({"transplant", "replication"}, False, id="the-conversation-transplant-alone"),
    pytest.param({"transplant", "replication", "conversation_transplant"}, True, id="none"),
])
def test_the_causal_cells_are_skipped_only_where_no_causal_family_can_run(unserved, skipped):
    """`causal_cell` was skipped with the transplant's reason wherever the transplant could not run: a backend that
    serves the conversation transplant and not the transplant would have skipped the conversation transplant's
    tests too. Each causal family's own tests skip with their own reason."""
    from types import SimpleNamespace

    from replaytests.suite import parameters

    replay = SimpleNamespace(unavailable=lambda family: "lacks x" if family in unserved else None,
                             causal_cells=("bf16",), skipped_cells={}, options=SimpleNamespace(precision="bf16"))
    found = parameters.causal_unavailable(replay)
    assert bool(found) == skipped and (not found or found[0].marks[0].kwargs["reason"] == "lacks x"), found
