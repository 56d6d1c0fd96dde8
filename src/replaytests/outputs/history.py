"""Nightly history: one JSON line per run, `replaytests.history/1`, and its table and plots.

`append` summarises a ledger as report.json does (Wilson objects of the headline divergences and of
the replicas, per family and cell, and the transplant and replication outcomes), dated and
labelled by the run's own run.json (its start time and name) unless told otherwise, and adds the line
atomically; a ledger already in the history (same sha256) is refused. `table` and `page` show the
runs in date order: a compact table, and a plot per family and headline pair with intervals as bands.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from replaytests.errors import ReplaytestsError, control_character, got, short
from replaytests.families.registry import FAMILIES, TRANSPLANTS
from replaytests.files import dumps, exclusive, read_text, sha256_file, write_atomic
from replaytests.inputs import cells
from replaytests.outputs import causal, ledger, plots, report, report_html, runs, stats
from replaytests.outputs.records import Record
from replaytests.outputs.rundir import ledger_of
from replaytests.outputs.shapes import DIVERGENCES
from replaytests.outputs.stats import INTERVAL, Proportion
from replaytests.outputs.tables import Table, plain
from replaytests.outputs.tables import html as html_table

SCHEMA = "replaytests.history/1"
HEADER = ("date", "label", "family", "precision", "rows", "excl.", "replicas exact",
          *(name.split("_")[0] + " div." for name in DIVERGENCES), "causal")


class HistoryError(ReplaytestsError):
    """A history file that cannot be read or appended to as given."""


def summarize(records: list[Record]) -> tuple[dict, dict]:
    """family -> cell -> rows, excluded, replicas_exact (where the family has replicas) and, per
    headline pair, the Wilson objects of its divergences; and the causal outcomes (transplant, replication):
    the report's numbers (docs/report.md), as a history line holds them (JSON)."""
    built = report.build_report(records, {})
    families = {family: {cell: {"rows": s["rows"], "excluded": s["excluded"],
                                     **({"replicas_exact": s["replicas_exact"]} if "replicas_exact" in s else {}),
                                     "pairs": {pair: {name: s["pairs"][pair][name] for name in DIVERGENCES
                                                      if name in s["pairs"][pair]}
                                               for pair in _headline(family, s)}}
                         for cell, s in summary["precisions"].items()}
                for family, summary in built["families"].items()}
    return stats.as_json(families), stats.as_json(_causal(built["causal"]))


def _headline(family: str, summary: dict) -> list[str]:
    """The family's headline pairs (the registry's; none for a family it does not know)."""
    return [pair for pair in (FAMILIES[family].headline if family in FAMILIES else ()) if pair in summary["pairs"]]


def _causal(summaries: dict) -> dict:
    """What the history tracks of the causal families (each its outcome module's `tracked`): donor recovery and
    third trajectories per direction, and a replication's divergent rows and label."""
    return {family: outcome.tracked(summaries[family]) for family, outcome in causal.outcomes().items()
            if family in summaries}


def _date(text: str | None, run: dict) -> str:
    """--date, else the run's own start time (run.json), else now."""
    if text is None:
        started = (run.get("run") or {}).get("started")
        return started if isinstance(started, str) else datetime.now(UTC).isoformat(timespec="seconds")
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        raise HistoryError(f"--date {text!r}: expected an ISO 8601 date, e.g. 2026-01-31T02:00:00+00:00") from None


def entry(source: Path, label: str | None = None, date: str | None = None) -> dict:
    """The history line of one run (a ledger file or a run directory, with its run.json if present): dated
    and labelled by the run itself (its start time and name) unless `date` or `label` is given."""
    path, run, records = ledger_of(Path(source)), runs.read_run(source) or {}, ledger.collate([source])
    families, causal_outcomes = summarize(records)
    return {"schema": SCHEMA, "date": _date(date, run), "label": label or (run.get("run") or {}).get("name"),
            "ledger": str(path), "ledger_sha256": sha256_file(path, "ledger", HistoryError),
            "contract": run.get("contract"), "platform": run.get("platform"), "families": families,
            "causal": causal_outcomes, "cells": ledger.cell_digests(records)}


