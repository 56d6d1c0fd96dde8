"""The pytest plugin as a user meets it, driven through pytester in a child process."""

import functools
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
import torch

from conftest import ROWS, conformance_run, forked_pytest
from replaytests.inputs import cpu_isa
from replaytests.inputs.cpu_isa import cpu_flags
from replaytests.inputs.options import DEFAULT_CONTRACT as CONTRACT
from replaytests.outputs import ledger
from replaytests.outputs.records import Record
from replaytests.suite.command_line import CONFORMANCE

REQUIRED_ARM_FIELDS = {"suffix", "answer", "correct", "cache_digest", "logits_digest"}
AUDITED = ("live", "crossing", "bridge", "batch")  # the families whose records the baseline tests audit




@pytest.mark.e2e  # spawns a whole run
def test_run_passes_and_prints_summary(two_row_run):
    proc, _ = two_row_run
    assert proc.returncode == 0, f"conformance run failed:\n{proc.stdout[-3000:]}"
    assert "replaytests summary" in proc.stdout, f"no summary section in:\n{proc.stdout[-2000:]}"
    for line in ("batch fp32 2 0 - ", "bridge fp32 2 0 - 2/2 0/2 0/2 0/2", "crossing fp32 2 0 2/2 0/2 0/2 0/2 0/2",
                 "live fp32 2 0 2/2 0/2 0/2 0/2 0/2", "rollout fp32 2 0 2/2 0/2 - - -"):
        pattern = r"^" + r" +".join(map(re.escape, line.split())) + (r" +" if line.endswith(" ") else r"$")
        assert re.search(pattern, proc.stdout, re.MULTILINE), f"summary line {line!r} missing:\n{proc.stdout[-2000:]}"
    assert "replaytests contract: cpu-tiny" in proc.stdout, "the header does not name the contract"


@pytest.mark.e2e  # spawns a whole run
def test_progress_lines_count_rows_per_family_and_precision(two_row_run):
    """Not a terminal: plain progress lines, one as each family and precision completes its rows."""
    proc, _ = two_row_run
    lines = [line for line in proc.stdout.splitlines() if line.startswith("replaytests progress: ")]
    assert lines, f"no progress line:\n{proc.stdout[-2000:]}"
    pattern = r"replaytests progress: \d+/\d+ tests, \w+ elapsed, ETA (?:-|\w+); rows: .*"  # "-": none yet
    assert re.fullmatch(pattern, lines[-1]), lines[-1]
    for group in ("live fp32 2/2", "crossing fp32 2/2", "bridge fp32 2/2", "batch fp32 2/2"):
        assert group in lines[-1], f"{group!r} missing from the last progress line {lines[-1]!r}"


@pytest.mark.e2e  # spawns a whole run
def test_ledger_has_one_record_per_family_row_precision(two_row_run):
    _, report_dir = two_row_run
    records = ledger.read_ledger(report_dir / "ledger.jsonl")
    keys = [r.key for r in records]
    families = ("batch", "bridge", "conversation", "crossing", "live", "rollout", "rollout_sampled", "sweep")  # run
    expected = [(f, row, "fp32") for f in families for row in ("tiny-000", "tiny-001")]
    assert keys == expected, f"ledger keys {keys}"
    crossing = next(r for r in records if r.key == ("crossing", "tiny-000", "fp32"))
    assert set(crossing.arms) == {"incremental", "incremental_replica", "prefill", "prefill_replica"}
    for arm, fields in crossing.to_json()["arms"].items():
        missing = REQUIRED_ARM_FIELDS - set(fields)
        assert not missing, f"arm {arm} lacks {sorted(missing)}"
    assert crossing.comparisons["incremental~incremental_replica"].cache_exact is True
    assert len(crossing.comparisons["incremental~prefill"].k_rel_l2_per_layer) == 4


