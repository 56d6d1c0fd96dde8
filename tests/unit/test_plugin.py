"""The pytest plugin as a user meets it, driven through pytester in a child process."""

import subprocess
import sys

import pytest

from replaytests import ledger
from replaytests.session import DEFAULT_CONTRACT as CONTRACT

REQUIRED_ARM_FIELDS = {"suffix", "answer", "correct", "cache_digest", "logits_digest"}


@pytest.fixture(scope="module")
def one_row_run(tmp_path_factory):
    """One FP32 row through the conformance suite: its outcome, output and ledger."""
    run_dir = tmp_path_factory.mktemp("run")
    report_dir = run_dir / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider",
         "--rows", "1", "--precision", "fp32", "--report-dir", str(report_dir)],
        cwd=run_dir, capture_output=True, text=True, check=False,
    )
    return proc, report_dir


def test_run_passes_and_prints_summary(one_row_run):
    proc, _ = one_row_run
    assert proc.returncode == 0, f"conformance run failed:\n{proc.stdout[-3000:]}"
    assert "replaytests summary" in proc.stdout, f"no summary section in:\n{proc.stdout[-2000:]}"
    assert "crossing  fp32" in proc.stdout, f"no crossing/fp32 line in the summary:\n{proc.stdout[-2000:]}"
    assert "replaytests contract: cpu-tiny" in proc.stdout, "the header does not name the contract"


def test_ledger_has_one_record_per_family_row_precision(one_row_run):
    _, report_dir = one_row_run
    records = ledger.read_ledger(report_dir / "ledger.jsonl")
    keys = [ledger.key(r) for r in records]
    assert keys == [("bridge", "tiny-000", "fp32"), ("crossing", "tiny-000", "fp32")], f"ledger keys {keys}"
    crossing = records[1]
    assert set(crossing["arms"]) == {"incremental", "incremental_replica", "prefill", "prefill_replica"}
    for arm, fields in crossing["arms"].items():
        missing = REQUIRED_ARM_FIELDS - set(fields)
        assert not missing, f"arm {arm} lacks {sorted(missing)}"
    assert crossing["comparisons"]["incremental~incremental_replica"]["cache_exact"] is True
    assert len(crossing["comparisons"]["incremental~prefill"]["k_rel_l2_per_layer"]) == 4


def test_summary_markdown_is_written(one_row_run):
    _, report_dir = one_row_run
    text = (report_dir / "summary.md").read_text()
    assert "| crossing | fp32 | 1 | 0 | 1/1 |" in text, f"summary.md table row missing:\n{text}"


def test_options_are_listed_in_help(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*replay conformance*", "*--model=MODEL*", "*--precision=*", "*--report-dir=*"])


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


def test_divergence_fails_where_the_contract_forbids_it(pytester, tmp_path):
    """Row tiny-005 diverges at BF16 on the embedded default; a contract that demands exact BF16
    suffixes must turn that recorded divergence into a failure that names the row and index."""
    strict = tmp_path / "strict.yaml"
    strict.write_text(CONTRACT.read_text().replace("{bf16: true, fp32: false}", "{bf16: false, fp32: false}"))
    result = pytester.runpytest_subprocess(
        "--pyargs", "replaytests.conformance", "-p", "no:cacheprovider", "--contract", str(strict),
        "--rows", "5:6", "--precision", "bf16", "-k", "incremental_vs_prefill",
        "--report-dir", str(tmp_path / "report"),
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*row tiny-005 (bf16): incremental and prefill suffixes diverge at suffix index*"
                                 "*contract cpu-tiny requires bf16 suffixes to be exact*"])
