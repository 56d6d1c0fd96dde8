"""replaytests.cli: `replaytests freeze` — usage errors as one line with exit code 2, and a real freeze."""

from __future__ import annotations

import contextlib
import io
import json
import re

import forkserver
import pytest

from replaytests.cli import main
from replaytests.files import sha256_file
from replaytests.inputs.bank import manifest_path, read_bank

PROBLEMS = [
    {"id": "p-1", "prompt": "What is 2 + 3?", "expected_answer": "5"},
    {"id": "p-2", "prompt": "What is 40 + 2?", "expected_answer": "42"},
]


def write_problems(path, problems=PROBLEMS):
    path.write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
    return path


def assert_one_line_error(code: int, captured, path) -> str:
    err = captured.err
    assert code == 4, f"exit code {code}, expected 4 (stderr: {err!r})"
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr has {len(lines)} lines, expected one: {err!r}"
    assert lines[0].startswith("replaytests: error: "), f"stderr line does not start with the prefix: {lines[0]!r}"
    assert str(path) in lines[0], f"stderr line does not name {path}: {lines[0]!r}"
    assert captured.out == "", f"stdout not empty on a usage error: {captured.out!r}"
    return lines[0]


@pytest.mark.parametrize(("option", "make", "message"), [
    pytest.param("--problems", lambda d: d / "no-such-problems.jsonl", "cannot read problem: No such file or directory",
                 id="missing-problems"),
    pytest.param("--model", lambda d: d / "no-such-model", "model directory not found", id="missing-model-dir"),
    pytest.param("--model", lambda d: (d / "empty-model").mkdir() or d / "empty-model",
                 "no config.json (expected a Hugging Face model directory)", id="model-dir-without-config"),
    pytest.param("--contract", lambda d: d / "no-such-contract.yaml",
                 "cannot read contract: No such file or directory", id="missing-contract"),
])
def test_freeze_with_a_missing_input_is_a_one_line_usage_error(tmp_path, capsys, option, make, message):
    path = make(tmp_path)
    out = tmp_path / "bank" / "out.jsonl"
    argv = ["freeze", "--problems", str(write_problems(tmp_path / "problems.jsonl")), "--out", str(out)]
    code = main([*argv, option, str(path)])
    line = assert_one_line_error(code, capsys.readouterr(), path)
    assert line == f"replaytests: error: {path}: {message}", f"stderr line {line!r}"
    assert not out.exists() and not manifest_path(out).exists(), "a failed freeze left a bank or manifest behind"


def test_freeze_with_a_broken_problems_file(tmp_path, capsys):
    problems = tmp_path / "problems.jsonl"
    problems.write_text('{"id": "a", "prompt": "x"}\n{"id": "b"}\n', encoding="utf-8")
    code = main(["freeze", "--problems", str(problems), "--out", str(tmp_path / "out.jsonl")])
    line = assert_one_line_error(code, capsys.readouterr(), problems)
    assert line.endswith(f"{problems}:2: missing field 'prompt'"), f"stderr line {line!r}"


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """`replaytests freeze` of two short problems with the embedded model and contract (a few seconds)."""
    root = tmp_path_factory.mktemp("freeze")
    problems = write_problems(root / "problems.jsonl")
    out_dir = root / "banks"
    out = out_dir / "two.jsonl"
    with contextlib.redirect_stdout(io.StringIO()) as stdout, contextlib.redirect_stderr(io.StringIO()) as stderr:
        code = main(["freeze", "--problems", str(problems), "--out", str(out)])
    return code, out, stdout.getvalue(), stderr.getvalue()


def test_freeze_exits_zero_and_reports(frozen):
    code, out, stdout, stderr = frozen
    assert code == 0, f"freeze exit code {code} (stderr: {stderr!r})"
    assert re.fullmatch(rf"froze 2 rows into {re.escape(str(out))} on hf at bf16 \(prefix lengths \d+-\d+\)\n",
                        stdout), (
        f"freeze stdout {stdout!r}"
    )


def test_frozen_rows_parse_under_the_grammar(frozen, tiny_grammar, tiny_contract):
    out = frozen[1]
    rows = read_bank(out, tiny_grammar, 1024, tiny_contract.caps.suffix_room())
    got = [(r.id, r.expected_answer) for r in rows]
    expected = [(p["id"], p["expected_answer"]) for p in PROBLEMS]
    assert got == expected, f"frozen rows (id, expected_answer) {got}, expected {expected}"
    ends = [r.tokens[-1] for r in rows]
    assert ends == [tiny_grammar.delims.openers[4]] * 2, f"rows do not end at <|merge|>: last tokens {ends}"


def test_frozen_manifest_records_the_bank_sha256(frozen):
    out = frozen[1]
    manifest = json.loads(manifest_path(out).read_text(encoding="utf-8"))
    assert manifest["bank_sha256"] == sha256_file(out), (
        f"manifest bank_sha256 {manifest['bank_sha256'][:12]} vs file {sha256_file(out)[:12]}"
    )
    assert (manifest["rows"], manifest["bank"], manifest["precision"]) == (2, "two.jsonl", "bf16"), (
        f"manifest rows/bank/precision {(manifest['rows'], manifest['bank'], manifest['precision'])}"
    )
    assert manifest["contract"]["cache"] == "dynamic", f"manifest contract {manifest['contract']}"