@pytest.mark.e2e  # spawns a whole run
def test_summary_markdown_is_written(two_row_run):
    _, report_dir = two_row_run
    text = (report_dir / "summary.md").read_text()
    assert "| crossing | fp32 | 2 | 0 | 2/2 |" in text, f"summary.md table row missing:\n{text}"


def _baseline_beside(report_dir, tmp_path, suffix: bool = False, **platform) -> tuple[Path, dict]:
    """The run's ledger with one cache digest altered (and with `suffix`, one suffix token too), beside
    its run.json with `platform` changed; and the run's own platform. Its live, crossing, bridge and batch
    records only: the audit's machinery is what these tests judge, and four records of a row show it."""
    records = [r.to_json() for r in ledger.read_ledger(report_dir / "ledger.jsonl") if r.family in AUDITED]
    target = next(r for r in records if (r["family"], r["row"], r["precision"]) == ("crossing", "tiny-001", "fp32"))
    target["arms"]["prefill"]["cache_digest"] = "0" * 64
    if suffix:
        target["arms"]["prefill"]["suffix"][0] += 1
    baseline = tmp_path / "elsewhere" / "ledger.jsonl"
    ledger.write_ledger(baseline, [Record.of(r) for r in records])
    run = json.loads((report_dir / "run.json").read_text())
    here = dict(run["platform"])
    run["platform"] |= platform
    (baseline.parent / "run.json").write_text(json.dumps(run))
    return baseline, here


@pytest.mark.e2e  # spawns a whole run
def test_audit_names_the_row_and_field_that_changed(two_row_run, tmp_path):
    """A baseline (made on this platform) whose cache digest for one record was altered: exactly that
    record fails, naming it."""
    baseline, _ = _baseline_beside(two_row_run[1], tmp_path)
    proc, _ = conformance_run(tmp_path, "-p", "no:xdist", "--baseline", str(baseline), "-k", "baseline_record",
                              "--rows", "1:2")  # only tiny-001, 4 records
    assert "1 failed, 3 passed" in proc.stdout, f"expected one audit failure:\n{proc.stdout[-3000:]}"
    assert ("crossing row tiny-001 (fp32): 1 of" in proc.stdout
            and "first: arms.prefill.cache_digest: baseline \"000000" in proc.stdout), proc.stdout[-3000:]
    assert "ledger audit: 3/4 baseline records reproduce" in proc.stdout, proc.stdout[-2000:]


# The verdict of a run auditing the four records of row 1:2 (one skipped parameter: no causal record there)
HELD, FAILED = "PASS (3 passed, 1 skipped, 1 xfailed)", "FAIL (1 failed, 3 passed, 1 skipped)"


@pytest.mark.e2e  # spawns a whole run
@pytest.mark.parametrize(("gate", "suffix", "platform", "outcome"), [
    pytest.param("trajectories", False, None, HELD, id="bits-only-passes-trajectories"),
    pytest.param("trajectories", True, None, FAILED, id="changed-suffix-fails-trajectories"),
    pytest.param("rates", True, None, HELD, id="changed-suffix-recorded-at-rates"),
    pytest.param("bits", False, "ANOTHER", FAILED, id="an-explicit-gate-holds-across-platforms"),
])
def test_the_baseline_is_judged_at_the_gate(two_row_run, tmp_path, gate, suffix, platform, outcome):
    """--gate in a run: a change finer than the gate is recorded (named as allowed), one at it fails."""
    baseline, _ = _baseline_beside(two_row_run[1], tmp_path, suffix,
                                   **({"environment.cpu_isa": platform} if platform else {}))
    proc, _ = conformance_run(tmp_path, "-p", "no:xdist", "--baseline", str(baseline), "-k", "baseline_record",
                              "--rows", "1:2", "--gate", gate, "-rxf")
    assert f"verdict: {outcome}" in proc.stdout and proc.returncode == int(outcome.startswith("FAIL")), \
        f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    what = "1 of a trajectory" if suffix else "bits only (no trajectory changed)"
    assert "crossing row tiny-001 (fp32): " in proc.stdout and what in proc.stdout, proc.stdout[-3000:]
    assert f"judged at --gate {gate}" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.e2e  # spawns a whole run
