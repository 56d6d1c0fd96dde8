"""`protocol.visibility: causal`: every token sees every earlier one, as a serving engine without 4D
masks runs. The masks, the boundary check that follows the setting (each direction shown to fail
when the mask does not match it), and a bank frozen under causal visibility replayed end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from conftest import forked_pytest
from replaytests.engine import protocol
from replaytests.engine.checks import check_mask
from replaytests.engine.protocol import VISIBILITIES, Visibility, visibility_rows
from replaytests.inputs.bank import manifest_path
from replaytests.inputs.contract import VISIBILITY_MODES, load_contract
from replaytests.inputs.options import DEFAULT_BANK, DEFAULT_CONTRACT, REPO

ROLES = [0, 0, 1, 1, 2, 2, 3, 4, 4, 5, 5]


def _causal_contract(tmp_path, rows: int = 3):
    path = tmp_path / "causal.yaml"
    path.write_text(f"extends: {DEFAULT_CONTRACT}\nname: cpu-tiny-causal\nprotocol: {{visibility: causal}}\n"
                    f"bank: {{rows: {rows}, prefix_len: {{min: null, max: null}}}}\n", encoding="utf-8")
    return path


def test_causal_rows_are_plain_causality():
    roles = torch.tensor(ROLES)
    n = len(ROLES)
    assert torch.equal(visibility_rows(roles, roles, 0, "causal"), torch.ones(n, n, dtype=torch.bool).tril())
    assert not torch.equal(visibility_rows(roles, roles, 0, "roles"), visibility_rows(roles, roles, 0, "causal"))


@pytest.mark.parametrize("chunks", [[11], [4, 1, 1, 5], [1] * 11], ids=["prefill", "mixed", "token-by-token"])
def test_the_growing_causal_mask_gives_the_reference_rows(chunks):
    roles, visibility, start = torch.tensor(ROLES), Visibility(len(ROLES) + 2, 2, "cpu", "causal"), 0
    for size in chunks:
        visibility.extend(ROLES[start:start + size])
        mask = visibility.mask(ROLES[start:start + size], start)
        reference = visibility_rows(roles[start:start + size], roles[:start + size], start, "causal")
        assert torch.equal(mask[0, 0], reference) and torch.equal(mask[1, 0], reference), (
            f"chunk at {start} of {size}: the causal mask differs from the reference rows")
        start += size


def test_the_contract_defaults_to_roles_and_takes_causal(tmp_path):
    assert set(VISIBILITY_MODES) == set(VISIBILITIES), "the contract's choices are not the engine's matrices"
    assert load_contract(DEFAULT_CONTRACT).visibility == "roles"
    assert load_contract(_causal_contract(tmp_path)).visibility == "causal"


@pytest.mark.parametrize("visibility", ["roles", "causal"])
def test_the_mask_check_follows_the_visibility(fp32_runtime, shortest_z, visibility):
    runtime = replace(fp32_runtime, visibility=visibility)
    check = check_mask(runtime, shortest_z)
    assert check.outcome == "ok", f"{visibility}: {check.detail}"


@pytest.mark.parametrize(("promised", "applied", "message"), [
    ("roles", "causal", "changed a branch-2 query's logits"),
    ("causal", "roles", "unchanged under causal visibility"),
], ids=["roles-promised-causal-applied", "causal-promised-roles-applied"])
def test_the_mask_check_fails_when_the_mask_is_not_the_promised_one(fp32_runtime, shortest_z, monkeypatch,
                                                                     promised, applied, message):
    """Negative controls: the check reads the promise (runtime.visibility) and probes the model through
    the mask actually built; with the other matrix swapped in, it must fail."""
    monkeypatch.setitem(protocol.VISIBILITIES, promised, VISIBILITIES[applied])
    check = check_mask(replace(fp32_runtime, visibility=promised), shortest_z)
    assert check.outcome == "fail" and message in check.detail, (check.outcome, check.detail)


@pytest.mark.e2e  # freezes three rows and starts a whole run
def test_a_causal_bank_is_frozen_and_replayed_end_to_end(tmp_path, bank_rows_json):
    from replaytests.cli import main

    contract, problems, bank = _causal_contract(tmp_path), tmp_path / "problems.jsonl", tmp_path / "causal.jsonl"
    problems.write_text("".join((REPO / "fixtures" / "problems" / "tiny.jsonl").read_text().splitlines(True)[:3]))
    assert main(["freeze", "--problems", str(problems), "--contract", str(contract), "--out", str(bank)]) == 0
    frozen = [json.loads(line) for line in bank.read_text().splitlines()]
    assert json.loads(manifest_path(bank).read_text())["contract"]["visibility"] == "causal"
    # The premise: the setting reached the model (the roles bank's rows, same problems, differ somewhere).
    moved = [row["id"] for row, roles_row in zip(frozen, bank_rows_json, strict=False)
             if row["tokens"] != roles_row["tokens"]]
    assert moved, f"no causal row differs from its roles row in {DEFAULT_BANK}: causal visibility did nothing"
    result = forked_pytest(
        tmp_path, "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "--contract", str(contract),
        "--bank", str(bank), "--precision", "bf16", "--report-dir", str(tmp_path / "report"), "-rs")
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and not outcomes.get("failed"), result.stdout.str()[-3000:]
    # live generation under causal visibility re-froze every causal row (run, not skipped)
    records = [json.loads(line) for line in (tmp_path / "report" / "latest" / "ledger.jsonl").read_text().splitlines()]
    live = [r for r in records if r["family"] == "live"]
    assert live and all(r["z_matches_bank"] for r in live), [(r["row"], r.get("z_matches_bank")) for r in live]
    assert "visibility causal (bank)" not in result.stdout.str(), "the re-freeze check was skipped for its visibility"
