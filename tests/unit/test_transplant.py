"""replaytests.engine.transplant (the seam's checks, each backend's copy) and the transplant family
(docs/protocol.md §7.5): provenance refusals, transplant mechanics, outcome classification, the minimal layer
range, the panel, and one row of each role."""

from __future__ import annotations

import random

import pytest
import torch
from test_report import comparison, record
from test_report import excluded as excluded_record

from replaytests.engine.boundary import bitwise_equal
from replaytests.engine.hf import adapter as hf_adapter
from replaytests.engine.transplant import transplant as checked
from replaytests.errors import StorageAliasing, TransplantInvalid, TransplantRefused
from replaytests.families import crossing
from replaytests.families import transplant as family
from replaytests.families.registry import DIRECTIONS, TRANSPLANTS, VALIDITY_PAIRS
from replaytests.inputs.blocks import PARTS
from replaytests.outputs import transplant_outcome
from replaytests.outputs.records import Record

# ---------------------------------------------------------------------------------------------
# Provenance refusals: fake boundaries, refused before any cache is built (so no model is needed).


@pytest.fixture
def layers(layers_factory):
    return layers_factory(n_layers=3, seq=5, seed=11)


def transplant(runtime, recipient, donor, layers=None, parts=PARTS):
    """runtime.transplant, or the seam's checks alone where there is no runtime (a refusal comes first)."""
    if runtime is None:
        return checked(recipient, donor, layers, parts, splice=None)
    return runtime.transplant(recipient, donor, layers, parts)


def _copies(layers):
    return [(k.clone(), v.clone()) for k, v in layers]


def _meta(layers):
    return [(torch.empty_like(k, device="meta"), torch.empty_like(v, device="meta")) for k, v in layers]


