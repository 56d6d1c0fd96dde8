"""Gate levels, localization and known changes of `replaytests compare`.

Records are hand-built as in test_compare (no model), except the localization on the real tiny model:
one layer's K projection perturbed, and that layer is named as the first that moved.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_compare import compare, diverging, make, run
from test_report import typed

from replaytests.cli import main
from replaytests.engine.arms import Arms
from replaytests.errors import ConfigError
from replaytests.outputs import localization
from replaytests.outputs.expected import Expected
from replaytests.outputs.localization import first_moved
from replaytests.outputs.records import LayerDigests


def lines(baseline: list[dict], new: list[dict]) -> list[str]:
    """Localization of hand-built records (ledger lines), read as the ledger's reader reads them."""
    return localization.lines(typed(baseline), typed(new))


def _at(records: list[dict], family: str, row: str, precision: str) -> dict:
    return next(r for r in records if (r["family"], r["row"], r["precision"]) == (family, row, precision))


def bits_only(records: list[dict], precision: str = "fp32", layer: int = 1) -> list[dict]:
    """The records with every `precision` arm's cache moved from `layer` on (K and V) and its logits moved:
    what a new kernel does to numbers that change no choice."""
    out = copy.deepcopy(records)
    for record in out:
        if record["precision"] != precision:
            continue
        for arm in record["arms"].values():
            arm["cache_digest"], arm["logits_digest"] = "d" * 64, "e" * 64
            for part in "kv":
                arm["layer_digests"][part][layer:] = ["f" * 16] * (len(arm["layer_digests"][part]) - layer)
        for metrics in record["comparisons"].values():
            metrics["k_rel_l2"] = metrics["v_rel_l2"] = 1e-7
    return out


def with_suffix_changed(records: list[dict], row: str = "r1") -> list[dict]:
    out = copy.deepcopy(records)
    _at(out, "crossing", row, "bf16")["arms"]["prefill"]["suffix"] = [1, 9]
    return out


@pytest.mark.parametrize(("gate", "passes"), [("bits", False), ("trajectories", True), ("rates", True)])
def test_a_bits_only_change_fails_bits_and_passes_coarser_gates(gate, passes):
    result = compare(run(), bits_only(run()), gate=gate)
    assert result.passed == passes, f"--gate {gate}: {result.reasons}"
    first = result.text().splitlines()[0]
    allowed = "" if gate == "bits" else ", allowed at this gate"
    assert first == (f"{'PASS' if passes else 'FAIL: 4 reasons'} at --gate {gate}: bits changed (4 records{allowed}); "
                     "trajectories held; rates held"), first


@pytest.mark.parametrize(("gate", "passes"), [("bits", False), ("trajectories", False), ("rates", True)])
def test_a_changed_suffix_fails_trajectories(gate, passes):
    result = compare(run(), with_suffix_changed(run()), gate=gate)
    assert result.passed == passes, f"--gate {gate}: {result.reasons}"
    if not passes:
        assert result.reasons == ["trajectory changed: crossing/r1/bf16: arms.prefill.suffix[1]: baseline 2, now 9"], \
            result.reasons
    assert "trajectories changed (1 record" in result.text().splitlines()[0]


def test_a_significant_rate_change_fails_rates():
    baseline, new = diverging("crossing", 20, 0), diverging("crossing", 20, 10)
    result = compare(baseline, new, gate="rates")
    assert [r for r in result.reasons if r.startswith("divergence rate changed beyond chance: crossing/bf16")], \
        result.reasons
    assert all(r.startswith("divergence rate changed") for r in result.reasons), result.reasons
    within = compare(baseline, diverging("crossing", 20, 2), gate="rates")
    assert within.passed, f"0/20 -> 2/20 is within chance at --gate rates: {within.reasons}"


@pytest.mark.parametrize("gate", ["bits", "trajectories", "rates"])
def test_an_fp32_divergence_fails_at_every_gate(gate):
    """A headline FP32 divergence in the new run fails even where the baseline had it too (no change)."""
    records = [r for r in run() if (r["family"], r["row"], r["precision"]) != ("crossing", "r0", "fp32")]
    records.append(make("crossing", "r0", "fp32", suffix_equal=False, first_divergence=3))
    result = compare(records, records, gate=gate)
    assert result.reasons == ["fp32 divergence: crossing/r0/fp32 incremental~prefill suffixes diverge at suffix "
                              "index 3 (gate crossing.suffix_divergence_allowed.fp32: false)"], result.reasons


def test_a_contract_that_allows_fp32_divergence_lets_it_pass(regated):
    from replaytests.inputs.contract import default_gates

    allowing = regated(default_gates(), "crossing", suffix_divergence_allowed={"bf16": True, "fp32": True})
    records = [make("crossing", "r0", "fp32", suffix_equal=False, first_divergence=3)]
    assert compare(records, records, gates=allowing).passed


