"""The report of `replaytests rollouts check` (docs/rollouts.md): rollouts.json and rollouts.md, written as one
(files.write_set), and the lines the command prints. Reads measures only (outputs.mismatch). The run's table
and the worst tokens render from the measures' JSON form, so the run report's rollout section (outputs/sections.py)
shows them in the same words."""

from __future__ import annotations

from pathlib import Path

from replaytests.files import dumps, write_set
from replaytests.outputs.mismatch import RunMeasures
from replaytests.outputs.tables import Table, md_cell
from replaytests.outputs.tables import markdown as md_table

SCHEMA = "replaytests.rollouts-report/1"
FILES = ("rollouts.json", "rollouts.md")
DEFINITION = ("logp_replay(t): log-softmax in FP32 of the logits of one prefill call over prompt + response, full "
              "vocabulary, no structural mask; d(t) = logp_replay(t) - logp_live(t); r(t) = exp(d(t)); k3 = mean of "
              "r - 1 - log r, an estimate of KL(live || replay); bitwise equal: the dump's number is the recomputed "
              "float32 exactly")
LISTED_ROWS = 20  # rows the Markdown lists by name (rows.json holds every row)


def build(run: RunMeasures, meta: dict) -> dict:
    """What rollouts.json holds: the inputs and platform (`meta`), the definitions, the run and every row."""
    return {"schema": SCHEMA, **meta, "definition": DEFINITION, "run": run.to_json(),
            "rows": [row.to_json() for row in run.rows]}


def interval(value: dict, scale: float = 1.0, unit: str = "") -> str:
    """A ClusterInterval's JSON as `estimate [low, high]`, `n/a` where nothing was measured."""
    if value["estimate"] is None:
        return "n/a"
    return (f"{value['estimate'] * scale:.4g}{unit} [{value['ci_low'] * scale:.4g}{unit}, "
            f"{value['ci_high'] * scale:.4g}{unit}]")


def measure_rows(run: dict) -> list[tuple[str, str]]:
    """The run's measures, (name, value) per line, from RunMeasures.to_json(): the one rendering of
    `rollouts check`'s table and the run report's rollout tables."""
    t = run["thresholds"]
    exceeding = run["rows_exceeding"]
    return [("rows / response tokens", f"{run['rows']} / {run['tokens']}"),
            ("tokens bitwise equal (share, 95% CI over rows)",
             f"{run['tokens_bitwise_equal']} ({interval(run['bitwise_equal'], 100, '%')})"),
            ("abs(delta logp) max / median / p99 (nats)",
             f"{run['abs_delta_max']:.4g} / {run['abs_delta_median']:.4g} / {run['abs_delta_p99']:.4g}"),
            ("abs(delta logp) mean (nats, 95% CI)", interval(run["abs_delta_mean"])),
            ("k3 KL(live ‖ replay) per token (95% CI)", interval(run["k3"])),
            (f"tokens with ratio outside [{t['ratio_low']:g}, {t['ratio_high']:g}] (95% CI)",
             interval(run["outside_bounds"], 100, "%")),
            (f"rows with abs(delta logp) > {t['delta']:g} (Wilson 95%)",
             f"{exceeding['k']} of {exceeding['n']} [{exceeding['ci_low']:.3g}, {exceeding['ci_high']:.3g}]")]


COMPACT = ("tokens bitwise equal", "abs(delta logp) mean [95% CI]", "abs(delta logp) max", "k3 per token [95% CI]",
           "ratio outside bounds [95% CI]", "rows past the threshold")


def compact(run: dict) -> tuple[str, ...]:
    """The run's measures in one line of COMPACT's columns (summary.md)."""
    return (f"{run['tokens_bitwise_equal']}/{run['tokens']}", interval(run["abs_delta_mean"]),
            f"{run['abs_delta_max']:.4g}", interval(run["k3"]), interval(run["outside_bounds"], 100, "%"),
            f"{run['rows_exceeding']['k']}/{run['rows_exceeding']['n']}")


def summary(run: RunMeasures) -> list[str]:
    """The run's measures as a Markdown table (printed as is)."""
    return md_table(Table("", ("measure", "value"), tuple(measure_rows(run.to_json()))), 0)[:-1]


def _top2(ids) -> str:
    return "-" if ids is None else " / ".join(map(str, ids))


def worst_table(worst: list[dict], title: str = "", names: tuple[str, str] = ("live", "recomputed")) -> Table:
    """The worst tokens (Worst.to_json(), with `top2` per arm where the records hold the two most likely ids
    at that step: {arm: [id, id]}), each arm's log-probability and the delta."""
    top2 = any("top2" in w for w in worst)
    header = ("row", "position", "token", *(f"{name} logp" for name in names), "delta",
              *((f"{name} top-2" for name in names) if top2 else ()))
    rows = tuple((w["row"], str(w["position"]), str(w["token"]), f"{w['live']:.9g}", f"{w['replay']:.9g}",
                  f"{w['delta']:+.4g}", *((_top2(w.get("top2", {}).get(name)) for name in names) if top2 else ()))
                 for w in worst)
    return Table(title, header, rows)


def worst(run: RunMeasures) -> list[str]:
    return md_table(worst_table([w.to_json() for w in run.worst]), 0)[:-1]


def _rows(run: RunMeasures) -> list[str]:
    listed = sorted(run.rows, key=lambda m: -m.abs_delta_max)[:LISTED_ROWS]
    return ["| row | tokens | bitwise equal | abs(delta) max | k3 | outside bounds | first abs(delta) > threshold |",
            "|---|---|---|---|---|---|---|",
            *(f"| {md_cell(m.row)} | {m.tokens} | {m.bitwise_equal} | {m.abs_delta_max:.4g} | {m.k3:.3g} "
              f"| {m.outside_bounds} | {'-' if m.first_exceeding is None else m.first_exceeding} |" for m in listed)]


def markdown(report: dict, run: RunMeasures, verdict: str) -> str:
    head = [f"# Rollouts check: {md_cell(str(report['dump']))}", "", md_cell(verdict), "",
            f"Model {md_cell(str(report['model']))}, contract {md_cell(str(report['contract']))}, cell "
            f"{report['precision']}, "
            f"{report['platform']}; {report['tokens_per_second']:.0f} response tokens/s.", "",
            report["definition"] + ".",
            "", "## Run", "", *summary(run), "", "## Worst tokens", "", *worst(run), "",
            f"## Rows (the {min(LISTED_ROWS, len(run.rows))} of largest abs(delta); rollouts.json holds every row)",
            "", *_rows(run)]
    return "\n".join(head) + "\n"


def write(out: Path, run: RunMeasures, meta: dict, verdict: str) -> list[Path]:
    report = build(run, meta)
    files = {out / FILES[0]: dumps(report, indent=2) + "\n", out / FILES[1]: markdown(report, run, verdict)}
    write_set(files)
    return list(files)
