"""The later checkpoint and the replication family (docs/protocol.md §7.6): byte-identical regeneration, the
outcome-blind panel, the strong-replication label, and one divergent row on the later checkpoint."""

from __future__ import annotations

import importlib.util

import pytest
from test_report import comparison, excluded, record

from conftest import find_row
from replaytests.engine.hf.runtime import Runtime
from replaytests.families import replication
from replaytests.families.panels import spaced
from replaytests.families.registry import FAMILIES, TRANSPLANTS, VALIDITY_PAIRS
from replaytests.files import sha256_file
from replaytests.inputs.bank import BankRow
from replaytests.outputs import replication_outcome, stats
from replaytests.outputs.records import Record


@pytest.fixture(scope="module")
def later_dir(repo):
    return repo / "fixtures" / "models" / "tiny-qwen2-later"


def test_later_checkpoint_regenerates_byte_identically(repo, later_dir, tmp_path):
    path = repo / "fixtures" / "make_later_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_later_checkpoint", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.write(repo / "fixtures" / "models" / "tiny-qwen2", tmp_path)
    committed = sorted(p.name for p in later_dir.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed, "regeneration writes a different set of files"
    differing = [name for name in committed if sha256_file(tmp_path / name) != sha256_file(later_dir / name)]
    assert not differing, f"regenerated {differing} differ from the committed later checkpoint"


def test_later_checkpoint_shares_config_and_tokenizer_but_not_weights(repo, later_dir):
    first = repo / "fixtures" / "models" / "tiny-qwen2"
    same = {p.name: sha256_file(p) == sha256_file(later_dir / p.name) for p in first.iterdir()}
    assert same == {name: name != "model.safetensors" for name in same}, f"file equal to the first checkpoint's: {same}"


# ---------------------------------------------------------------------------------------------
# The panel is frozen from prefix lengths and row ids alone.


def bank_row(row: str, prefix_len: int) -> BankRow:
    return BankRow(row, list(range(prefix_len)), [0] * prefix_len, None)


@pytest.mark.parametrize("size", [pytest.param(3, id="3-of-10"), pytest.param(48, id="48-of-10-takes-all")])
def test_panel_is_spaced_by_prefix_length_and_row_id(size):
    rows = [bank_row(f"r{i}", 100 + 10 * (i % 5)) for i in range(10)]
    chosen = [r.id for r in spaced(rows, size)]
    assert chosen[0] == "r0" and chosen[-1] == "r9", f"panel {chosen} misses the shortest or the longest row"


# ---------------------------------------------------------------------------------------------
# summarize: the strong label needs the registered minimum of exact controls.

def _outcome(name: str) -> dict:
    return {"outcome": name, "first_divergence_vs_donor": None, "first_divergence_vs_own": None}


FOLLOW, THIRD, KEEP = _outcome("follows_donor"), _outcome("third"), _outcome("keeps_own")


def replication_record(row: str, divergent: bool, first_token_equal: bool = True, outcomes=(FOLLOW, FOLLOW),
                       replicas_exact: bool = True, status: str = "ok") -> Record:
    if status != "ok":
        return Record.of(excluded("replication", row, "bf16", "BoundaryMismatch: x"))
    replica = comparison(cache_exact=replicas_exact, suffix_equal=replicas_exact) | {"logits_exact": True}
    cross = comparison(suffix_equal=not divergent, first_divergence=(3 if first_token_equal else 0) if divergent
                       else None) | {"first_token_equal": first_token_equal}
    return Record.of(record("replication", row, "bf16", {"incremental~prefill": cross,
                                                          **dict.fromkeys(FAMILIES["replication"].replicas, replica)},
                            transplants=dict(zip(TRANSPLANTS, outcomes, strict=True))))


def panel_records(divergent: int, controls: int, **first_divergent) -> list[Record]:
    records = [replication_record(f"d{i}", True, **(first_divergent if i == 0 else {})) for i in range(divergent)]
    return records + [replication_record(f"c{i}", False) for i in range(controls)]


@pytest.mark.parametrize(("records", "replicated", "strong"), [
    pytest.param(panel_records(40, 6), True, True, id="six-controls-strong"),
    pytest.param(panel_records(43, 5), True, False, id="five-controls-like-the-paper"),
    pytest.param(panel_records(40, 6, outcomes=(FOLLOW, KEEP)), False, False, id="one-direction-keeps-own"),
    pytest.param(panel_records(40, 6, replicas_exact=False), False, False, id="replica-not-exact"),
    pytest.param([*panel_records(40, 6), replication_record("c9", False, outcomes=(THIRD, FOLLOW))], False, False,
                 id="control-third"),
    pytest.param(panel_records(40, 6, first_token_equal=False, outcomes=(KEEP, KEEP)), True, True,
                 id="not-testable-row-counted-apart"),
    pytest.param(panel_records(0, 8), False, False, id="nothing-diverged"),
])
def test_summarize_labels_strong_replication(records, replicated, strong):
    summary = replication_outcome.summarize([*records, replication_record("x", True, status="excluded")], "replication")
    found = (summary.replicated, summary.strong)
    assert found == (replicated, strong), f"(replicated, strong) = {found}, expected {(replicated, strong)}: {summary}"


def test_summarize_counts():
    records = panel_records(40, 6, first_token_equal=False, outcomes=(KEEP, KEEP))
    run = {"panels": {"replication": {"min_exact_controls": 7}}}  # the run's run.json
    summary = replication_outcome.summarize(records, "replication", run)
    divergent, recovery = summary.divergent, summary.donor_recovery["prefill<-incremental"]
    assert (divergent.k, divergent.n) == (40, 46), summary
    assert summary.not_testable == [["d0", "first suffix tokens differ (raw boundary argmax equal): a transplant "
                                               "cannot move that choice"]], summary.not_testable
    assert (recovery.k, recovery.n) == (39, 39), f"donor recovery {recovery}"
    assert (summary.exact_controls, summary.min_exact_controls, summary.strong) == (6, 7, False), summary


# ---------------------------------------------------------------------------------------------
# One row on the later checkpoint at BF16 that diverges there on this platform (conftest.find_row).


@pytest.fixture(scope="module")
def later_record(later_dir, tiny_contract, bank_rows) -> Record:
    runtime = Runtime.load(later_dir, tiny_contract, "bf16")
    return replication.run(runtime, find_row(runtime, bank_rows, divergent=True))


def test_arms_replicas_and_validity_control(later_record):
    assert later_record.ok, later_record.reason
    assert tuple(later_record.arms) == FAMILIES["replication"].arms, f"arms {list(later_record.arms)}"
    for pair in (*FAMILIES["replication"].replicas, *(f"{name}~{own}" for name, own in VALIDITY_PAIRS)):
        metrics = later_record.comparisons[pair]
        assert metrics.cache_exact and metrics.suffix_equal, f"{later_record.row} {pair}: {metrics}"


def test_divergent_row_follows_its_donor_both_ways(later_record):
    row = later_record.row
    assert not later_record.comparisons["incremental~prefill"].suffix_equal, (
        f"{row} diverged in the search but not in its replication record")
    outcomes = {name: t.outcome for name, t in later_record.transplants.items()}
    assert outcomes == dict.fromkeys(TRANSPLANTS, "follows_donor"), f"{row} transplants: {outcomes}"


# ---------------------------------------------------------------------------------------------
# Its outputs come from its registry record: the outcome module it names (outputs/causal.py).

AGAIN = "replication_again"  # a family the outputs have never seen, naming the replication's outcome module


@pytest.mark.parametrize("outcome", [pytest.param(FAMILIES["replication"].outcome, id="named"),
                                     pytest.param("", id="not-named")])
def test_a_family_naming_an_outcome_module_is_shown_by_every_output(monkeypatch, outcome):
    """A new family whose record names the replication's outcome module, and nothing else: its records are summarized
    per cell in report.json (causal_cells) and shown in the terminal's lines, report.md's causal and replica tables
    and the history as the replication's are; the control: the same family naming none is shown in none of them."""
    from dataclasses import replace

    from replaytests.outputs import history, sections, summary
    from replaytests.outputs.report import build_report, run_gates

    monkeypatch.setitem(FAMILIES, AGAIN, replace(FAMILIES["replication"], name=AGAIN, outcome=outcome,
                                                 title="Replication again"))
    records = [replace(r, family=AGAIN) for r in panel_records(40, 6)]
    built = build_report(records, {})
    found = built["causal_cells"].get("bf16", {})
    lines = summary.causal_lines(built, run_gates({}))
    page = sections.markdown(built)
    tracked = history.summarize(records)[1]
    if not outcome:
        assert not found and not lines and "Replication again" not in page and not tracked, (found, lines, tracked)
        return
    assert found == {AGAIN: replication_outcome.summarize(records, AGAIN)}, found
    assert found[AGAIN].strong and found[AGAIN].rows == 46, found[AGAIN]
    assert lines == replication_outcome.terminal_lines(AGAIN, "bf16", found[AGAIN], run_gates({})), lines
    assert lines[0].startswith(f"{AGAIN} (bf16): validity control") and "strong replication" in lines[0], lines
    assert "### Replication again, bf16" in page and f"| {AGAIN} | bf16 | both constructions | 46/46" in page, page
    assert tracked == {AGAIN: stats.as_json(replication_outcome.tracked(found[AGAIN]))} and tracked[AGAIN]["label"] == \
        "strong replication", tracked