@pytest.mark.parametrize(("strict", "outcome"), [pytest.param(False, HELD, id="drift-is-data"),
                                                  pytest.param(True, FAILED, id="strict-fails")])
def test_a_baseline_from_another_platform_is_platform_drift(two_row_run, tmp_path, strict, outcome, forced_cpu_isa):
    """The same altered record, in a baseline recorded at another CPU level: its change is recorded as
    platform drift (in the verdict, exit 0); --strict-contract makes it a failure."""
    if strict and forced_cpu_isa:
        pytest.skip(f"--strict-contract stops every run at once here: {forced_cpu_isa[0]}")
    baseline, here = _baseline_beside(two_row_run[1], tmp_path, **{"environment.cpu_isa": "ANOTHER"})
    proc, _ = conformance_run(tmp_path, "-p", "no:xdist", "--baseline", str(baseline), "-k", "baseline_record",
                              "--rows", "1:2", *(["--strict-contract"] if strict else []))
    assert f"verdict: {outcome}" in proc.stdout and proc.returncode == int(strict), \
        f"exit {proc.returncode}:\n{proc.stdout[-3000:]}"
    assert f"environment.cpu_isa ANOTHER (baseline) vs {here['environment.cpu_isa']} (here)" in proc.stdout, (
        proc.stdout[-3000:])
    if not strict:
        assert "platform drift: 1/4 baseline records changed (crossing/tiny-001/fp32)" in proc.stdout, proc.stdout