def test_localization_names_the_first_layer_that_moved_per_precision_and_construction():
    moved = lines(run(), bits_only(run(), layer=1))
    assert moved[0] == "bf16: bit-identical (40 arms in 3 constructions)", moved[0]
    assert moved[1] == ("fp32: every construction's cache moved, first at layer 1 (K and V); the logits moved; "
                        "no suffix moved: a numerical change, no behavioural change"), moved[1]
    assert "fp32 incremental: cache moved in 8/8 (first at layer 1 (K and V): 8); logits moved in 8/8; suffix moved " \
           "in 0/8" in moved, moved


def test_localization_of_a_changed_suffix_is_a_behavioural_change():
    moved = lines(run(), with_suffix_changed(run()))
    assert moved[0] == ("bf16: no cache moved; the logits held; suffixes moved in 1/40 arms: a behavioural change"), \
        moved[0]


def test_localization_against_a_ledger_without_per_layer_digests_says_unknown():
    old = copy.deepcopy(run())
    for record in old:  # as ledger/2 wrote them: before per-layer digests (3), margins (4) and cell digests (5)
        record["schema"] = "replaytests.ledger/2"
        del record["cell_digest"]
        for arm in record["arms"].values():
            del arm["layer_digests"], arm["margins"]
        for metrics in record["comparisons"].values():
            del metrics["top1_at_divergence"]
    moved = lines(old, bits_only(run()))
    assert moved[1].startswith("fp32: every construction's cache moved, first at unknown (a ledger without "
                               "per-layer digests)"), moved[1]


@pytest.mark.parametrize(("layer", "part"), [(0, "K"), (2, "K"), (3, "V")])
def test_a_perturbed_layer_of_the_real_model_is_the_first_that_moved(fp32_runtime, shortest_z, layer, part):
    """Scaling one layer's K (or V) projection changes that layer's K (or V) first: every earlier layer's
    digests are unchanged, and the layer is named with the part that moved."""
    def digests() -> LayerDigests:
        fp32_runtime.arms = Arms()  # built anew, never the arm held from the build before
        return LayerDigests.from_json(fp32_runtime.build("prefill", shortest_z).fingerprint()[1])

    projection = getattr(fp32_runtime.model.model.layers[layer].self_attn, f"{part.lower()}_proj").weight
    before, saved = digests(), projection.detach().clone()
    try:
        with torch.no_grad():
            projection.mul_(1.001)
        after = digests()
    finally:
        with torch.no_grad():
            projection.copy_(saved)
    assert digests() == before, "the weights were not restored"
    assert first_moved(before, after) == (layer, part), (
        f"perturbed layer {layer} {part}: first moved {first_moved(before, after)}")


def write_expected(tmp_path, text: str):
    path = tmp_path / "expected.yaml"
    path.write_text(text, encoding="utf-8")
    return path


KNOWN = """schema: replaytests.expected/1
changes:
  - family: crossing
    precision: fp32
    level: bits
    why: a new FP32 kernel
"""


def test_a_known_change_passes_and_a_new_one_fails(tmp_path):
    expected = Expected.load(write_expected(tmp_path, KNOWN))
    new = bits_only(run())
    result = compare(run(), new, expected=expected)
    assert result.passed, result.reasons
    assert any(n.endswith("(expected: crossing/fp32 may change at bits: a new FP32 kernel)") for n in result.notes)
    assert result.text().startswith("PASS at --gate bits: bits changed (4 records, 4 expected); "), result.text()[:200]
    live_fp32 = [*new, make("live", "r0", "fp32")]
    result = compare([*run(), make("live", "r0", "fp32")], bits_only(live_fp32), expected=expected)
    assert [r for r in result.reasons if r.startswith("changed: live/r0/fp32")], result.reasons
    moved = compare(run(), with_suffix_changed(bits_only(run()), "r1"), expected=expected)
    assert [r for r in moved.reasons if r.startswith("trajectory changed: crossing/r1/bf16")], moved.reasons


