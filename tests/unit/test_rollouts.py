"""`replaytests rollouts`: the mismatch measures on hand-computed references, the dump schema and its hostile
table (one line each, naming file:line and field, nothing written), the converters on their committed
fixtures, and on the tiny model (`model`): the suite's own live dump recomputed, and the must-fail control
(one token shifted by 0.1 nats reported at its row and position)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import forkserver
import numpy as np
import pytest
import scipy.special

from replaytests.cli import main
from replaytests.errors import DumpError
from replaytests.inputs.rollout_formats import FORMATS, convert
from replaytests.inputs.rollouts import SCHEMA, read_dump
from replaytests.outputs import stats
from replaytests.outputs.mismatch import Scored, Thresholds, bitwise, k3_terms, outside, row_measures, run_measures

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "rollouts"
MODEL = REPO / "fixtures" / "models" / "tiny-qwen2"
CONTRACT = REPO / "contracts" / "cpu-tiny.yaml"


def scored(live, replay, row="r") -> Scored:
    return Scored(row, np.arange(len(live)), np.asarray(live, dtype=np.float64), np.asarray(replay, dtype=np.float32))


# ---- the measures, against references computed outside the code under test ----

# d -> r - 1 - log r with r = exp(d): closed form, evaluated with mpmath at 50 digits (printed to 20).
K3_REFERENCE = [
    (0.0, 0.0),
    (0.25, 0.034025416687741484073),
    (-0.5, 0.1065306597126334236),
    (0.1, 0.0051709180756476248117),
    (-0.1, 0.0048374180359595731642),
    (math.log(2), 0.30685281944005469058),
    (-math.log(2), 0.19314718055994530942),
]


@pytest.mark.parametrize(("d", "expected"), K3_REFERENCE)
def test_k3_terms_match_the_closed_form_and_scipy(d, expected):
    assert k3_terms(np.array([d]))[0] == pytest.approx(expected, rel=1e-14, abs=1e-300)
    # scipy.special.kl_div(1, r) = 1 log(1 / r) - 1 + r: the same term by an independent implementation
    assert k3_terms(np.array([d]))[0] == pytest.approx(float(scipy.special.kl_div(1.0, math.exp(d))), rel=1e-9,
                                                       abs=1e-15)


def test_bitwise_is_the_float32_value_exactly():
    replay = np.array([-1.5, -0.1, 0.0], dtype=np.float32)
    live_exact = replay.astype(np.float64)  # a dump written from the float32 values (JSON round-trips them)
    assert bitwise(live_exact, replay).all()
    assert not bitwise(np.array([-1.5, -0.1, -0.0]), replay)[1:].any()  # -0.1 in float64 is not float32(-0.1)
    assert not bitwise(np.array([-0.0]), np.array([0.0], dtype=np.float32))[0]  # bits: -0.0 is not 0.0


def test_a_row_measured_by_hand():
    # live and replay chosen so that d = [0, 0.25, 0, -0.5, 0] exactly (every value is a float32).
    m = row_measures(scored([-1.0, -2.0, -3.0, -4.0, -5.0], [-1.0, -1.75, -3.0, -4.5, -5.0]), Thresholds())
    assert (m.tokens, m.bitwise_equal, m.abs_delta_max, m.abs_delta_median) == (5, 3, 0.5, 0.0)
    # numpy's linear interpolation (Hyndman & Fan type 7) of sorted |d| = [0, 0, 0, 0.25, 0.5] at 0.99:
    # index 0.99 * 4 = 3.96, so 0.25 + 0.96 * (0.5 - 0.25) = 0.49
    assert m.abs_delta_p99 == pytest.approx(0.49, rel=1e-15)
    assert m.k3 == pytest.approx(0.028111215280074981535, rel=1e-14)  # (k3(0.25) + k3(-0.5)) / 5, mpmath
    assert (m.outside_bounds, m.first_exceeding) == (0, 1)  # exp(0.25), exp(-0.5) inside [0.5, 2]; 0.25 > 0.05
    narrow = row_measures(scored([-1.0, -2.0, -3.0, -4.0, -5.0], [-1.0, -1.75, -3.0, -4.5, -5.0]),
                          Thresholds(0.7, 1.2, 0.3))
    assert (narrow.outside_bounds, narrow.first_exceeding) == (2, 3)


def test_ratio_bounds_are_inclusive():
    assert not outside(np.log(np.array([0.5, 2.0])), Thresholds()).any()
    assert outside(np.array([math.log(0.5) - 1e-9, math.log(2) + 1e-9]), Thresholds()).all()


@pytest.mark.parametrize(("low", "high", "delta"), [(0, 2, 0.1), (1.5, 2, 0.1), (0.5, 0.9, 0.1), (0.5, 2, -1),
                                                    (0.5, math.inf, 0.1), (0.5, 2, math.nan)])
def test_bad_thresholds_are_refused(low, high, delta):
    with pytest.raises(ValueError):
        Thresholds(low, high, delta)


def test_run_intervals_resample_rows_not_tokens():
    # 10 rows of 100 tokens, each row all equal or all unequal: 1,000 tokens, but 10 independent draws. A
    # token-level interval would be about +-0.03; the row-level one must be about +-0.3.
    rows = [scored([-1.0] * 100, [-1.0 if i % 2 else -1.5] * 100, f"r{i}") for i in range(10)]
    run = run_measures(rows, Thresholds(), seed=3, resamples=2000)
    assert run.bitwise_equal.estimate == 0.5 and run.bitwise_equal.n == 10
    assert run.bitwise_equal.ci_high - run.bitwise_equal.ci_low > 0.4
    token_level = stats.wilson(500, 1000)
    assert token_level.ci_high - token_level.ci_low < 0.07
    again = run_measures(rows, Thresholds(), seed=3, resamples=2000)
    assert again.to_json() == run.to_json()  # seeded: the same numbers twice


def test_cluster_bootstrap_of_constant_clusters_is_a_point():
    out = stats.cluster_bootstrap({"x": [2.0, 4.0, 6.0]}, [1, 2, 3], seed=0, resamples=100)["x"]
    assert (out.estimate, out.ci_low, out.ci_high, out.n) == (2.0, 2.0, 2.0, 3)


def test_worst_tokens_and_failures_name_row_and_position():
    rows = [scored([-1.0, -1.0], [-1.0, -1.0], "a"), scored([-1.0, -2.0, -3.0], [-1.0, -2.5, -3.0], "b")]
    run = run_measures(rows, Thresholds(), resamples=100)
    assert (run.worst[0].row, run.worst[0].position, run.worst[0].delta) == ("b", 1, -0.5)
    assert run.failures() == ["row b: |delta logp| > 0.05 first at position 1"]
    assert (run.rows_exceeding.k, run.rows_exceeding.n) == (1, 2)


def test_user_text_in_the_markdown_report_is_text_not_markup():
    """A row id and paths from the dump reach rollouts.md as literal text: a `|` splits no table cell, a tag
    is no HTML."""
    from replaytests.outputs import rollout_report

    hostile = "r|<img src=x onerror=alert(1)>"
    run = run_measures([scored([-1.0, -2.0], [-1.0, -2.5], hostile)], Thresholds(), resamples=10)
    meta = {"dump": f"/d/{hostile}.jsonl", "model": "/m|x", "contract": "c<b>", "precision": "bf16",
            "platform": "p", "tokens_per_second": 1.0}
    text = rollout_report.markdown(rollout_report.build(run, meta), run, "verdict: PASS")
    assert "<img" not in text and "<b>" not in text and "r|<" not in text, text
    rows = [line for line in text.splitlines() if line.startswith("| r")]
    assert rows and all(line.count(" | ") == line.replace("\\|", "").count(" | ") for line in rows), rows


# ---- the dump, and the command's bad input ----

def line(**fields) -> dict:
    return {"schema": SCHEMA, "prompt_ids": [1, 2, 3], "response_ids": [4, 5], "logprobs": [-0.5, -1.25], **fields}


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines),
                    encoding="utf-8")
    return path


def test_a_dump_in_the_schema_is_read(tmp_path):
    dump = read_dump(write_lines(tmp_path / "ok.jsonl", [
        line(id="a", engine="vllm", version="0.11", dtype="bfloat16", model="m",
             sampling={"temperature": 1.0, "top_p": 1, "top_k": None, "seed": 7}), line()]))
    assert [row.id for row in dump.rows] == ["a", "line-2"] and dump.tokens == 4
    assert dict(dump.rows[0].meta)["sampling"] == (("temperature", 1.0), ("top_p", 1), ("top_k", None), ("seed", 7))


RAW = f'{{"schema": "{SCHEMA}", "prompt_ids": [1], "response_ids": [4], '  # a line JSON's writer would not write

HOSTILE = [  # (id, lines, the field the one line must name, words it must hold)
    ("not-json", ["{\"schema\": "], None, "not valid JSON"),
    ("not-an-object", ["[1, 2]"], None, "expected a JSON object"),
    ("missing-field", [{k: v for k, v in line().items() if k != "logprobs"}], "logprobs", "missing"),
    ("wrong-schema", [line(schema="replaytests.rollouts/9")], "schema", "expected"),
    ("unknown-field", [line(logprob=[-1.0])], "logprob", "not a field"),
    ("ids-not-a-list", [line(prompt_ids="1 2 3")], "prompt_ids", "expected a list"),
    ("empty-prompt", [line(prompt_ids=[])], "prompt_ids", "empty"),
    ("empty-response", [line(response_ids=[], logprobs=[])], "response_ids", "empty"),
    ("id-a-float", [line(response_ids=[4, 5.0])], "response_ids[1]", "token id"),
    ("id-a-string", [line(prompt_ids=[1, "2", 3])], "prompt_ids[1]", "token id"),
    ("id-a-bool", [line(prompt_ids=[1, True, 3])], "prompt_ids[1]", "token id"),
    ("id-negative", [line(response_ids=[4, -5])], "response_ids[1]", "token id"),
    ("id-outside-the-vocabulary", [line(), line(response_ids=[4, 320])], "response_ids[1]", "vocabulary"),
    ("ragged", [line(logprobs=[-0.5])], "logprobs", "1 values for 2 response tokens"),
    ("nan", [RAW + '"logprobs": [NaN]}'],
     "logprobs[0]", "NaN"),
    ("infinity", [RAW + '"logprobs": [-Infinity]}'],
     "logprobs[0]", "Infinity"),
    ("too-large", [RAW + '"logprobs": [-1e999]}'],
     "logprobs[0]", "finite"),
    ("logprob-a-string", [line(logprobs=[-0.5, "-1"])], "logprobs[1]", "expected a number"),
    ("logprob-positive", [line(logprobs=[-0.5, 0.25])], "logprobs[1]", "above 0"),
    ("longer-than-the-context", [line(prompt_ids=[1] * 1000, response_ids=[4] * 30, logprobs=[-1.0] * 30)],
     "response_ids", "1024 positions"),
    ("duplicate-id", [line(id="x"), line(id="x")], "id", "line 1's id"),
    ("duplicate-key", [RAW + '"prompt_ids": [2], "logprobs": [-1]}'], "prompt_ids", "written twice"),
    ("sampling-not-an-object", [line(sampling=[1.0])], "sampling", "expected an object"),
    ("sampling-unknown", [line(sampling={"temp": 1.0})], "sampling.temp", "not a sampling setting"),
    ("sampling-a-string", [line(sampling={"temperature": "1"})], "sampling.temperature", "expected a number"),
    ("engine-control-character", [line(engine="v\x1bllm")], "engine", "control character"),
    ("empty-file", [], None, "holds no rollout"),
]


@pytest.mark.parametrize(("lines", "field", "words"), [pytest.param(*case[1:], id=case[0]) for case in HOSTILE])
def test_a_bad_dump_is_one_line_naming_file_line_and_field_and_nothing_is_written(tmp_path, capsys, lines, field,
                                                                                  words):
    dump = write_lines(tmp_path / "dump.jsonl", lines)
    out = tmp_path / "out"
    code = main(["rollouts", "check", str(dump), "--out", str(out), "--model", str(MODEL),
                 "--contract", str(CONTRACT)])
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert code == 4 and len(errors) == 1 and captured.out == "", (code, captured)
    message = errors[0]
    assert message.startswith(f"replaytests: error: {dump}"), message
    assert words in message, message
    if field is not None:
        assert f"{dump}:{len(lines)}: field {field!r}" in message, message
    assert not out.exists()


def test_the_hostile_table_is_at_least_fifteen_cases():
    assert len(HOSTILE) >= 15


def test_a_dump_that_is_not_a_file_is_one_line(tmp_path, capsys):
    code = main(["rollouts", "check", str(tmp_path), "--out", str(tmp_path / "out")])
    assert code == 4 and len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["--ratio-bounds", "2,0.5"], ["--ratio-bounds", "x"], ["--delta-threshold", "-1"],
                                  ["--delta-threshold", "nan"]])
def test_bad_thresholds_on_the_command_line_exit_4(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as stopped:
        main(["rollouts", "check", str(tmp_path / "d.jsonl"), *argv])
    assert stopped.value.code == 4


# ---- the converters, on fixtures made from each project's documented example ----

@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_converter_reproduces_its_committed_fixture(tmp_path, kind):
    out = tmp_path / f"{kind}.rollouts.jsonl"
    rows = convert(kind, FIXTURES / f"{kind}.jsonl", out)
    assert out.read_bytes() == (FIXTURES / f"{kind}.rollouts.jsonl").read_bytes()
    assert rows == len(read_dump(out).rows)


def test_the_converted_rows_map_the_documented_fields():
    verl = read_dump(FIXTURES / "verl.rollouts.jsonl").rows[0]  # left padding and right padding removed
    assert (verl.prompt_ids, verl.response_ids, verl.logprobs[-1]) == ((1, 2, 3, 4), tuple(range(5, 13)), -0.25)
    trl = read_dump(FIXTURES / "trl.rollouts.jsonl").rows  # n = 1: completion i of prompt i
    assert [(r.prompt_ids, r.response_ids, r.logprobs) for r in trl] == [
        ((101, 102), (103, 104, 105), (-0.1, -0.2, -0.3)), ((201, 202), (203, 204, 205), (-0.4, -0.5, -0.6))]
    openrlhf = read_dump(FIXTURES / "openrlhf.rollouts.jsonl").rows[0]  # the action range, its log-probs
    assert (openrlhf.prompt_ids, openrlhf.response_ids) == ((31, 32, 33, 34), (35, 36, 37, 38, 39))
    vllm = read_dump(FIXTURES / "vllm.rollouts.jsonl").rows[0]
    assert (vllm.id, vllm.prompt_ids, vllm.logprobs) == ("cmpl-example/0", (51, 52, 53, 54), (-0.5, -1.75, -0.125))


BAD_CONVERSIONS = [
    ("verl", {"prompts": [1], "responses": [2, 3], "attention_mask": [1, 1, 1], "response_mask": [1, 0],
              "rollout_log_probs": [-1.0, 0.0]}, "response_mask", "multi-turn"),
    ("verl", {"prompts": [1], "responses": [2], "attention_mask": [1], "rollout_log_probs": [-1.0]},
     "attention_mask", "entries"),
    ("verl", {"prompts": [1], "responses": [2], "attention_mask": [1, 1]}, "rollout_log_probs",
     "calculate_log_probs=True"),
    ("trl", {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[[-1.0]]], "logprob_token_ids": [[[9]]]},
     "logprobs[0][0]", "chosen token"),
    ("trl", {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[[None]]], "logprob_token_ids": [[[2]]]},
     "logprobs[0]", "expected a number"),
    ("trl", {"prompt_ids": [[1]], "completion_ids": [[6]], "logprobs": [[[-0.1]]], "logprob_token_ids": [[[5, 6]]]},
     "logprobs[0][0]", "one log-probability per id"),
    ("trl", {"prompt_ids": [[1]], "completion_ids": [[6]], "logprobs": [[{"a": -0.1}]], "logprob_token_ids": [[[6]]]},
     "logprobs[0][0]", "one log-probability per id"),
    ("verl", {"prompts": [0, 1], "responses": [2], "attention_mask": [2, 1, 1], "rollout_log_probs": [-1.0]},
     "attention_mask", "0s and 1s"),
    ("verl", {"prompts": [0, 1], "responses": [2], "attention_mask": [10**30, 1, 1], "rollout_log_probs": [-1.0]},
     "attention_mask", "0s and 1s"),
    ("openrlhf", {"observation_tokens": [1, 2, 3, 4], "action_ranges": [[1, 2], [3, 4]],
                  "rollout_log_probs": [0.0] * 4}, "action_ranges", "multi-turn"),
    ("vllm", {"id": "c", "choices": [{"index": 0, "logprobs": {"token_logprobs": [-1.0]}, "token_ids": [2]}]},
     "choices[0].prompt_token_ids", "return_token_ids"),
    ("vllm", {"id": "c"}, "choices", "missing"),
    ("vllm", {"id": "c", "choices": [{"index": 0, "prompt_token_ids": [1], "token_ids": [2, 3],
                                      "logprobs": {"token_logprobs": [-1.0, -9999.0]}}]},
     "choices[0].logprobs.token_logprobs[1]", "stand-in for -inf"),
    ("vllm", {"id": "c", "choices": [{"index": 0, "prompt_token_ids": [1], "token_ids": [2],
                                      "logprobs": {"token_logprobs": [-1.0]}}] * 2}, "id", "line 1 already"),
]


@pytest.mark.parametrize(("kind", "value", "field", "words"), BAD_CONVERSIONS,
                         ids=[f"{kind}-{field}-{words}".replace(" ", "-") for kind, _, field, words in BAD_CONVERSIONS])
def test_a_bad_framework_file_is_one_line_and_nothing_is_written(tmp_path, capsys, kind, value, field, words):
    source, out = write_lines(tmp_path / "in.jsonl", [value]), tmp_path / "out.jsonl"
    code = main(["rollouts", "convert", "--from", kind, str(source), str(out)])
    errors = capsys.readouterr().err.splitlines()
    assert code == 4 and len(errors) == 1, errors
    assert f"{source}:1:" in errors[0] and repr(field) in errors[0] and words in errors[0], errors[0]
    assert not out.exists()


def test_a_verl_group_sharing_one_uid_converts_to_one_row_per_sample(tmp_path, capsys):
    """verl gives a prompt's n samples one uid: each row's id is its uid and its line, distinct; an id met twice
    (two lines of one request_id) is refused before anything is written."""
    sample = {"prompts": [0, 1], "responses": [2, 0], "attention_mask": [0, 1, 1, 0], "rollout_log_probs": [-1.0, 0.0]}
    source, out = write_lines(tmp_path / "in.jsonl", [sample | {"uid": "u"}, sample | {"uid": "u"}]), tmp_path / "out"
    assert main(["rollouts", "convert", "--from", "verl", str(source), str(out)]) == 0
    assert [row.id for row in read_dump(out).rows] == ["u/line-1", "u/line-2"]
    source = write_lines(tmp_path / "twice.jsonl", [sample | {"request_id": "r"}, sample | {"request_id": "r"}])
    assert main(["rollouts", "convert", "--from", "verl", str(source), str(tmp_path / "twice")]) == 4
    (error,) = capsys.readouterr().err.splitlines()
    assert f"{source}:2:" in error and "'r' is the id of a row of line 1 already" in error, error
    assert not (tmp_path / "twice").exists()


def test_convert_never_replaces_a_file_without_force(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("mine\n", encoding="utf-8")
    assert main(["rollouts", "convert", "--from", "trl", str(FIXTURES / "trl.jsonl"), str(out)]) == 4
    assert out.read_text(encoding="utf-8") == "mine\n"
    assert main(["rollouts", "convert", "--from", "trl", str(FIXTURES / "trl.jsonl"), str(out), "--force"]) == 0
    assert out.read_bytes() == (FIXTURES / "trl.rollouts.jsonl").read_bytes()


# ---- on the tiny model ----

@pytest.fixture(scope="module")
def live_dump(tmp_path_factory, tiny_contract) -> Path:
    """The suite's own rollouts: the tiny model decoding greedily at FP32, one token per call, each chosen
    token's log-probability recorded as the recompute reads it (engine.hf.logprobs.chosen_logprobs)."""
    from replaytests.engine.hf.logprobs import Scorer

    scorer = Scorer.load(MODEL, tiny_contract, "fp32")
    rows = []
    for i in range(4):
        prompt = [(7 * i + 3 * k) % 250 + 1 for k in range(5 + i)]
        tokens, logprobs = scorer.generate(prompt, 24)
        rows.append(line(id=f"row-{i}", prompt_ids=prompt, response_ids=tokens, logprobs=logprobs, engine="replaytests",
                         dtype="float32", sampling={"temperature": 0}))
    return write_lines(tmp_path_factory.mktemp("rollouts") / "live.jsonl", rows)