def _parse(path: Path, text: str) -> list[dict]:
    entries = ledger.versioned_objects(path, text, SCHEMA, HistoryError)
    for number, value in entries:
        if problem := _problem(value):
            raise HistoryError(f"{path}:{number}: {problem}")
    return [value for _, value in entries]


def _problem(entry_: dict) -> str | None:
    """What makes a history line unreadable (a field missing or of the wrong shape, anywhere in it), or None:
    the table and the page read every field below, so a hand-edited line is refused here, naming the field
    and what was expected, never half-way through a page."""
    for name, kind in (("date", str), ("ledger_sha256", str), ("families", dict)):
        if not isinstance(entry_.get(name), kind):
            return f"field {name!r} must be a {kind.__name__}, got {short(entry_.get(name))}"
    try:
        datetime.fromisoformat(entry_["date"])
    except ValueError:
        return f"field 'date' is not an ISO 8601 date: {short(entry_['date'])}"
    if not isinstance(entry_.get("label", 0), str | None):  # the table and the page read it, null or not
        return f"field 'label' must be a string or null, {got(entry_, 'label')}"
    if entry_.get("label") and (found := control_character(entry_["label"])):  # it is printed to a terminal
        return f"field 'label' holds a {found}"
    return (_objects(entry_["families"], "families", "precisions",
                     lambda cells, where: _objects(cells, where, "precision summaries", _summary))
            # absent in lines written before it was tracked
            or _objects(entry_.get("causal", {}), "causal", "causal outcomes", _causal_outcome)
            or _objects(entry_.get("cells", {}), "cells", "cell digests", _digest))


def _digest(value: object, where: str) -> str | None:
    return None if isinstance(value, str) else f"field {where!r} must be a cell digest (a string), got {short(value)}"


def _objects(value: object, where: str, what: str, item: Callable[[object, str], str | None]) -> str | None:
    """An object of `what`, each value checked by `item`; each name is printed, so holds no control character."""
    if not isinstance(value, dict):
        return f"field {where!r} must be an object of {what}, got {short(value)}"
    for name, inner in value.items():
        if found := control_character(name):
            return f"field {where!r}: the name {short(name)} holds a {found}"
        if problem := item(inner, f"{where}.{name}"):
            return problem
    return None


def _summary(summary: object, where: str) -> str | None:
    """A cell's summary: its row counts, its replicas (where the family has some), its headline pairs."""
    if not isinstance(summary, dict):
        return f"field {where!r} must be an object with rows, excluded and pairs, got {short(summary)}"
    if problem := next(filter(None, (_count_problem(summary, name, where) for name in ("rows", "excluded"))), None):
        return problem
    if "replicas_exact" in summary and (problem := _wilson(summary["replicas_exact"], f"{where}.replicas_exact")):
        return problem
    return _objects(summary.get("pairs"), f"{where}.pairs", "headline pairs",
                    lambda pair, at: _objects(pair, at, "Wilson proportions", _wilson))


def _causal_outcome(outcome: object, where: str) -> str | None:
    """A causal family's outcomes: donor recovery and third trajectories per direction; a replication's
    divergent rows and label too."""
    if not isinstance(outcome, dict):
        return f"field {where!r} must be an object with follows_donor and control_third, got {short(outcome)}"
    for name in ("follows_donor", "control_third"):
        if problem := _objects(outcome.get(name), f"{where}.{name}", "Wilson proportions per direction", _wilson):
            return problem
    if not _tracked(where.removeprefix("causal."), outcome):
        return None
    if problem := _wilson(outcome.get("divergent"), f"{where}.divergent"):
        return problem
    if not isinstance(outcome.get("label"), str) or control_character(outcome["label"]):
        return f"field '{where}.label' must be a string of printable characters, {got(outcome, 'label')}"
    return None


