"""replaytests.outputs.history: `replaytests history append` (summary line, run.json, duplicate refusal, atomic
write) and `replaytests history show` (table in date order, HTML page with plots), with bad input."""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from pathlib import Path

import pytest
from test_compare import diverging, make
from test_report import write_ledger_file

from replaytests import files
from replaytests.cli import main
from replaytests.files import sha256_file
from replaytests.outputs import history
from replaytests.outputs.stats import wilson

RUN_JSON = {"contract": {"name": "cpu-tiny", "sha256": "c" * 64}, "platform": {"software.torch": "2.13.0"},
            "options": {"precision": "bf16"}}


@pytest.fixture
def nights(tmp_path):
    """Two run directories: night 1 diverges on 3 of 12 crossing rows, night 2 on 6; night 1 has a run.json."""
    paths = []
    for night, divergent in ((1, 3), (2, 6)):
        records = [*diverging("crossing", 12, divergent), make("bridge", "r0")]
        paths.append(write_ledger_file(tmp_path / f"night{night}" / "ledger.jsonl", records).parent)
    (paths[0] / "run.json").write_text(json.dumps(RUN_JSON), encoding="utf-8")
    return paths


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_append_summarizes_the_run(nights, tmp_path, capsys):
    into = tmp_path / "history.jsonl"
    code = main(["history", "append", str(nights[0]), "--into", str(into), "--label", "v1", "--date", "2026-01-02"])
    assert code == 0, capsys.readouterr().err
    [entry] = lines(into)
    expected = {"schema": "replaytests.history/1", "date": "2026-01-02T00:00:00", "label": "v1",
                "ledger": str(nights[0] / "ledger.jsonl"), "ledger_sha256": sha256_file(nights[0] / "ledger.jsonl"),
                "contract": RUN_JSON["contract"], "platform": RUN_JSON["platform"]}
    assert {k: entry[k] for k in expected} == expected, entry
    crossing = entry["families"]["crossing"]["bf16"]
    assert (crossing["rows"], crossing["excluded"], crossing["replicas_exact"]) == (12, 0, wilson(12, 12).to_json()), \
        crossing
    divergences = crossing["pairs"]["incremental~prefill"]
    assert divergences["suffix_divergence"] == wilson(3, 12).to_json(), divergences["suffix_divergence"]
    assert set(divergences) == {"suffix_divergence", "answer_divergence", "correctness_divergence"}, divergences
    assert "replicas_exact" not in entry["families"]["bridge"]["bf16"], "the bridge has no replicas"


def test_append_without_run_json_or_date(nights, tmp_path):
    entry = history.append(nights[1] / "ledger.jsonl", tmp_path / "h.jsonl")
    assert (entry["contract"], entry["platform"], entry["label"]) == (None, None, None), entry
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", entry["date"]), f"default date {entry['date']}"


def test_append_dates_and_labels_a_run_by_its_run_json(nights, tmp_path):
    """A run directory's own start time and name date and label its line (not the time of appending)."""
    run = RUN_JSON | {"run": {"name": "20260102-020000-audit", "started": "2026-01-02T02:00:00+00:00"}}
    (nights[1] / "run.json").write_text(json.dumps(run), encoding="utf-8")
    entry = history.append(nights[1], tmp_path / "h.jsonl")
    assert (entry["date"], entry["label"]) == ("2026-01-02T02:00:00+00:00", "20260102-020000-audit"), entry
    given = history.entry(nights[1], "v2", "2026-02-01")
    assert (given["date"], given["label"]) == ("2026-02-01T00:00:00", "v2"), "--date and --label win"


def test_causal_outcomes_are_tracked(repo, tmp_path, capsys):
    """A committed baseline's transplant and replication outcomes reach the history and its table (the one made on
    the Xeon: cpu-tiny/ holds the same families and ten times its bytes, in families this test does not read)."""
    into = tmp_path / "h.jsonl"
    entry = history.append(repo / "fixtures" / "ledgers" / "cpu-tiny-xeon", into)
    assert set(entry["causal"]) == {"transplant", "replication"}, entry["causal"]
    assert entry["causal"]["replication"]["label"] in ("strong replication", "replicated, not strong",
                                                       "not replicated"), entry["causal"]["replication"]
    rows = history.table(history.read_history(into)).rows
    cells = {row[2]: row[-1] for row in rows}
    assert cells["transplant"].startswith("follows donor ") and "third 0/" in cells["transplant"], cells
    assert cells["replication"].endswith(entry["causal"]["replication"]["label"]), cells
    assert cells["crossing"] == "-", cells