@pytest.mark.e2e  # spawns a whole run
def test_json_report_carries_metrics(tmp_path):
    pytest.importorskip("pytest_jsonreport")
    out = tmp_path / "report.json"
    proc, _ = conformance_run(tmp_path, "-p", "no:xdist", "-k", "test_replica_exact and crossing and prefill",
                              "--json-report", f"--json-report-file={out}", "--rows", "1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    tests = json.loads(out.read_text())["tests"]
    metadata = [t["metadata"]["replaytests"][0] for t in tests]
    assert [(m["family"], m["row"]) for m in metadata] == [("crossing", "tiny-000")], metadata
    assert metadata[0]["comparisons"]["prefill~prefill_replica"]["cache_exact"] is True, metadata[0]


@pytest.mark.e2e  # spawns a whole run
def test_junit_xml_carries_row_precision_and_divergence(tmp_path):
    """Each conformance test's JUnit properties name its record (family, row, precision) and carry the
    headline pair's first divergence and margins, not the whole record."""
    out = tmp_path / "junit.xml"
    proc, _ = conformance_run(tmp_path, "-p", "no:xdist", "-k", "test_incremental_vs_prefill_suffix",
                              f"--junitxml={out}", "--rows", "1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    import xml.etree.ElementTree as ET

    cases = ET.parse(out).getroot().iter("testcase")
    properties = {p.get("name"): p.get("value") for case in cases for p in case.iter("property")}
    key = "replaytests.crossing.tiny-000.fp32"
    assert properties.get(f"{key}.status") == "ok", properties
    assert f"{key}.incremental~prefill.first_divergence" in properties, sorted(properties)
    assert f"{key}.incremental~prefill.margins_at_divergence" in properties, sorted(properties)
    assert not any(value.startswith("{") for value in properties.values()), "a whole record rode into the XML"


def test_marker_selects_one_fidelity_layer(pytester):
    result = pytester.runpytest("--pyargs", "replaytests.conformance", *ROWS, "-m", "token_identity",
                                "--collect-only", "-q")
    collected = [line for line in result.stdout.lines if "::" in line]
    assert collected and all("test_token_identity.py" in line for line in collected), collected


def test_gpu_targets_skip_with_one_reason_without_cuda(pytester):
    """`pytest -m gpu` takes the GPU contract; without CUDA every target is skipped, exit 0."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = pytester.runpytest("--pyargs", "replaytests.conformance", *ROWS, "-m", "gpu")
    assert result.ret == pytest.ExitCode.OK, f"exit {result.ret}:\n{result.stdout.str()[-2000:]}"
    reasons = [line.removeprefix("skipped: ") for line in result.stdout.lines if line.startswith("skipped: ")]
    assert len(reasons) == 1 and "runs on 'cuda' but CUDA is not available here" in reasons[0], (
        f"without -rs, the summary should name the one skip reason:\n{result.stdout.str()[-2000:]}")
    result.stdout.fnmatch_lines(["*replaytests: every selected test was skipped*"])
    progress = [line for line in result.stdout.lines if re.search(r"test_\w+\.py s", line)]
    assert len(progress) == len(list(CONFORMANCE.glob("test_*.py"))), f"one progress line per file: {progress}"
    assert "deselected" not in result.stdout.str().splitlines()[-1], "some GPU targets were not selected"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        pytest.param("--contract", "missing.yaml", "*missing.yaml: cannot read contract*", id="missing-contract"),
        pytest.param("--bank", "missing.jsonl", "*missing.jsonl: cannot read bank*", id="missing-bank"),
        pytest.param("--model", "no-such-model", "*no-such-model: model directory not found*", id="missing-model"),
        pytest.param("--rows", "x:y", "*--rows: expected a count N or a slice A:B*", id="bad-rows"),
    ],
)
def test_bad_input_is_one_line_usage_error(pytester, option, value, message):
    result = pytester.runpytest(option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit code {result.ret}"
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str(), "a traceback reached the user"


@pytest.mark.e2e  # spawns a whole run
def test_divergence_fails_where_the_contract_forbids_it(tmp_path, bank_rows, divergent_row):
    """A row that diverges at BF16 on this platform (found by the search, never named): a contract
    that demands exact BF16 suffixes turns that recorded divergence into a failure naming the row."""
    strict = tmp_path / "strict.yaml"
    strict.write_text(CONTRACT.read_text().replace("bf16: true, fp32: false", "bf16: false, fp32: false"))
    index = bank_rows.index(divergent_row)
    result = forked_pytest(
        tmp_path, "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "--contract", str(strict),
        "--rows", f"{index}:{index + 1}", "--precision", "bf16", "-k", "incremental_vs_prefill",
        "--report-dir", str(tmp_path / "report"),
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*crossing row {divergent_row.id} (bf16): incremental and prefill suffixes diverge "
                                 "at suffix index*the contract requires bf16 crossing suffixes to be exact*"])
    # the failure carries the command that reruns it alone; copied as printed, it fails the same way
    lines = result.stdout.lines
    start = next(n for n, line in enumerate(lines) if "rerun it alone" in line)
    rerun = lines[start + 1]
    assert f"--replay-rows {index}:{index + 1}" in rerun and "--replay-precision bf16" in rerun, rerun
    test = f"test_incremental_vs_prefill_suffix[bf16-{divergent_row.id}]"
    assert f"--replay-contract {strict}" in rerun and f"-k '{test}'" in rerun, rerun
    again = forkserver.run([sys.executable, "-m", *shlex.split(rerun)], cwd=tmp_path)
    assert again.returncode == 1 and "1 failed" in again.stdout.splitlines()[-1], again.stdout[-2000:]


@pytest.mark.e2e  # spawns two runs
def test_a_selection_that_leaves_out_the_failing_check_of_records_it_computed_fails(tmp_path, bank_rows,
                                                                                      divergent_row):
    """The same row and strict contract, with a -k that selects the crossing's token-identity test alone: the
    crossing record is computed, and no selected test judges its divergence. The run's verdict judges its records
    as its report does, so it fails (exit 1), saying what they show and that no test failed; its report agrees (no
    "run.json said PASS"). The control: the same selection under the contract as committed passes, exit 0."""
    strict = tmp_path / "strict.yaml"
    strict.write_text(CONTRACT.read_text().replace("bf16: true, fp32: false", "bf16: false, fp32: false"))
    index = bank_rows.index(divergent_row)
    for contract, status in ((CONTRACT, 0), (strict, 1)):
        report = tmp_path / f"report-{status}"
        result = forked_pytest(
            tmp_path, "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "--contract", str(contract),
            "--rows", f"{index}:{index + 1}", "--precision", "bf16", "-k", "crossing_arms_consume_bank_row",
            "--report-dir", str(report))
        result.assert_outcomes(passed=1)
        assert result.ret == status, f"{contract.name}: exit {result.ret}\n" + "\n".join(result.outlines[-30:])
        head = (report / "latest" / "report.md").read_text(encoding="utf-8").splitlines()[2]
        if status == 0:
            assert head == "## PASS (1 passed)", head
            continue
        result.stdout.fnmatch_lines([f"*FAILED the run's records: the records show exact-cell suffixes failing in 1 "
                                     f"row (crossing/{divergent_row.id}/bf16), which no selected test checked*",
                                     "exit status 1: the verdict is FAIL although no test failed*"])
        assert head.startswith("## FAIL (1 passed)") and "run.json said" not in head, head


def pinned_torch_contract(tmp_path):
    """cpu-tiny, but promising a torch version no machine has."""
    contract = tmp_path / "pinned.yaml"
    contract.write_text(f"extends: {CONTRACT}\nname: pinned\nsoftware: {{torch: '0.0.1'}}\n")
    return contract


def test_drift_is_shown_in_the_header(pytester, tmp_path):
    result = pytester.runpytest("--pyargs", "replaytests.conformance", *ROWS, "--contract",
                                str(pinned_torch_contract(tmp_path)), "--collect-only")
    result.stdout.fnmatch_lines([f"replaytests drift: * field(s) differ from the contract: *software.torch: "
                                 f"contract 0.0.1, actual {torch.__version__}*"])


def test_strict_contract_fails_the_run_on_drift(pytester, tmp_path):
    result = pytester.runpytest("--pyargs", "replaytests.conformance", *ROWS, "--contract",
                                str(pinned_torch_contract(tmp_path)), "--strict-contract", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit code {result.ret}"
    result.stderr.fnmatch_lines(["ERROR: --strict-contract: the environment differs from contract pinned in * "
                                 "field(s): *software.torch: contract 0.0.1, actual *"])


@pytest.fixture
def changed_bank(tmp_path):
    """The committed bank with one row moved to the end: every row still valid, the sha256 changed."""
    from replaytests.inputs.bank import manifest_path
    from replaytests.inputs.options import DEFAULT_BANK

    lines = DEFAULT_BANK.read_text().splitlines(keepends=True)
    bank = tmp_path / "tiny.jsonl"
    bank.write_text("".join(lines[1:] + lines[:1]))
    manifest = json.loads(manifest_path(DEFAULT_BANK).read_text())
    manifest["model"]["path"] = str(DEFAULT_BANK.parent / manifest["model"]["path"])
    manifest_path(bank).write_text(json.dumps(manifest))
    return bank


def test_a_changed_bank_is_refused_naming_the_override(pytester, changed_bank):
    result = pytester.runpytest("--pyargs", "replaytests.conformance", "--bank", str(changed_bank), "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"exit code {result.ret}"
    result.stderr.fnmatch_lines(["ERROR: *bank sha256*refused (pass --accept-changed=bank to use it anyway*"])


def test_an_accepted_change_is_recorded_in_the_header(pytester, changed_bank):
    result = pytester.runpytest("--pyargs", "replaytests.conformance", "--bank", str(changed_bank),
                                "--accept-changed", "bank", "--collect-only")
    assert result.ret == pytest.ExitCode.OK, f"exit code {result.ret}:\n{result.stderr.str()}"
    result.stdout.fnmatch_lines(["replaytests overridden: *bank sha256*accepted with --accept-changed=bank*"])


# ---------------------------------------------------------------------------------------------
# The CPU instruction set: pinned by the contract, forced by the user, or fixed too early.

needs_avx2 = pytest.mark.skipif(not {"avx2", "fma"} <= (cpu_flags() or set()) or platform.machine() != "x86_64",
                                reason="the embedded default's contract pins AVX2, which this CPU cannot run")
PLATFORM_TESTS = ("--rows", "1", "--precision", "bf16", "-k", "refreezes_bank_row or on_this_platform")
# torch 2.13's CPU flash attention, dispatched at DEFAULT on some AVX-512 CPUs (seen on an Intel Xeon),
# raises "pack_vnni2 is only supported when avx512 is supported" on a BF16 prefill of 64 tokens or more.
_BF16_SDPA_PROBE = ("import torch; q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16); "
                    "torch.nn.functional.scaled_dot_product_attention(q, q, q, "
                    "attn_mask=torch.ones(64, 64).bool().tril())")


@functools.cache
def bf16_sdpa_fails_at_default() -> str | None:
    """torch's own error where a BF16 SDPA cannot run with the kernels dispatched at DEFAULT here, else None."""
    env = {k: v for k, v in os.environ.items() if k not in (cpu_isa.ATEN, cpu_isa.ONEDNN, cpu_isa.MARK)}
    proc = subprocess.run([sys.executable, "-c", _BF16_SDPA_PROBE], capture_output=True, text=True, check=False,
                          env=env | {cpu_isa.ATEN: "default", cpu_isa.ONEDNN: "DEFAULT"})
    return proc.stderr.strip().splitlines()[-1] if proc.returncode else None


def skip_where_bf16_cannot_run_at_default() -> None:
    if error := bf16_sdpa_fails_at_default():
        pytest.skip(f"torch cannot run BF16 attention at DEFAULT dispatch on this CPU ({cpu_isa.cpu_model()}): {error}")


def _user_dispatch(monkeypatch, **variables) -> None:
    """The child process sees only the dispatch variables a user set (none from this run's own pin)."""
    for name in (cpu_isa.ATEN, cpu_isa.ONEDNN, cpu_isa.MARK):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.e2e  # spawns a whole run
@needs_avx2
def test_a_forced_dispatch_level_is_drift_in_the_verdict(tmp_path, monkeypatch):
    skip_where_bf16_cannot_run_at_default()
    _user_dispatch(monkeypatch, ATEN_CPU_CAPABILITY="default", ONEDNN_MAX_CPU_ISA="DEFAULT")
    result = forked_pytest(tmp_path, "--pyargs", "replaytests.conformance", *PLATFORM_TESTS)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([
        "*replaytests summary*", "verdict: PASS*",
        "cpu_isa: contract cpu-tiny pins AVX2, not applied (set in the environment: ATEN_CPU_CAPABILITY=default "
        "ONEDNN_MAX_CPU_ISA=DEFAULT); torch dispatches to DEFAULT*",
        "bank: *, made on another platform (environment.cpu_isa AVX2 (bank) vs DEFAULT* (here))*",
        "drift from the contract: environment.cpu_isa: contract AVX2, actual DEFAULT*"])


@pytest.mark.e2e  # spawns a whole run
@needs_avx2
def test_a_forced_dispatch_level_fails_a_strict_run_at_once(tmp_path, monkeypatch):
    _user_dispatch(monkeypatch, ATEN_CPU_CAPABILITY="default")
    result = forked_pytest(tmp_path, "--pyargs", "replaytests.conformance", *PLATFORM_TESTS, "--strict-contract")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-3000:]
    result.stderr.fnmatch_lines(["ERROR: --strict-contract: the environment differs from contract cpu-tiny in 1 "
                                 "field(s): environment.cpu_isa: contract AVX2, actual DEFAULT*"])


@pytest.mark.e2e  # spawns a whole run
@needs_avx2
@pytest.mark.parametrize("strict", [pytest.param(False, id="drift-is-data"), pytest.param(True, id="strict-fails")])
def test_a_contract_pinning_another_level_reports_platform_drift(tmp_path, monkeypatch, strict):
    """A contract copy pinning DEFAULT runs at DEFAULT (no contract drift), against a bank and baseline
    made at AVX2: platform drift in the verdict, a failure only with --strict-contract."""
    skip_where_bf16_cannot_run_at_default()
    _user_dispatch(monkeypatch)
    contract = tmp_path / "default.yaml"
    contract.write_text(f"extends: {CONTRACT}\nname: cpu-default\nenvironment: {{cpu_isa: DEFAULT}}\n")
    result = forked_pytest(tmp_path, "--pyargs", "replaytests.conformance", *PLATFORM_TESTS,
                           "--contract", str(contract), *(["--strict-contract"] if strict else []))
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if strict else pytest.ExitCode.OK), result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["cpu_isa: DEFAULT, pinned by contract cpu-default",
                                 "bank: *, made on another platform (environment.cpu_isa AVX2 (bank) vs DEFAULT "
                                 "(here))*", "drift from the contract: none"])
    if strict:
        result.stdout.fnmatch_lines(["*FAILED *test_bank_made_on_this_platform*the bank was made on another "
                                     "platform*--strict-contract*"])