def _tracked(family: str, outcome: dict) -> tuple[str, ...]:
    """The fields a causal family's history entry keeps besides its per-direction outcomes (its outcome module's
    TRACKED); for a family this version has no outcome module for, those the entry holds."""
    module = causal.outcomes().get(family)
    return module.TRACKED if module is not None else tuple(name for name in ("divergent", "label") if name in outcome)


def _wilson(value: object, where: str) -> str | None:
    """A Wilson proportion as report.json writes it: k of n and, where n > 0, the rate and its interval."""
    if not isinstance(value, dict):
        return f"field {where!r} must be a Wilson proportion (an object with k and n), got {short(value)}"
    if problem := next(filter(None, (_count_problem(value, name, where) for name in ("k", "n"))), None):
        return problem
    if value["k"] > value["n"]:
        return f"field '{where}.k' is {value['k']}, more than n ({value['n']})"
    for name in ("rate", "ci_low", "ci_high") if value["n"] else ():
        number = value.get(name)
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number <= 1:
            return f"field '{where}.{name}' must be a number from 0 to 1, {got(value, name)}"
    return None


def _count_problem(value: dict, name: str, where: str) -> str | None:
    count = value.get(name)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return f"field '{where}.{name}' must be a non-negative integer, {got(value, name)}"
    return None


def read_history(path: Path) -> list[dict]:
    """The runs of a history file, in date order."""
    entries = _parse(path, read_text(path, "history", HistoryError))
    if not entries:
        raise HistoryError(f"{path}: empty history (no runs)")
    return sorted(entries, key=lambda e: _instant(e["date"]))


def _instant(date: str) -> datetime:
    """A line's date as an instant: 02:00+02:00 comes before 01:00+00:00, which a string sort gets wrong; a
    date without a zone is read as UTC."""
    moment = datetime.fromisoformat(date)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


LOCK_TIMEOUT = 60.0  # seconds an append waits for another one's lock on the history (docs/nightly.md)


def append(source: Path, into: Path, label: str | None = None, date: str | None = None,
           accept_interrupted: bool = False, lock_timeout: float | None = None) -> dict:
    """Add one run to the history (created if missing), atomically, keeping its mode; the same ledger twice is
    refused, and an interrupted run unless accept_interrupted, and a history this user may not write."""
    run = runs.read_run(source) or {}
    if (run.get("run") or {}).get("interrupted") and not accept_interrupted:
        raise HistoryError(f"{source}: an interrupted run (it holds only what it finished), not a night of the "
                           "history; pass --accept-interrupted to append it anyway")
    new = entry(source, label, date)
    if problem := _problem(new):  # what a reader would refuse is never written
        raise HistoryError(f"{source}: cannot append this run: {problem}")
    try:
        # appends from several processes: each reads what the last one wrote
        with exclusive(Path(into), LOCK_TIMEOUT if lock_timeout is None else lock_timeout, HistoryError):
            _check_writable(Path(into))
            text = read_text(into, "history", HistoryError) if Path(into).exists() else ""
            if same := next((e for e in _parse(into, text) if e["ledger_sha256"] == new["ledger_sha256"]), None):
                raise HistoryError(f"{into}: this ledger is already in the history (run of {same['date']}, label "
                                   f"{same['label']!r}, ledger sha256 {new['ledger_sha256'][:12]}...); not appended "
                                   "twice")
            _same_cells(new, _parse(into, text), into)
            write_atomic(Path(into), text + ("\n" if text and not text.endswith("\n") else "")
                         + dumps(new, sort_keys=True) + "\n")
    except OSError as exc:
        raise HistoryError(f"{into}: cannot write history: {exc.strerror or exc}") from None
    return new