@pytest.mark.model
@pytest.mark.parametrize("cell", ["bf16", "fp32"])
def test_a_greedy_live_logprob_is_the_largest_of_its_step(tiny_contract, cell):
    # The argmax has probability at least 1 / V: its log-probability is at least -log V. Token ids above 256 do
    # not survive a trip through a BF16 tensor (305 becomes 304), so the tiny model's ids 256-319 catch a token
    # gathered through the logits' dtype.
    from replaytests.engine.hf.logprobs import Scorer

    scorer = Scorer.load(MODEL, tiny_contract, cell)
    for prompt in ([1, 4, 7, 10, 13, 16], list(range(106, 167, 3))):
        tokens, logprobs = scorer.generate(prompt, 16)
        assert all(lp >= -math.log(320) for lp in logprobs), list(zip(tokens, logprobs, strict=True))
    assert any(token > 256 for token in tokens)  # the case that matters was reached


def check(dump: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = main(["rollouts", "check", str(dump), "--out", str(out), "--model", str(MODEL), "--contract",
                 str(CONTRACT), "--precision", "fp32", *extra])
    return code, json.loads((out / "rollouts.json").read_text(encoding="utf-8"))


@pytest.mark.model
def test_the_suites_own_live_dump_recomputed(live_dump, tmp_path, capsys):
    code, report = check(live_dump, tmp_path / "out", "--gate")
    printed = capsys.readouterr().out
    run = report["run"]
    assert code == 0 and report["schema"] == "replaytests.rollouts-report/1" and run["rows"] == 4
    assert run["tokens"] == 96 and [row["row"] for row in report["rows"]] == [f"row-{i}" for i in range(4)]
    assert all(0 <= row["bitwise_equal"] <= row["tokens"] == 24 and row["k3"] >= 0 for row in report["rows"])
    assert run["k3"]["method"] == "cluster-percentile-bootstrap" and run["k3"]["n"] == 4
    assert run["abs_delta_max"] < Thresholds().delta  # FP32 live vs FP32 prefill: near, not necessarily equal
    assert "| measure | value |" in printed and "worst tokens:" in printed and "verdict: PASS" in printed
    assert (tmp_path / "out" / "rollouts.md").read_text(encoding="utf-8").startswith("# Rollouts check")


@pytest.mark.model
def test_the_recompute_is_bitwise_equal_to_itself(live_dump, tmp_path):
    # The recompute's own float32 numbers written as a dump (JSON round-trips them): every token bitwise equal.
    _, first = check(live_dump, tmp_path / "first")
    worst = {(w["row"], w["position"]): w["replay"] for w in first["run"]["worst"]}
    rows = [json.loads(text) for text in live_dump.read_text(encoding="utf-8").splitlines()]
    from replaytests.engine.hf.logprobs import Scorer
    from replaytests.inputs.contract import load_contract

    scorer = Scorer.load(MODEL, load_contract(CONTRACT), "fp32")
    for row in rows:
        row["logprobs"] = [float(x) for x in scorer.recompute(row["prompt_ids"], row["response_ids"])]
    own = write_lines(tmp_path / "own.jsonl", rows)
    code, report = check(own, tmp_path / "again", "--gate")
    assert code == 0 and report["run"]["abs_delta_max"] == 0.0
    assert all(row["bitwise_equal"] == row["tokens"] for row in report["rows"])
    assert all(rows[int(r[4:])]["logprobs"][p] == value for (r, p), value in worst.items())


@pytest.mark.model
def test_must_fail_one_token_shifted_by_a_tenth_of_a_nat_is_reported_at_its_row_and_position(live_dump, tmp_path,
                                                                                             capsys):
    rows = [json.loads(text) for text in live_dump.read_text(encoding="utf-8").splitlines()]
    rows[2]["logprobs"][7] -= 0.1
    shifted = write_lines(tmp_path / "shifted.jsonl", rows)
    code, report = check(shifted, tmp_path / "out", "--gate")
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert [row["first_exceeding"] for row in report["rows"]] == [None, None, 7, None]
    worst = report["run"]["worst"][0]
    assert (worst["row"], worst["position"]) == ("row-2", 7) and worst["delta"] == pytest.approx(0.1, abs=1e-4)
    assert "row row-2: |delta logp| > 0.05 first at position 7" in printed
    control_code, _ = check(live_dump, tmp_path / "control", "--gate")  # the same dump unshifted passes
    assert control_code == 0


@pytest.mark.model
@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_check_reads_each_converted_fixture(tmp_path, kind):
    code, report = check(FIXTURES / f"{kind}.rollouts.jsonl", tmp_path / "out")
    assert code == 0 and report["run"]["rows"] == len(read_dump(FIXTURES / f"{kind}.rollouts.jsonl").rows)


def test_a_dump_error_names_the_file(tmp_path):
    with pytest.raises(DumpError, match=r"no-such\.jsonl"):
        read_dump(tmp_path / "no-such.jsonl")


@pytest.mark.e2e
def test_the_benchmark_runs_at_toy_sizes_and_writes_its_tables(tmp_path):
    import sys

    out = tmp_path / "rollouts.json"
    proc = forkserver.run([sys.executable, str(REPO / "benchmarks" / "rollouts.py"), "--rows", "2", "--length", "8",
                           "--prompt", "4", "--repeats", "1", "--precision", "fp32", "--out", str(out)], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["tokens"] == 16 and set(result["ratio_to_bare"]) == {"bare", "recompute", "check"}
    assert out.with_suffix(".md").read_text(encoding="utf-8") in proc.stdout