def test_frozen_manifest_records_its_platform(frozen, tiny_contract):
    """The bank's live boundaries hold platform-specific numbers: the manifest says where they were made."""
    from replaytests.engine.backend import resolve
    from replaytests.engine.environment import capture_run
    from replaytests.inputs.platforms import platform_of

    platform = json.loads(manifest_path(frozen[1]).read_text(encoding="utf-8"))["platform"]
    assert platform == platform_of(capture_run(tiny_contract, resolve("hf")), resolve("hf")), f"manifest {platform}"
    assert set(platform) == {"hardware.device_kind", "hardware.cpu", "environment.cpu_isa", "environment.cpu_threads",
                             "software.torch", "software.transformers"}, sorted(platform)


def test_freeze_over_a_bank_is_refused_and_force_replaces_it(frozen, tmp_path, capsys):
    """A bank and its manifest are a user's files: a second freeze into them says so, and only --force writes."""
    out = tmp_path / "two.jsonl"
    earlier = {out: "an earlier bank\n", manifest_path(out): "{}\n"}
    for path, text in earlier.items():
        path.write_text(text, encoding="utf-8")
    argv = ["freeze", "--problems", str(write_problems(tmp_path / "problems.jsonl")), "--out", str(out)]
    line = assert_one_line_error(main(argv), capsys.readouterr(), out)
    assert line.endswith("two.jsonl and two.manifest.json exist already; pass --force to replace them, or another "
                         "--out"), line
    assert {path: path.read_text(encoding="utf-8") for path in earlier} == earlier, "a refused freeze wrote"
    assert main([*argv, "--force"]) == 0, capsys.readouterr().err
    assert out.read_bytes() == frozen[1].read_bytes(), "--force did not write the bank a first freeze writes"


@pytest.mark.e2e  # spawns a whole run
def test_audit_prints_the_header_first_and_the_verdict_last(tmp_path, capsys):
    """`replaytests audit` (a child pytest): the inputs, platform and drift before any test runs, the
    verdict and the report paths at the end."""
    import sys

    report = tmp_path / "report" / "quick"
    proc = forkserver.run([sys.executable, "-m", "replaytests.cli", "audit", "--rows", "1", "--precision", "fp32",
                           "--workers", "1", "--report-dir", str(report.parent), "--run-name", "quick", "--", "-k",
                           "replica_exact and crossing"], cwd=tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:]
    header = [i for i, line in enumerate(lines) if line.startswith(("replaytests platform:", "replaytests drift:"))]
    first_test = next(i for i, line in enumerate(lines) if "test_replica_stability.py" in line)
    assert len(header) == 2 and max(header) < first_test, lines[:first_test + 1]
    assert lines[-2:] == [f"report: {report / 'report.md'}", f"report: {report / 'report.html'}"], lines[-2:]
    assert "verdict: PASS (2 passed)" in lines, lines[-12:]


def test_freeze_leaves_no_temporary_files(frozen):
    out = frozen[1]
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == ["two.jsonl", "two.manifest.json"], f"files beside the frozen bank: {names}"


@pytest.mark.parametrize("value", ["banana", "0", "-2", "\u00b2", "99999"])
def test_audit_workers_is_checked_and_named_as_given(capsys, value):
    # Before: any value went on to pytest-xdist, whose error named -n, an option the user never typed.
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--workers", value])
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage lines
    assert exit_info.value.code == 4, f"exit {exit_info.value.code} for --workers {value!r}"
    assert line.endswith(f"argument --workers: expected 'auto' or a count of worker processes from 1 to 1024, "
                         f"got {value!r}"), line


@pytest.mark.parametrize(("extra", "expected"), [
    pytest.param([], None, id="none"),
    pytest.param(["--report-dir", "X"], "X", id="spaced"),
    pytest.param(["--replay-report-dir=Y"], "Y", id="namespaced-equals"),
    pytest.param(["--report-dir", "X", "-k", "live", "--report-dir=Z"], "Z", id="last-wins-as-in-pytest"),
    pytest.param(["--report-dir"], None, id="no-value"),
])
def test_audit_reads_the_report_dir_given_after_the_double_dash(extra, expected):
    # `replaytests audit -- --report-dir X`: pytest writes the run under X, so the closing verdict is read there.
    from replaytests.cli import _last_value

    assert _last_value(extra, "report-dir") == expected, f"{extra}: read {_last_value(extra, 'report-dir')!r}"


@pytest.mark.parametrize(("extra", "given"), [
    pytest.param([], ["--precision", "bf16"], id="the-audit-s-own"),
    pytest.param(["--precision", "fp32"], ["--precision", "fp32"], id="after-the-double-dash-replaces-it"),
    pytest.param(["--replay-precision=fp32"], ["--replay-precision=fp32"], id="namespaced-replaces-it"),
])
def test_the_audit_gives_its_child_each_option_once(monkeypatch, tmp_path, extra, given):
    """pytest refuses a one-value option given twice: an option after `--` replaces the audit's own."""
    from replaytests import cli

    seen = []
    monkeypatch.setattr(cli, "run_child", lambda argv: seen.append(argv) or 0)
    cli.main(["audit", "--precision", "bf16", "--report-dir", str(tmp_path), "--", *extra])
    argv = seen[0]
    spellings = [a for a in argv if a.split("=")[0] in ("--precision", "--replay-precision")]
    assert len(spellings) == 1 and argv[argv.index(spellings[0]):][:len(given)] == given, argv
    assert argv.count("--report-dir") == 1, argv


def test_a_command_stopped_by_ctrl_c_is_one_line_and_exits_2(monkeypatch, capsys):
    """Every command exits with the conformance run's statuses (errors.Exit): Ctrl-C is 2, not a traceback."""
    from replaytests import cli

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_check_model", stopped)
    code = cli.main(["check-model"])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"replaytests: check-model: interrupted (Ctrl-C); {cli.WHOLE}\n"), (code, err)
