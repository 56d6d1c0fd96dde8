"""The report of `replaytests rollouts check` (docs/rollouts.md): rollouts.json and rollouts.md, written as one
(files.write_set), and the lines the command prints. Reads measures only (outputs.mismatch)."""

from __future__ import annotations

from pathlib import Path

from replaytests.files import dumps, write_set
from replaytests.outputs.mismatch import RunMeasures
from replaytests.outputs.stats import ClusterInterval
from replaytests.outputs.tables import md_cell

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


def _interval(value: ClusterInterval, scale: float = 1.0, unit: str = "") -> str:
    return (f"{value.estimate * scale:.4g}{unit} [{value.ci_low * scale:.4g}{unit}, {value.ci_high * scale:.4g}{unit}]"
            if value.estimate is not None else "n/a")


def summary(run: RunMeasures) -> list[str]:
    """The run's measures as a Markdown table (printed as is)."""
    t = run.thresholds
    bits = sum(m.bitwise_equal for m in run.rows)
    rows = [("rows / response tokens", f"{len(run.rows)} / {run.tokens}"),
            ("tokens bitwise equal (share, 95% CI over rows)",
             f"{bits} ({_interval(run.bitwise_equal, 100, '%')})"),
            ("abs(delta logp) max / median / p99 (nats)",
             f"{run.abs_delta_max:.4g} / {run.abs_delta_median:.4g} / {run.abs_delta_p99:.4g}"),
            ("abs(delta logp) mean (nats, 95% CI)", _interval(run.abs_delta_mean)),
            ("k3 KL(live ‖ replay) per token (95% CI)", _interval(run.k3)),
            (f"tokens with ratio outside [{t.ratio_low:g}, {t.ratio_high:g}] (95% CI)",
             _interval(run.outside_bounds, 100, "%")),
            (f"rows with abs(delta logp) > {t.delta:g} (Wilson 95%)", f"{run.rows_exceeding.k} of "
             f"{run.rows_exceeding.n} [{run.rows_exceeding.ci_low:.3g}, {run.rows_exceeding.ci_high:.3g}]")]
    return ["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]


def worst(run: RunMeasures) -> list[str]:
    return ["| row | position | token | live logp | recomputed logp | delta |", "|---|---|---|---|---|---|",
            *(f"| {md_cell(w.row)} | {w.position} | {w.token} | {w.live:.9g} | {w.replay:.9g} | {w.delta:+.4g} |"
              for w in run.worst)]


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
