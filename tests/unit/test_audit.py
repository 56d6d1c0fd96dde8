"""The ledger audit's comparison: every scalar leaf, exact, with the most telling change first."""

import copy

import pytest

from replaytests.outputs.audit import compare_leaves, leaves

RECORD = {
    "schema": "replaytests.ledger/1", "family": "crossing", "row": "r-1", "precision": "bf16", "status": "ok",
    "arms": {"prefill": {"suffix": [5, 6, 7], "answer": "42", "cache_digest": "aa", "logits_digest": "bb"}},
    "comparisons": {"incremental~prefill": {"k_rel_l2": 0.001, "suffix_equal": True}},
}


def changed(path: str, value):
    """A copy of RECORD with the leaf at a dotted path (list items as [i]) replaced."""
    record = copy.deepcopy(RECORD)
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node = record
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return record


def test_identical_records_reproduce():
    result = compare_leaves(RECORD, RECORD)
    assert result.reproduced and result.leaves == len(list(leaves(RECORD))) == 13, result


@pytest.mark.parametrize(("path", "value"), [
    pytest.param("arms.prefill.cache_digest", "cc", id="digest"),
    pytest.param("arms.prefill.suffix[1]", 9, id="suffix-token"),
    pytest.param("comparisons.incremental~prefill.k_rel_l2", 0.0010000000000000002, id="float-last-bit"),
    pytest.param("comparisons.incremental~prefill.k_rel_l2", 1, id="float-vs-int"),
    pytest.param("comparisons.incremental~prefill.suffix_equal", 1, id="bool-vs-int"),
])
def test_one_changed_leaf_is_named(path, value):
    result = compare_leaves(RECORD, changed(path, value))
    assert [c.path for c in result.changes] == [path], f"changes {result.changes}"


def test_fingerprints_are_named_before_trajectories_and_metrics():
    current = changed("arms.prefill.suffix[2]", 8)
    current["arms"]["prefill"]["cache_digest"] = "cc"
    current["comparisons"]["incremental~prefill"]["suffix_equal"] = False
    result = compare_leaves(RECORD, current)
    assert [c.path for c in result.changes] == [
        "arms.prefill.cache_digest", "arms.prefill.suffix[2]", "comparisons.incremental~prefill.suffix_equal"]
    assert str(result.changes[0]) == 'arms.prefill.cache_digest: baseline "aa", now "cc"'


def test_a_longer_suffix_is_a_change_at_the_new_index():
    result = compare_leaves(RECORD, changed("arms.prefill.suffix", [5, 6, 7, 8]))
    assert [str(c) for c in result.changes] == ["arms.prefill.suffix[3]: baseline (absent), now 8"]


def test_a_baseline_of_an_earlier_schema_is_audited_on_its_own_leaves():
    """Fields a later ledger schema added are not changes; every leaf the old record has still counts."""
    current = changed("schema", "replaytests.ledger/2")
    current["comparisons"]["incremental~prefill"]["first_token_equal"] = True
    result = compare_leaves(RECORD, current)
    assert result.reproduced and result.leaves == 12, result
    current["arms"]["prefill"]["answer"] = "41"
    assert [c.path for c in compare_leaves(RECORD, current).changes] == ["arms.prefill.answer"]


def test_a_field_absent_from_a_baseline_of_the_same_schema_is_a_change():
    current = changed("comparisons.incremental~prefill.suffix_equal", True)
    current["comparisons"]["incremental~prefill"]["first_token_equal"] = True
    assert [str(c) for c in compare_leaves(RECORD, current).changes] == [
        "comparisons.incremental~prefill.first_token_equal: baseline (absent), now true"]


@pytest.mark.parametrize(("field", "value", "trajectory"), [
    pytest.param("logits_exact", False, False, id="logits-exact"),
    pytest.param("argmax_equal", False, False, id="argmax-equal"),
    pytest.param("cache_exact", False, False, id="cache-exact"),
    pytest.param("stored_exact", False, False, id="stored-exact"),
    pytest.param("k_rel_l2", 0.5, False, id="k-rel-l2"),
    pytest.param("suffix_equal", False, True, id="suffix-equal"),
])
def test_only_what_a_trajectory_is_counts_as_one(field, value, trajectory):
    """Bits (digests, exactness flags, distances) changing alone is not a changed trajectory; a suffix is."""
    current = changed(f"comparisons.incremental~prefill.{field}", value)
    result = compare_leaves(RECORD, current)
    assert result.changes and bool(result.trajectory_changes) == trajectory, (field, result.trajectory_changes)


@pytest.mark.parametrize(("baseline", "current", "same"), [
    pytest.param(0.001, 0.001, True, id="equal-floats"),
    pytest.param(float("nan"), float("nan"), True, id="nan-is-written-alike"),
    pytest.param(0.0, -0.0, False, id="signed-zero"),
    pytest.param(1, 1.0, False, id="int-vs-float"),
    pytest.param(True, 1, False, id="bool-vs-int"),
    pytest.param(None, 0, False, id="null-vs-zero"),
    pytest.param("42", "42", True, id="equal-strings"),
])
def test_a_leaf_is_reproduced_where_its_json_text_is(baseline, current, same):
    """Leaves compare as the ledger writes them: a value equal in Python but written otherwise is a change."""
    leaf = "comparisons.incremental~prefill.k_rel_l2"
    result = compare_leaves(changed(leaf, baseline), changed(leaf, current))
    assert result.reproduced is same, f"{baseline!r} vs {current!r}: {[str(c) for c in result.changes]}"