def test_append_refuses_the_same_run_twice(nights, tmp_path, capsys):
    into = tmp_path / "history.jsonl"
    assert main(["history", "append", str(nights[0]), "--into", str(into), "--date", "2026-01-02"]) == 0
    before = into.read_text(encoding="utf-8")
    code = main(["history", "append", str(nights[0] / "ledger.jsonl"), "--into", str(into)])
    err = capsys.readouterr().err
    assert code == 4, f"exit {code}"
    assert re.fullmatch(rf"replaytests: error: {re.escape(str(into))}: this ledger is already in the history \(run of "
                        r"2026-01-02T00:00:00, label None, ledger sha256 [0-9a-f]{12}\.\.\.\); not appended twice\n",
                        err), err
    assert into.read_text(encoding="utf-8") == before, "the history changed on a refused append"


def test_append_is_atomic(nights, tmp_path, monkeypatch):
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into)
    before = into.read_text(encoding="utf-8")

    def crash(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(history.HistoryError, match=r"cannot write history: No space left on device$"):
        history.append(nights[1], into)
    assert into.read_text(encoding="utf-8") == before, "a failed append changed the history"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.jsonl", "night1", "night2"], "temporary file left"


@pytest.fixture
def filled(nights, tmp_path):
    """A history whose lines are out of date order (night 2 appended first, dated later)."""
    into = tmp_path / "history.jsonl"
    history.append(nights[1], into, "<b>night 2</b>", "2026-01-03T02:00:00+00:00")
    history.append(nights[0], into, "night 1", "2026-01-02T02:00:00+00:00")
    return into


def test_show_prints_one_line_per_run_family_and_precision_in_date_order(filled, capsys):
    assert main(["history", "show", str(filled)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["date", "label", "family", "precision", "rows"], out[0]
    crossing = [line for line in out if " crossing " in line]
    assert [line[:16] for line in crossing] == ["2026-01-02 02:00", "2026-01-03 02:00"], crossing
    cells = [re.split(r"\s{2,}", line) for line in crossing]
    assert cells[0][6:10] == ["12/12", "3/12", "0/12", "0/12"], crossing[0]
    assert cells[1][7] == "6/12", crossing[1]
    assert len(out) == 5, f"header and 2 runs x (crossing, bridge): {out}"


def test_show_writes_a_standalone_page_with_a_plot_per_series(filled, tmp_path, capsys):
    page = tmp_path / "out" / "history.html"
    assert main(["history", "show", str(filled), "--html", str(page)]) == 0, capsys.readouterr().err
    html = page.read_text(encoding="utf-8")
    titles = re.findall(r"<svg [^>]*><title>([^<]*)</title>", html)
    assert [t.split(":")[0] for t in titles] == ["crossing incremental~prefill", "bridge live~incremental"], titles
    points = re.findall(r"<title>([^<]*(?:suffix|answer): \d+/\d+)</title>", html)
    assert len(points) == 2 * 2 * 2, f"a point per run, plot and measure (suffix, answer): {points}"
    assert "night 1 bf16 suffix: 3/12" in points and "&lt;b&gt;night 2&lt;/b&gt; bf16 suffix: 6/12" in points, points
    assert html.count("<polygon ") == 2 * 2, "each series' intervals as a band"
    assert "&lt;b&gt;night 2&lt;/b&gt;" in html and "<b>night" not in html, "the label is not escaped"
    assert not re.search(r"<script\b|\s(src|href)=", html), "the page is not standalone"


def test_a_line_another_version_wrote_is_drawn_from_what_it_holds(nights, tmp_path, capsys):
    """A history line whose proportions hold a key this version does not know, or at n = 0 no rate (the reader
    requires one only where n > 0), is shown and drawn all the same."""
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into, "night 1", "2026-01-02T02:00:00+00:00")
    (entry,) = lines(into)
    pairs = entry["families"]["crossing"]["bf16"]["pairs"]["incremental~prefill"]
    pairs["suffix_divergence"] |= {"note": "a later version's field"}
    pairs["answer_divergence"] = {"k": 0, "n": 0}
    into.write_text(json.dumps(entry) + "\n", encoding="utf-8")
    page = tmp_path / "history.html"
    assert main(["history", "show", str(into), "--html", str(page)]) == 0, capsys.readouterr().err
    assert "night 1 bf16 suffix: 3/12" in page.read_text(encoding="utf-8"), "the suffix series is not drawn"
    assert " 0/0 " in capsys.readouterr().out.splitlines()[1] + " ", "the answer count at n = 0 is not shown"


def test_show_over_a_page_needs_force(filled, tmp_path, capsys):
    """An --html page that exists is a user's file: refused in one line, replaced only with --force."""
    page = tmp_path / "history.html"
    page.write_text("last week's page\n", encoding="utf-8")
    assert main(["history", "show", str(filled), "--html", str(page)]) == 4
    err = capsys.readouterr().err
    assert err == (f"replaytests: error: --html {page}: history.html exists already; pass --force to replace it, "
                   "or another --html\n"), err
    assert page.read_text(encoding="utf-8") == "last week's page\n", "a refused page was written"
    assert main(["history", "show", str(filled), "--html", str(page), "--force"]) == 0, capsys.readouterr().err
    assert page.read_text(encoding="utf-8").startswith("<!doctype html>"), "--force did not write the page"


@pytest.mark.parametrize(("content", "message"), [
    pytest.param(None, "cannot read history: No such file or directory", id="missing"),
    pytest.param("", "empty history (no runs)", id="empty"),
    pytest.param('{"schema": "replaytests.history/0"}\n',
                 ":1: field 'schema' is 'replaytests.history/0', expected 'replaytests.history/1'", id="other-schema"),
    pytest.param('{"schema": "replaytests.hist', ":1: not valid JSON", id="truncated"),
])
def test_show_bad_history_is_one_line_exit_4(tmp_path, capsys, content, message):
    path = tmp_path / "history.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    code = main(["history", "show", str(path)])
    err = capsys.readouterr().err
    assert (code, err.startswith(f"replaytests: error: {path}")) == (4, True), f"exit {code}, stderr {err!r}"
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--date", "last night"], "--date 'last night': expected an ISO 8601 date", id="bad-date"),
    pytest.param([], "empty ledger (no records)", id="empty-ledger"),
])
def test_append_bad_input_is_one_line_exit_4(tmp_path, capsys, args, message):
    ledger = write_ledger_file(tmp_path / "run" / "ledger.jsonl", [])
    if "--date" in args:
        write_ledger_file(ledger, [make("bridge", "r0")])
    code = main(["history", "append", str(ledger.parent), "--into", str(tmp_path / "h.jsonl"), *args])
    err = capsys.readouterr().err
    assert (code, message in err) == (4, True), f"exit {code}, stderr {err!r}"
    assert not (tmp_path / "h.jsonl").exists(), "a refused append created the history"