def _check_writable(path: Path) -> None:
    """Refuse a history this user may not write: renaming a new file over it would succeed all the same
    (only its directory must be writable) and leave it writable. A file without any write bit is read-only
    even to root, whom os.access lets write anything."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    if not os.access(path, os.W_OK) or not mode & 0o222:
        raise HistoryError(f"{path}: the history is read-only (mode {mode:04o}); not appended (make it writable, "
                           "e.g. chmod u+w, to append)")


def _same_cells(new: dict, entries: list[dict], into: Path) -> None:
    """A cell of the new run defined otherwise (another digest) than in a night of the history would be
    drawn as one series with it: refused (lines written before digests were tracked name none)."""
    for e in entries:
        before = e.get("cells", {})  # each night's shape is checked when read (_problem)
        if cell := next((c for c, d in new["cells"].items() if before.get(c) not in (None, d)), None):
            now, then = new["cells"][cell][:12], before[cell][:12]
            raise HistoryError(f"cell {cell} has two definitions: digest {now}… in {new['ledger']}, {then}… in "
                               f"{e.get('ledger')} (the run of {e['date']} in {into}); not appended: start another "
                               "history file for the new definition")


def _lines(entries: list[dict]):
    """(entry, family, cell, pair or None, cell summary) in date order."""
    for e in entries:
        for family in report.ordered(e["families"], tuple(FAMILIES)):
            for cell in report.ordered(e["families"][family], cells.PAPER):
                s = e["families"][family][cell]
                for pair in s["pairs"] or [None]:
                    yield e, family, cell, pair, s


DIRECTIONS_SHOWN = TRANSPLANTS  # the order of the causal cell's pairs of counts


def _count(p: dict | None) -> str:
    return "-" if not p else f"{p['k']}/{p['n']}"


def causal_cell(entry_: dict, family: str) -> str:
    """The causal outcomes of a run in a few words: donor recovery per direction, third trajectories, label."""
    c = (entry_.get("causal") or {}).get(family)
    if not c:
        return "-"
    parts = [f"follows donor {', '.join(_count(c['follows_donor'].get(d)) for d in DIRECTIONS_SHOWN)}",
             f"third {', '.join(_count(c['control_third'].get(d)) for d in DIRECTIONS_SHOWN)}"]
    if "divergent" in c:
        parts = [f"divergent {_count(c['divergent'])}", *parts, c["label"]]
    return "; ".join(parts)


def _when(entry_: dict) -> str:
    return entry_["date"][:16].replace("T", " ")


def _family_label(family: str, pair: str | None) -> str:
    """The family, with its pair where it has several headline pairs (`batch incremental pair~singleton`)."""
    if pair is None or len(FAMILIES[family].headline if family in FAMILIES else ()) < 2:
        return family
    first, _, second = pair.partition("~")
    stem = first.rpartition("_")[0]
    short = f"{stem} {first[len(stem) + 1:]}~{second[len(stem) + 1:]}" if stem and second.startswith(stem + "_") \
        else pair
    return f"{family} {short}"


def table(entries: list[dict]) -> Table:
    rows = tuple((_when(e), e["label"] or "", _family_label(family, pair), cell, str(s["rows"]),
                  str(s["excluded"]), _count(s.get("replicas_exact")), *(_count(s["pairs"].get(pair, {}).get(name))
                                                      for name in DIVERGENCES),
                  causal_cell(e, family))
                 for e, family, cell, pair, s in _lines(entries))
    return Table("history", HEADER, rows, "k/n over the rows that passed every fail-closed check; divergences "
                                          f"compare the family's headline pair; the plots show the {INTERVAL} "
                                          "intervals. causal: divergent rows, donor recovery and third trajectories "
                                          "per direction (" + ", ".join(DIRECTIONS_SHOWN) + "), the replication "
                                          "label.")


def family_tables(entries: list[dict]) -> list[Table]:
    """The page's tables: one per family (and headline pair), one row per run, a few short columns per
    cell; the causal families' outcomes per direction."""
    rows: dict[str, dict[str, list[str]]] = {}  # table title -> run -> its line
    headers: dict[str, list[str]] = {}
    for e, family, cell, pair, s in _lines(entries):
        title = _family_label(family, pair)
        line = rows.setdefault(title, {}).setdefault(e["ledger_sha256"], [_when(e), e["label"] or ""])
        columns = headers.setdefault(title, ["date", "label"])
        measures = [("rows", str(s["rows"] - s["excluded"])), ("replicas", _count(s.get("replicas_exact"))),
                    *((name.split("_")[0], _count(s["pairs"].get(pair, {}).get(name))) for name in DIVERGENCES)]
        for name, value in measures:
            if f"{cell} {name}" not in columns:
                columns.append(f"{cell} {name}")
            line += [""] * (columns.index(f"{cell} {name}") + 1 - len(line))
            line[columns.index(f"{cell} {name}")] = value
    out = []
    for title, columns in rows.items():
        full = [c + [""] * (len(headers[title]) - len(c)) for c in columns.values()]
        kept = [i for i in range(len(headers[title])) if i < 2 or any(c[i] not in ("-", "") for c in full)]
        out.append(Table(title, tuple(headers[title][i] for i in kept), tuple(tuple(c[i] for i in kept) for c in full)))
    for family, outcome in causal.outcomes().items():
        outcomes = [(e, c) for e in entries if (c := (e.get("causal") or {}).get(family))]
        if outcomes:
            lead = ("divergent",) if "divergent" in outcome.TRACKED else ()  # its columns before the directions
            tail = ("label",) if "label" in outcome.TRACKED else ()  # and after them
            header = ("date", "label", *lead, *(f"{d} follows donor" for d in DIRECTIONS_SHOWN),
                      *(f"{d} controls: third" for d in DIRECTIONS_SHOWN), *tail)
            out.append(Table(f"{family}: causal outcomes", header, tuple(
                (_when(e), e["label"] or "", *(_count(c[n]) for n in lead),
                 *(_count(c["follows_donor"].get(d)) for d in DIRECTIONS_SHOWN),
                 *(_count(c["control_third"].get(d)) for d in DIRECTIONS_SHOWN), *(c[n] for n in tail))
                for e, c in outcomes)))
    return out