REFUSALS = [
    # (donor kwargs from the recipient and its layers, error type, message after "transplant prefill<-incremental: ")
    pytest.param(lambda r, L, make: dict(layers=make(n_layers=3, seq=6, seed=3), tokens=list(range(10, 16)),
                                         roles=[0] * 5 + [4]),
                 TransplantRefused, r"cache_seq_length differs: recipient 5 vs donor 6", id="different-lengths"),
    pytest.param(lambda r, L, make: dict(layers=[(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in L]),
                 TransplantRefused, r"layer 0 K dtype differs: recipient 'torch.float32' vs donor 'torch.bfloat16'",
                 id="different-dtypes"),
    pytest.param(lambda r, L, make: dict(layers=_copies(L[:2])), TransplantRefused,
                 r"layers differs: recipient 3 vs donor 2", id="different-layer-counts"),
    pytest.param(lambda r, L, make: dict(layers=[*_copies(L[:2]), (L[2][0].clone(), L[2][1])]), StorageAliasing,
                 r"incremental shares tensor storage with prefill \(data_ptr 0x[0-9a-f]+: incremental layer 2 V, "
                 r"prefill layer 2 V\)", id="shared-storage"),
    pytest.param(lambda r, L, make: dict(layers=_copies(L), logits=r.logits), StorageAliasing,
                 r"incremental shares tensor storage with prefill \(data_ptr 0x[0-9a-f]+: incremental logits, "
                 r"prefill logits\)", id="shared-logits-storage"),
    pytest.param(lambda r, L, make: dict(layers=_copies(L), tokens=[10, 11, 99, 13, 14]), TransplantRefused,
                 r"tokens differs: recipient \[10, 11, 12, 13, 14\] vs donor \[10, 11, 99, 13, 14\]", id="tokens"),
    pytest.param(lambda r, L, make: dict(layers=_copies(L), roles=[0, 0, 1, 0, 4]), TransplantRefused,
                 r"roles differs: recipient \[0, 0, 0, 0, 4\] vs donor \[0, 0, 1, 0, 4\]", id="roles"),
    pytest.param(lambda r, L, make: dict(layers=[*_copies(L[:1]), (L[1][0].clone(), L[1][1][:, :1].clone()),
                                                 *_copies(L[2:])]),
                 TransplantRefused, r"layer 1 V shape differs: recipient \(2, 2, 5, 4\) vs donor \(2, 1, 5, 4\)",
                 id="kv-heads-shape"),
    pytest.param(lambda r, L, make: dict(layers=[*_copies(L[:2]),
                                                 (L[2][0].transpose(2, 3).contiguous().transpose(2, 3),
                                                  L[2][1].clone())]),
                 TransplantRefused, r"layer 2 K stride differs: recipient \(40, 20, 4, 1\) vs donor \(40, 20, 1, 5\)",
                 id="stride"),
    pytest.param(lambda r, L, make: dict(layers=_meta(L)), TransplantRefused,
                 r"layer 0 K device differs: recipient 'cpu' vs donor 'meta'", id="device"),
]


@pytest.mark.parametrize(("donor_of", "error", "message"), REFUSALS)
def test_transplant_is_refused_naming_the_field(make_boundary, layers, layers_factory, donor_of, error, message):
    recipient = make_boundary("prefill", layers)
    donor = make_boundary("incremental", **donor_of(recipient, layers, layers_factory))
    with pytest.raises(error, match=rf"^transplant prefill<-incremental: {message}$") as info:
        transplant(None, recipient, donor)
    assert "\n" not in str(info.value), f"multi-line refusal: {info.value!s}"


@pytest.mark.parametrize(("recipient", "donor", "message"), [
    pytest.param("prefill", "prefill", r"source construction: recipient and donor are both 'prefill'",
                 id="same-construction"),
    pytest.param("prefill", "prefill<-incremental", r"source construction 'prefill<-incremental' is not one of "
                 r"live, incremental, prefill \(or a replica of one\)", id="donor-is-a-transplant"),
    pytest.param("decoded", "incremental", r"source construction 'decoded' is not one of", id="unknown-recipient"),
])
def test_transplant_checks_the_source_constructions(make_boundary, layers, recipient, donor, message):
    with pytest.raises(TransplantRefused, match=rf"^transplant {recipient}<-{donor}: {message}"):
        transplant(None, make_boundary(recipient, layers), make_boundary(donor, _copies(layers)))


@pytest.mark.parametrize(("selection", "message"), [
    pytest.param(dict(layers=[3]), r"layers \[3\] are not a non-empty subset of 0\.\.2", id="layer-out-of-range"),
    pytest.param(dict(layers=[]), r"layers \[\] are not a non-empty subset of 0\.\.2", id="no-layers"),
    pytest.param(dict(parts=("q",)), r"parts \('q',\) are not a non-empty subset of \('k', 'v'\)", id="unknown-part"),
    pytest.param(dict(parts=()), r"parts \(\) are not a non-empty subset of \('k', 'v'\)", id="no-parts"),
])
def test_transplant_checks_the_selection(make_boundary, layers, selection, message):
    recipient, donor = make_boundary("prefill", layers), make_boundary("incremental", _copies(layers))
    with pytest.raises(TransplantRefused, match=rf"^transplant prefill<-incremental: {message}$"):
        transplant(None, recipient, donor, **selection)


# ---------------------------------------------------------------------------------------------
# Mechanics on the tiny model's real BF16 boundaries (the shortest committed z).


@pytest.fixture(scope="module")
def pair(bf16_runtime, bank_rows):
    """Incremental and prefill boundaries of the shortest row whose BF16 caches differ on this platform
    (where every layer's K and V were equal, a transplant could not tell donor from recipient)."""
    from replaytests.engine.hf import constructions

    for row in sorted(bank_rows, key=lambda r: (r.prefix_len, r.id)):
        built = {c: constructions.build(bf16_runtime, c, row.tokens) for c in ("incremental", "prefill")}
        if not all(bitwise_equal(a, b) for kv_a, kv_b in zip(built["prefill"].layers, built["incremental"].layers,
                                                              strict=True) for a, b in zip(kv_a, kv_b, strict=True)):
            return built
    pytest.skip("incremental and prefill BF16 caches are bit-equal on every bank row on this platform")


SELECTIONS = [
    # (layers, parts, construction label)
    pytest.param(None, PARTS, "prefill<-incremental", id="all-layers-KV"),
    pytest.param(None, ("k",), "prefill<-incremental[K only]", id="K-only"),
    pytest.param(None, ("v",), "prefill<-incremental[V only]", id="V-only"),
    pytest.param(range(1, 3), PARTS, "prefill<-incremental[layers 1-2]", id="layers-1-2"),
    pytest.param([3], ("k",), "prefill<-incremental[K only; layers 3-3]", id="K-only-layer-3"),
    pytest.param([0, 2], ("v",), "prefill<-incremental[V only; layers 0,2]", id="V-only-layers-0-and-2"),
]


@pytest.mark.parametrize(("layers", "parts", "label"), SELECTIONS)
def test_transplant_copies_exactly_the_selected_tensors(bf16_runtime, pair, layers, parts, label):
    recipient, donor = pair["prefill"], pair["incremental"]
    result = transplant(bf16_runtime, recipient, donor, layers, parts)
    assert result.construction == label, f"label {result.construction!r}, expected {label!r}"
    assert (result.tokens, result.roles) == (recipient.tokens, recipient.roles), "tokens/roles are not the recipient's"
    assert bitwise_equal(result.logits, recipient.logits), "boundary logits are not the recipient's own"
    chosen = range(len(recipient.layers)) if layers is None else layers
    for index, kv in enumerate(result.layers):
        for part, tensor in zip(PARTS, kv, strict=True):
            source = donor if index in chosen and part in parts else recipient
            assert bitwise_equal(tensor, source.layers[index][PARTS.index(part)]), (
                f"layer {index} {part.upper()} is not the {source.construction}'s")
    assert not result.storages() & (recipient.storages() | donor.storages()), "result shares storage with an input"


def test_result_aliasing_the_donor_is_refused(bf16_runtime, pair, monkeypatch, fake_cache):
    # An adapter that hands back the donor's tensors instead of copies.
    monkeypatch.setattr(hf_adapter, "cache_from_layers", lambda model, layers, like: fake_cache(layers))
    with pytest.raises(StorageAliasing, match=r"^transplant prefill<-incremental \(prefill<-incremental\): "
                                              r"prefill<-incremental shares tensor storage with incremental"):
        transplant(bf16_runtime, pair["prefill"], pair["incremental"])


def test_result_that_is_not_a_bit_copy_is_refused(bf16_runtime, pair, monkeypatch, fake_cache):
    def lossy(model, layers, like):
        (k, v), *rest = layers
        return fake_cache([(k.clone().add_(0.5), v.clone()), *((a.clone(), b.clone()) for a, b in rest)])

    monkeypatch.setattr(hf_adapter, "cache_from_layers", lossy)
    with pytest.raises(TransplantRefused, match=r": layer 0 K is not a bit-exact copy of the incremental donor$"):
        transplant(bf16_runtime, pair["prefill"], pair["incremental"])


# ---------------------------------------------------------------------------------------------
# Outcome classification and the minimal layer range (pure functions).


@pytest.mark.parametrize(("suffix", "donor", "own", "expected"), [
    pytest.param([1, 2, 3], [1, 2, 3], [1, 9, 9], ("follows_donor", None, 1), id="follows-donor"),
    pytest.param([1, 9, 9], [1, 2, 3], [1, 9, 9], ("keeps_own", 1, None), id="keeps-own"),
    pytest.param([1, 2, 7], [1, 2, 3], [1, 9, 9], ("third", 2, 1), id="third"),
    pytest.param([1, 2], [1, 2, 3], [1, 9, 9], ("third", 2, 1), id="third-shorter"),
    pytest.param([4, 5], [4, 5], [4, 5], ("follows_donor", None, None), id="control-matches-both"),
    pytest.param([4, 6], [4, 5], [4, 5], ("third", 1, 1), id="control-third"),
])
def test_outcome(suffix, donor, own, expected):
    result = family.outcome(suffix, donor, own)
    found = (result["outcome"], result["first_divergence_vs_donor"], result["first_divergence_vs_own"])
    assert found == expected, f"outcome of {suffix} (donor {donor}, own {own}): {found}, expected {expected}"


def covering(*needed: int):
    """A stand-in transplant: follows the donor iff the range covers every layer in `needed`."""
    return lambda lo, hi: all(lo <= i <= hi for i in needed)


@pytest.mark.parametrize(("follows", "n_layers", "expected"), [
    pytest.param(covering(2), 4, ([2, 2], "exhaustive"), id="4-layers-one-layer"),
    pytest.param(covering(1, 2), 4, ([1, 2], "exhaustive"), id="4-layers-two-layers"),
    pytest.param(lambda lo, hi: (lo, hi) in {(0, 1), (2, 3), (1, 2)}, 4, ([0, 1], "exhaustive"),
                 id="4-layers-lowest-of-the-narrowest"),
    pytest.param(covering(0, 3), 4, (None, "exhaustive"), id="4-layers-only-all"),
    pytest.param(covering(10, 13), 48, ([10, 13], "bisection"), id="48-layers-bisection"),
    pytest.param(covering(47), 48, ([47, 47], "bisection"), id="48-layers-last-layer"),
    pytest.param(covering(0, 47), 48, (None, "bisection"), id="48-layers-only-all"),
    pytest.param(lambda lo, hi: False, 48, (None, "bisection"), id="48-layers-nothing-suffices"),
])
def test_minimal_range(follows, n_layers, expected):
    calls = []
    found = family.minimal_range(lambda lo, hi: calls.append((lo, hi)) or follows(lo, hi), n_layers)
    assert found == expected, f"minimal range over {n_layers} layers: {found}, expected {expected}"
    if n_layers > family.EXHAUSTIVE_MAX_LAYERS:
        assert len(calls) <= 2 * n_layers.bit_length(), f"bisection made {len(calls)} transplants: {calls}"


# ---------------------------------------------------------------------------------------------
# The panel: selected from finished BF16 crossing records alone.


def crossing_record(row: str, prefix_len: int, suffix_equal: bool, argmax_equal: bool = True,
                    cache_exact: bool = False, first_token_equal: bool = True, **fields) -> Record:
    pair = comparison(cache_exact=cache_exact, suffix_equal=suffix_equal,
                      first_divergence=None if suffix_equal else 3) | {"argmax_equal": argmax_equal,
                                                                       "first_token_equal": first_token_equal}
    return Record.of(record("crossing", row, "bf16", {"incremental~prefill": pair}, prefix_len=prefix_len) | fields)


def test_panel_splits_divergent_not_testable_and_controls():
    records = [crossing_record("d1", 300, False), crossing_record("d0", 100, False),
               crossing_record("nt", 200, False, argmax_equal=False, first_token_equal=False),
               crossing_record("c0", 150, True), crossing_record("c1", 120, True, cache_exact=True)]
    found = family.panel(records, "bf16", divergent=24, controls=8)
    assert found.rows == [("d0", "divergent"), ("d1", "divergent"), ("c1", "control"), ("c0", "control")], found
    assert found.not_testable == [("nt", "first suffix tokens differ (raw boundary argmax different too): a "
                                         "transplant cannot move that choice")], found


@pytest.mark.parametrize(("argmax_equal", "first_token_equal", "testable"), [
    pytest.param(True, True, True, id="first-tokens-agree"),
    pytest.param(True, False, False, id="raw-argmax-agrees-masked-choice-differs"),
    pytest.param(False, True, True, id="raw-argmax-differs-masked-choice-agrees"),
    pytest.param(False, False, False, id="both-differ"),
])
def test_testability_is_judged_on_the_first_suffix_token(argmax_equal, first_token_equal, testable):
    """A transplant moves the cache, not the recipient's own boundary logits: what decides is the
    structurally masked first choice, not the raw argmax (which may be a token the mask forbids)."""
    record = crossing_record("d", 100, False, argmax_equal=argmax_equal, first_token_equal=first_token_equal)
    found = family.panel([record], "bf16")
    assert (found.rows == [("d", "divergent")]) == testable, found
    assert bool(found.not_testable) != testable, found


def test_panel_prefers_cache_exact_controls():
    records = [crossing_record(f"s{i}", 100 + i, True) for i in range(5)]
    records += [crossing_record("x0", 500, True, cache_exact=True), crossing_record("x1", 50, True, cache_exact=True)]
    chosen = [row for row, _ in family.panel(records, "bf16", divergent=0, controls=3).rows]
    assert {"x0", "x1"} <= set(chosen) and len(chosen) == 3, f"controls {chosen}: the two cache-exact rows first"


def test_panel_spaces_rows_by_prefix_length_and_ignores_order():
    records = [crossing_record(f"r{i:02d}", 100 + 10 * i, False) for i in range(30)]
    chosen = family.panel(records, "bf16", divergent=4, controls=0).rows
    assert chosen == [("r00", "divergent"), ("r10", "divergent"), ("r19", "divergent"), ("r29", "divergent")], chosen
    shuffled = random.Random(0).sample(records, len(records))
    assert family.panel(shuffled, "bf16", divergent=4, controls=0).rows == chosen, "selection depends on record order"


@pytest.mark.parametrize("other", [
    pytest.param(dict(precision="fp32"), id="fp32"),
    pytest.param(dict(status="excluded", reason="BoundaryMismatch: x"), id="excluded"),
    pytest.param(dict(family="bridge"), id="bridge"),
])
def test_panel_reads_finished_bf16_crossing_records_only(other):
    records = [crossing_record("keep", 100, False), crossing_record("drop", 200, False, **other)]
    assert family.panel(records, "bf16").rows == [("keep", "divergent")], f"a {other} record was selected"


# ---------------------------------------------------------------------------------------------
# One row of each role on the embedded default at BF16, found on this platform (conftest.find_row).


@pytest.fixture(scope="module")
def crossing_records(bf16_runtime, divergent_row, exact_row) -> dict[str, Record]:
    return {"divergent": crossing.run(bf16_runtime, divergent_row), "control": crossing.run(bf16_runtime, exact_row)}


@pytest.fixture(scope="module")
def divergent_record(bf16_runtime, divergent_row, crossing_records) -> Record:
    return family.run(bf16_runtime, divergent_row, crossing_records["divergent"], "divergent")


def test_divergent_row_follows_its_donor_both_ways(crossing_records, divergent_record, divergent_row):
    assert not crossing_records["divergent"].comparisons["incremental~prefill"].suffix_equal, (
        f"{divergent_row.id} diverged in the search but not in its crossing record")
    assert divergent_record.ok, divergent_record.reason
    outcomes = {name: t.outcome for name, t in divergent_record.transplants.items()}
    assert outcomes == dict.fromkeys(TRANSPLANTS, "follows_donor"), f"{divergent_row.id} transplants: {outcomes}"


@pytest.mark.parametrize("role", ["divergent", "control"])
def test_validity_control_reproduces_each_construction(bf16_runtime, divergent_row, exact_row, crossing_records,
                                                       divergent_record, role):
    record = divergent_record if role == "divergent" else family.run(bf16_runtime, exact_row,
                                                                     crossing_records["control"], "control")
    assert record.ok, record.reason
    for name, own in VALIDITY_PAIRS:
        metrics = record.comparisons[f"{name}~{own}"]
        assert metrics.cache_exact and metrics.suffix_equal, f"{record.row} {name} vs {own}: {metrics}"
        assert record.arms[name].cache_digest == record.arms[own].cache_digest, (
            f"{name}: the self-transplanted cache is not {own}'s")


def test_a_self_transplant_that_diverges_fails_closed():
    """Where decoding is not a function of the cache values alone, the control fails the row closed."""
    broken = {"suffix_equal": False, "first_divergence": 4, "cache_exact": True, "logits_exact": True}
    comparisons = {f"{name}~{own}": {"suffix_equal": True} for name, own in VALIDITY_PAIRS}
    comparisons["prefill_replica<-prefill~prefill"] = broken
    with pytest.raises(TransplantInvalid, match=r"^row x: transplant invalid here: decoding is not a function of the "
                                                r"cache values alone: prefill's cache copied into its replica "
                                                r"\(prefill_replica<-prefill\) diverges from prefill's own suffix at "
                                                r"index 4 \(cache bit-exact, boundary logits bit-equal\)$"):
        family.check_valid(comparisons, "row x")


def test_transplanted_cache_is_the_donors_and_logits_the_recipients(divergent_record):
    for recipient, donor in DIRECTIONS:
        name = f"{recipient}<-{donor}"
        metrics = divergent_record.comparisons[f"{name}~{donor}"]
        assert metrics.cache_exact, f"{name}: cache differs from the {donor} donor's"
        arms = divergent_record.arms
        assert arms[name].logits_digest == arms[recipient].logits_digest, (
            f"{name}: boundary logits are not the {recipient} recipient's own")


def test_divergent_row_reports_parts_and_minimal_layers(divergent_record):
    assert divergent_record.layer_search == "exhaustive", divergent_record.layer_search
    for name in TRANSPLANTS:
        assert {p: divergent_record.parts[p][name].outcome for p in family.PARTIAL}.keys() == {"k_only", "v_only"}
        minimal = divergent_record.minimal_layers[name]
        assert minimal is None or (0 <= minimal[0] <= minimal[1] < 4 and minimal != (0, 3)), f"{name}: {minimal}"
        tried = divergent_record.layer_ranges[name]
        assert tried and (minimal is None or tried[-1] == (*minimal, "follows_donor")), f"{name}: tried {tried}"


def test_control_row_has_no_third_trajectory(bf16_runtime, exact_row, crossing_records):
    record = family.run(bf16_runtime, exact_row, crossing_records["control"], "control")
    assert record.ok, record.reason
    found = {name: t.outcome for name, t in record.transplants.items()}
    found |= {f"{p} {name}": record.parts[p][name].outcome for p in family.PARTIAL for name in TRANSPLANTS}
    assert set(found.values()) == {"follows_donor"}, f"control {exact_row.id} outcomes: {found}"
    assert record.minimal_layers is None, "controls are not searched"


WRONG_RECORD = "expected the ok crossing record of this row and cell, got "


def _tamper(record: Record, arm: str, field: str, value) -> Record:
    line = record.to_json()
    return Record.of(line | {"arms": line["arms"] | {arm: line["arms"][arm] | {field: value}}})


def _changed(record: Record, **fields) -> Record:
    return Record.of(record.to_json() | fields)


@pytest.mark.parametrize(("tamper", "message"), [
    pytest.param(lambda r: _tamper(r, "incremental", "cache_digest", "0" * 64),
                 "rebuilt incremental cache_digest differs from the crossing record", id="cache-digest"),
    pytest.param(lambda r: _tamper(r, "prefill", "logits_digest", "0" * 64),
                 "rebuilt prefill logits_digest differs from the crossing record", id="logits-digest"),
    pytest.param(lambda r: _tamper(r, "prefill", "suffix", list(r.arms["prefill"].suffix[:-1])),
                 "rebuilt prefill suffix differs from the crossing record", id="suffix"),
    pytest.param(lambda r: _changed(r, row="other"), f"{WRONG_RECORD}crossing/other/bf16/ok", id="another-row"),
    pytest.param(lambda r: _changed(r, precision="fp32"), f"{WRONG_RECORD}crossing/ROW/fp32/ok",
                 id="another-precision"),
    pytest.param(lambda r: _changed(r, status="excluded", reason="x"), f"{WRONG_RECORD}crossing/ROW/bf16/excluded",
                 id="excluded-crossing"),
    pytest.param(lambda r: _tamper(r, "prefill_replica", "suffix", []),
                 "rebuilt prefill_replica suffix differs from the crossing record", id="replica-suffix"),
])
def test_a_crossing_that_does_not_reproduce_excludes_the_row(bf16_runtime, exact_row, crossing_records, tamper,
                                                             message):
    record = family.run(bf16_runtime, exact_row, tamper(crossing_records["control"]), "control")
    assert not record.ok, "a tampered crossing record was accepted as contemporaneous"
    expected = (f"NotContemporaneous: transplant row {exact_row.id} (bf16): not contemporaneous: "
                f"{message.replace('ROW', exact_row.id)}")
    assert record.reason == expected, f"reason {record.reason!r}, expected {expected!r}"


def test_unknown_role_is_an_error(bf16_runtime, exact_row, crossing_records):
    with pytest.raises(ValueError, match=r"role must be one of \('divergent', 'control'\), got 'exact'"):
        family.run(bf16_runtime, exact_row, crossing_records["control"], "exact")


# ---------------------------------------------------------------------------------------------
# summarize


def test_summarize_counts_outcomes_and_layer_ranges(divergent_record):
    third = family.outcome([9], [1], [1])
    control = Record.of(record("transplant", "r8", "bf16", {"incremental~prefill": comparison()}, role="control",
                               layers=4, transplants=dict.fromkeys(TRANSPLANTS, third),
                               parts={p: dict.fromkeys(TRANSPLANTS, third | {"cache_digest": "c", "suffix": [9]})
                                      for p in family.PARTIAL}))
    invalid = "TransplantInvalid: transplant row r9 (bf16): transplant invalid here: ..."
    excluded = Record.of(excluded_record("transplant", "r9", "bf16", invalid) | {"role": "divergent"})
    crossing = Record.of(record("crossing", "r0", "fp32", {"incremental~prefill": comparison()}))
    summary = transplant_outcome.summarize([divergent_record, control, excluded, crossing], "transplant")
    assert (summary.rows, summary.excluded, summary.divergent, summary.controls) == (3, 1, 1, 1), summary
    reproduced = summary.validity.reproduced
    assert ((reproduced.k, reproduced.n), summary.validity.invalid) == ((1, 1), ("r9",)), summary.validity
    for name in TRANSPLANTS:
        follows, third_rate = summary.full[name]["follows_donor"], summary.full[name]["control_third"]
        assert (follows.k, follows.n, third_rate.k, third_rate.n) == (1, 1, 1, 1), summary.full[name]
        minimal = divergent_record.minimal_layers[name]
        key = "none" if minimal is None else f"{minimal[0]}-{minimal[1]}"
        assert summary.minimal_layers[name] == {key: 1}, summary.minimal_layers[name]
        assert len(summary.layer_frequency[name]) == 4, summary.layer_frequency[name]