def _append_all(sources: list[str], into: str) -> None:
    for source in sources:
        history.append(source, into)


def test_appends_from_several_processes_keep_every_line(tmp_path):
    """Four processes appending six runs each into one history: every one of the 24 lines is kept (each
    append reads what the last one wrote, under a lock)."""
    import multiprocessing

    sources = [str(write_ledger_file(tmp_path / f"run{i}" / "ledger.jsonl",
                                     [*diverging("crossing", 4, i % 3), make("bridge", f"r{i}")]).parent)
               for i in range(24)]
    into = tmp_path / "history.jsonl"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_all, args=(sources[i::4], str(into))) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * 4, "an append failed"
    kept = {Path(entry["ledger"]).parent.name for entry in lines(into)}
    lost = sorted({Path(source).name for source in sources} - kept)
    assert not lost, f"{len(lost)} of 24 appended runs lost: {', '.join(lost)}"


@pytest.mark.parametrize(("run", "message"), [
    pytest.param({"run": {"name": 7}}, r"field 'label' must be a string or null, got 7", id="integer-name"),
    pytest.param({"run": {"started": "yesterday"}}, r"field 'date' is not an ISO 8601 date: 'yesterday'",
                 id="started-not-a-date"),
])
def test_append_refuses_what_show_would_refuse(nights, tmp_path, run, message):
    (nights[1] / "run.json").write_text(json.dumps(run), encoding="utf-8")
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into)
    with pytest.raises(history.HistoryError, match=message):
        history.append(nights[1], into)
    assert len(history.read_history(into)) == 1, "the history became unreadable or gained a line"


def test_show_orders_runs_by_instant_across_time_zones(nights, tmp_path):
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into, "first", "2026-01-02T02:00:00+02:00")  # 00:00 UTC
    history.append(nights[1], into, "second", "2026-01-02T01:00:00+00:00")
    assert [e["label"] for e in history.read_history(into)] == ["first", "second"]