def _series(entries: list[dict]) -> dict[str, dict[str, list[Proportion | None]]]:
    """Per family and headline pair (or causal family): measure -> its proportion in each run (None: absent)."""
    out: dict[str, dict[str, list]] = {}
    for i, e in enumerate(entries):
        def put(plot: str, measure: str, value: dict | None, index: int = i) -> None:  # a line's, checked (_wilson)
            out.setdefault(plot, {}).setdefault(measure, [None] * len(entries))[index] = (
                None if value is None else Proportion.from_json(value))

        for _, family, cell, pair, s in _lines([e]):
            for name in ("suffix_divergence", "answer_divergence"):
                if pair is not None:
                    put(f"{family} {pair}", f"{cell} {name.split('_')[0]}", s["pairs"][pair].get(name))
        for family, c in (e.get("causal") or {}).items():
            for direction, value in c["follows_donor"].items():
                put(f"{family}: donor recovery", direction, value)
    return out


def page(entries: list[dict]) -> str:
    """A standalone HTML page: one plot per family and headline pair over the runs, then the table."""
    times = [_when(e)[5:] for e in entries]  # MM-DD HH:MM: short enough for several ticks
    names = [e["label"] or _when(e) for e in entries]
    figures = "".join(plots.time_plot(f"{title}: {len(entries)} runs in date order, {INTERVAL} intervals as bands.",
                                      times, series, names) for title, series in _series(entries).items())
    note = ('<p class="note">k/n over the rows that passed every fail-closed check (rows: those rows); divergences '
            f"compare the family's headline pair; the plots show the {INTERVAL} intervals.</p>")
    return report_html.shell("replaytests history", f'<h1>replaytests history</h1><div class="plots">{figures}</div>'
                             + "<h2>Runs</h2>" + note + "".join(map(html_table, family_tables(entries))))


def show(path: Path, html: Path | None = None) -> str:
    """The history as a text table; with `html`, also the page with its plots, written atomically."""
    entries = read_history(path)
    if html is not None:
        try:
            write_atomic(Path(html), page(entries))
        except OSError as exc:
            raise HistoryError(f"{html}: cannot write the history page: {exc.strerror or exc}") from None
    return plain(table(entries))