def test_a_known_change_that_no_longer_occurs_fails_as_improved(tmp_path):
    path = write_expected(tmp_path, KNOWN)
    result = compare(run(), run(), expected=Expected.load(path))
    assert result.reasons == [f"improved: crossing/fp32 no longer changes at bits ({path}: crossing/fp32 may change "
                              "at bits: a new FP32 kernel); narrow or remove the entry"], result.reasons


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("schema: x\nchanges: []\n", "field 'schema' is 'x', expected 'replaytests.expected/1'", id="schema"),
    pytest.param("schema: replaytests.expected/1\nchanges: []\n", "expected the fields 'schema' and 'changes'",
                 id="no-changes"),
    pytest.param(KNOWN.replace("level: bits", "level: leaves"),
                 "changes[0]: field 'level' is 'leaves', expected one of bits, trajectories, rates", id="level"),
    pytest.param(KNOWN.replace("precision: fp32", "precision: FP 16"),
                 "changes[0]: field 'precision' is 'FP 16', expected a cell name", id="precision"),
    pytest.param(KNOWN.replace("    why: a new FP32 kernel\n", ""), "changes[0]: expected exactly the fields",
                 id="no-why"),
    pytest.param(KNOWN + KNOWN.split("changes:\n")[1], "changes[1]: crossing/fp32 is listed twice", id="twice"),
])
def test_a_bad_expected_state_file_is_one_line(tmp_path, text, message):
    path = write_expected(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        Expected.load(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value), str(error.value)


def test_cli_gate_levels_and_the_old_spelling(tmp_path, capsys):
    from test_report import write_ledger_file

    base = write_ledger_file(tmp_path / "base" / "ledger.jsonl", run())
    new = write_ledger_file(tmp_path / "new" / "ledger.jsonl", bits_only(run()))
    assert main(["compare", str(base), str(new)]) == 1
    assert main(["compare", str(base), str(new), "--gate", "trajectories"]) == 0
    assert main(["compare", str(base), str(new), "--allow-changes"]) == 0, "--allow-changes is --gate rates"
    out = capsys.readouterr().out
    assert "PASS at --gate rates: bits changed (4 records, allowed at this gate)" in out, out
    assert main(["compare", str(base), str(new), "--allow-changes", "--gate", "bits"]) == 4
    assert "--allow-changes is the old spelling of --gate rates" in capsys.readouterr().err


@pytest.mark.parametrize(("gate", "elsewhere", "divergent", "failures"), [
    pytest.param("rates", False, 10, 1, id="rates-beyond-chance-fails-the-run"),
    pytest.param("rates", False, 2, 0, id="rates-within-chance"),
    pytest.param("trajectories", True, 10, 0, id="other-gates-judge-per-record"),
    pytest.param(None, True, 10, 1, id="baseline-of-another-platform-judged-by-rates"),
    pytest.param(None, False, 10, 0, id="baseline-of-this-platform-judged-bit-for-bit"),
])
def test_a_run_at_gate_rates_checks_the_rates_at_the_end(gate, elsewhere, divergent, failures):
    """The controller's rates check of a run under --gate rates, or against a baseline made on another
    platform (suite/baseline.baseline_rates)."""
    from types import SimpleNamespace

    from replaytests.inputs.contract import default_gates
    from replaytests.suite.baseline import baseline_rates

    baseline = typed(diverging("crossing", 20, 0))
    replay = SimpleNamespace(options=SimpleNamespace(gate=gate), baseline=baseline, contract=SimpleNamespace(
        gates=default_gates()), plan=SimpleNamespace(audited=lambda records: records),
        baseline_platform=["hardware.cpu Intel (baseline) vs AMD (here)"] if elsewhere else [])
    found, drift = baseline_rates(replay, typed(diverging("crossing", 20, divergent)))
    assert len(found) == failures and not drift, (found, drift)
    assert all(f.check == "baseline rates" and f.message.startswith("divergence rate changed beyond chance: "
                                                                         "crossing/bf16") for f in found), found


@pytest.mark.parametrize("family", ["crosing", "serving"], ids=["typo", "family-no-run-holds"])
def test_an_expected_entry_that_can_match_nothing_fails(tmp_path, family):
    path = write_expected(tmp_path, KNOWN + KNOWN.split("changes:\n")[1].replace("crossing", family))
    result = compare(run(), bits_only(run()), expected=Expected.load(path))
    unmatched = [r for r in result.reasons if r.startswith("unmatched: ")]
    assert len(unmatched) == 1 and f"{family}/fp32 is not a family and cell both runs hold" in unmatched[0], \
        result.reasons
    assert not [r for r in result.reasons if not r.startswith("unmatched: ")], "the matching entry stopped accepting"


@pytest.mark.parametrize(("level", "cell", "elsewhere", "outcome"), [
    pytest.param("bits", "fp32", True, "recorded", id="bits-elsewhere-are-drift"),
    pytest.param("trajectories", "fp32", True, "fail", id="exact-cell-trajectory-elsewhere-fails"),
    pytest.param("trajectories", "bf16", True, "recorded", id="divergent-cell-trajectory-elsewhere-is-counted"),
    pytest.param("bits", "fp32", False, "fail", id="bits-here-fail"),
    pytest.param("trajectories", "bf16", False, "fail", id="trajectory-here-fails"),
])
def test_a_baseline_of_another_platform_is_judged_by_trajectories(repo, level, cell, elsewhere, outcome):
    """Across CPUs (or GPUs) only bits are platform drift: an FP32 trajectory must still match its baseline."""
    from types import SimpleNamespace

    from replaytests.inputs.contract import load_contract
    from replaytests.suite.baseline import judge_against_baseline

    replay = SimpleNamespace(options=SimpleNamespace(gate=None, strict_contract=False),
                             contract=load_contract(repo / "contracts" / "cpu-tiny.yaml"),
                             baseline_platform=["hardware.cpu Intel (baseline) vs AMD (here)"] if elsewhere else [])
    judged = judge_against_baseline(replay, "crossing row r0: suffix changed", level, cell)
    assert judged.outcome == outcome, judged