def test_append_refuses_a_read_only_history(nights, tmp_path, capsys):
    """A new file renamed over a read-only one would succeed (only the directory must be writable) and leave
    the history writable."""
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into)
    into.chmod(0o444)
    before = into.read_bytes()
    code = main(["history", "append", str(nights[1]), "--into", str(into)])
    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (4, 1), f"exit {code}, stderr {err!r}"
    assert f"{into}: the history is read-only (mode 0444); not appended" in err, err
    assert (into.read_bytes(), oct(into.stat().st_mode & 0o777)) == (before, "0o444"), "the history was changed"


def test_append_keeps_the_history_mode(nights, tmp_path):
    into = tmp_path / "history.jsonl"
    history.append(nights[0], into)
    into.chmod(0o640)
    history.append(nights[1], into)
    assert (len(lines(into)), oct(into.stat().st_mode & 0o777)) == (2, "0o640"), "the append reset the mode"


@pytest.fixture
def held(tmp_path, monkeypatch):
    """The lock on the history's directory, held by this process (as by a hung append) until released."""
    monkeypatch.setattr(files, "LOCK_NOTICE", 0.1)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield lambda: fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def test_append_says_what_it_waits_for_and_gives_up(nights, tmp_path, capsys, held):
    into = tmp_path / "history.jsonl"
    code = main(["history", "append", str(nights[0]), "--into", str(into), "--lock-timeout", "0.5"])
    waiting, error = capsys.readouterr().err.splitlines()
    lock = f"the lock on {tmp_path}/, held by process {os.getpid()} (another writer of it"
    assert waiting == f"replaytests: {into}: waiting up to 0.5 s for {lock})", waiting
    assert (code, error.startswith(f"replaytests: error: {into}: gave up after 0.5 s waiting for {lock}; ")) == \
        (4, True), f"exit {code}, {error!r}"
    assert not into.exists(), "appended without the lock"


def test_append_waits_for_a_lock_released_in_time(nights, tmp_path, capsys, held):
    threading.Timer(0.5, held).start()
    into = tmp_path / "history.jsonl"
    code = main(["history", "append", str(nights[0]), "--into", str(into), "--lock-timeout", "30"])
    err = capsys.readouterr().err
    assert (code, len(lines(into))) == (0, 1), err
    assert err.startswith(f"replaytests: {into}: waiting up to 30 s for the lock on {tmp_path}/"), err


def test_append_refuses_two_definitions_of_one_cell(tmp_path, capsys):
    """Records of one cell under two definitions (a ledger collated from two runs) are not one history row."""
    ledger = write_ledger_file(tmp_path / "run" / "ledger.jsonl",
                               [make("crossing", "r0"), make("crossing", "r1") | {"cell_digest": "e" * 16}])
    into = tmp_path / "history.jsonl"
    assert main(["history", "append", str(ledger.parent), "--into", str(into)]) == 4
    assert capsys.readouterr().err == (f"replaytests: error: cell bf16 has two definitions: digest dddddddddddd… in "
                                       f"{ledger}, eeeeeeeeeeee… in {ledger} (crossing/r1/bf16); its records cannot be "
                                       "counted as one cell\n")
    assert not into.exists(), "the history was written"


def test_append_refuses_a_night_whose_cell_was_defined_otherwise(nights, tmp_path, capsys):
    """Two definitions of one cell on two nights would be drawn as one series: the second is refused."""
    into = tmp_path / "history.jsonl"
    assert main(["history", "append", str(nights[0]), "--into", str(into)]) == 0, capsys.readouterr().err
    redefined = [make("crossing", f"r{i}") | {"cell_digest": "e" * 16} for i in range(2)]
    ledger = write_ledger_file(tmp_path / "night3" / "ledger.jsonl", redefined)
    before = into.read_text(encoding="utf-8")
    assert main(["history", "append", str(ledger.parent), "--into", str(into)]) == 4
    assert capsys.readouterr().err == (
        f"replaytests: error: cell bf16 has two definitions: digest eeeeeeeeeeee… in {ledger}, dddddddddddd… in "
        f"{nights[0] / 'ledger.jsonl'} (the run of {lines(into)[0]['date']} in {into}); not appended: start another "
        "history file for the new definition\n")
    assert into.read_text(encoding="utf-8") == before, "the history changed"
    assert main(["history", "append", str(nights[1]), "--into", str(into)]) == 0, "the same definition is appended"