@pytest.mark.e2e  # spawns a whole run
@needs_avx2
def test_torch_that_ran_before_the_contract_is_one_line(tmp_path, monkeypatch):
    """A plugin that made torch dispatch a kernel (at DEFAULT) before replaytests read the contract."""
    _user_dispatch(monkeypatch)
    (tmp_path / "early_torch.py").write_text("import os\nos.environ['ATEN_CPU_CAPABILITY'] = 'default'\nimport torch\n"
                                             "torch.zeros(2).add_(1)\ndel os.environ['ATEN_CPU_CAPABILITY']\n")
    result = forked_pytest(tmp_path, "-p", "early_torch", "--pyargs", "replaytests.conformance", *ROWS,
                           "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-3000:]
    result.stderr.fnmatch_lines(["ERROR: contract cpu-tiny (*) pins cpu_isa AVX2, but torch already dispatches its CPU "
                                 "kernels to DEFAULT* run again with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
                                 "set in the environment"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str(), "a traceback reached the user"


@pytest.mark.e2e  # spawns a whole run
def test_the_plugin_loaded_by_its_module_name_runs_the_families(tmp_path):
    """Where replaytests is not installed (benchmarks/gpu_check.sh's fallback: PYTHONPATH=src and -p
    replaytests.suite.plugin) the plugin has its module's name, and the conformance tests still run."""
    proc, run = conformance_run(tmp_path, "-p", "no:replaytests", "-p", "replaytests.suite.plugin", "-p", "no:xdist",
                                "--precision", "fp32", "-k", "bridge")
    assert proc.returncode == 0, f"the run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert {r.family for r in ledger.read_ledger(run / "ledger.jsonl")} == {"bridge"}, proc.stdout[-2000:]


def test_the_rerun_command_names_every_input_but_the_defaults_and_the_row_by_its_place_in_the_bank(tmp_path):
    from replaytests.inputs.bank import BankRow
    from replaytests.inputs.options import Options
    from replaytests.suite import rerun

    rows = [BankRow(f"r-{n}", [1], [0], None) for n in range(10)]
    options = Options(rows="4:8", contract=tmp_path / "my contract.yaml", accept_changed=frozenset({"model"}),
                      report_dir=tmp_path / "elsewhere")
    index = rerun.bank_index(options, rows[4:8], rows[6])
    assert index == 6
    line = rerun.command(options, index, "bf16", "test_x[bf16-r-6]")
    assert line == (f"pytest --pyargs replaytests.conformance -p no:cacheprovider --replay-contract "
                    f"'{tmp_path}/my contract.yaml' --replay-accept-changed model --replay-rows 6:7 "
                    "--replay-precision bf16 -k 'test_x[bf16-r-6]'"), line
    assert rerun.bank_index(Options(rows="3"), rows[:3], rows[2]) == 2
