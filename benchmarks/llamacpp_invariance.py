"""Which llama.cpp settings keep a prefix's boundary independent of how it was evaluated (docs/llamacpp.md).

For each K/V cache type and flash-attention setting, on the first rows of the causal SmolLM2 bank and
the GGUF as it ships (Q4_1), the prefix z is evaluated one token per call, in one call, and in calls of
`--chunk` tokens, each in a fresh context; the table counts the rows whose boundary logits and whose
serialized K/V state (llama.cpp's sequence state) are bitwise equal to the one-call prefill's, and the
largest |Δ| of a logit. Also per setting: the same prefill at 1 and 2 threads.

At every prefix position (the "every position" columns): the logits each one-token call returned, and those of
calls of `--chunk` tokens with every token an output, against one call over z with every token an output
(`llama_batch.logits[i]` set for each i, as a trainer's recompute reads them), counted over all positions of
all rows. The build is whichever this interpreter's venv holds (its record, tools/install-llamacpp.sh, printed
first): run it with each venv's python to compare builds.

    .venv-llamacpp/bin/python benchmarks/llamacpp_invariance.py [--rows 4] [--chunk 16]
    .venv-llamacpp-user/bin/python benchmarks/llamacpp_invariance.py [--rows 4] [--chunk 16]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

from replaytests.engine.llamacpp.context import Context, Model, build_record, system_info, version
from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.inputs.bank import read_bank
from replaytests.inputs.contract import load_contract
from replaytests.inputs.models import shipped_gguf

REPO = Path(__file__).resolve().parents[1]
# A quantized V cache needs flash attention (llama.cpp refuses the context without it).
SETTINGS = [("f32", False), ("f16", False), ("f32", True), ("f16", True), ("q8_0", True)]


def boundary(model: Model, z: list[int], n_batch: int, threads: int, kv: str, flash: bool, one_by_one: bool = False,
             steps: list | None = None):
    """The boundary logits and a digest of the K/V state after z, evaluated in one call, in calls of n_batch, or
    one token per call (then each call's logits are appended to `steps`, where given)."""
    context = Context(model, 1024, n_batch, threads, kv, flash)
    try:
        logits = None
        if one_by_one:
            for token in z:
                logits = context.feed([token], "incremental")
                if steps is not None:
                    steps.append(logits)
        else:
            logits = context.feed(z, "prefill")
        return logits, hashlib.sha256(context.save()).hexdigest()
    finally:
        context.close()


def every_position(model: Model, z: list[int], n_batch: int, kv: str, flash: bool) -> np.ndarray:
    """The logits at every position of z, [len(z), n_vocab], evaluated in calls of n_batch tokens with every token
    an output (one call where n_batch >= len(z))."""
    context = Context(model, 1024, n_batch, 1, kv, flash)
    try:
        return np.concatenate([context.feed_every(z[start:start + n_batch], "every")
                               for start in range(0, len(z), n_batch)])
    finally:
        context.close()


def _positions(counts: list, logits: np.ndarray, reference: np.ndarray) -> None:
    """Add to counts [positions bitwise equal, positions, max |Δ|] the rows of `logits` against `reference`."""
    equal = (logits.view(np.uint32) == reference.view(np.uint32)).all(axis=1)
    counts[0] += int(equal.sum())
    counts[1] += len(equal)
    counts[2] = max(counts[2], float(np.abs(logits - reference).max()))


def smollm2(rows: int):
    """The llama.cpp contract, the shipped SmolLM2 GGUF and the first `rows` rows of its causal bank."""
    contract = load_contract(REPO / "contracts" / "cpu-smollm2-llamacpp.yaml")
    gguf = shipped_gguf("smollm2")
    facts = Runtime.inspect(gguf, contract, "--model")
    return contract, gguf, read_bank(REPO / "fixtures" / "banks" / "smollm2-causal.jsonl", facts.grammar,
                                     facts.max_positions, contract.caps.suffix_room())[:rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=16)
    args = parser.parse_args()
    _, gguf, rows = smollm2(args.rows)
    model = Model(gguf)
    build = build_record() or {}
    print(f"llama-cpp-python {version()}, build {build.get('isa')!r} ({sys.prefix}/llamacpp-build.json: cmake_args "
          f"{build.get('cmake_args')!r}, llamafile {build.get('llamafile', False)}, cpu {build.get('cpu')!r})")
    print(f"{gguf.name}, {len(rows)} rows of smollm2-causal ({min(len(r.tokens) for r in rows)}-"
          f"{max(len(r.tokens) for r in rows)} tokens), chunk {args.chunk}; {system_info(model.llama_cpp)}")
    print(f"{'K/V':5s} {'flash':5s}  {'incremental vs prefill':>26s} {'chunked vs prefill':>26s} "
          f"{'2 threads vs 1':>26s} {'every position: incremental':>32s} {'every position: chunked':>32s}  s")
    for kv, flash in SETTINGS:
        start = time.perf_counter()
        counts = {name: [0, 0, 0.0] for name in ("incremental", "chunked", "threads", "inc_every", "chunk_every")}
        for row in rows:
            z = row.tokens
            reference, state = boundary(model, z, 1024, 1, kv, flash)
            steps: list = []
            others = {"incremental": boundary(model, z, 1024, 1, kv, flash, one_by_one=True, steps=steps),
                      "chunked": boundary(model, z, args.chunk, 1, kv, flash),
                      "threads": boundary(model, z, 1024, 2, kv, flash)}
            for name, (logits, digest) in others.items():
                counts[name][0] += bool(np.array_equal(logits.view(np.uint32), reference.view(np.uint32)))
                counts[name][1] += digest == state
                counts[name][2] = max(counts[name][2], float(np.abs(logits - reference).max()))
            every = every_position(model, z, 1024, kv, flash)
            _positions(counts["inc_every"], np.stack(steps), every)
            _positions(counts["chunk_every"], every_position(model, z, args.chunk, kv, flash), every)
        cells = [f"logits {c[0]}/{len(rows)} K/V {c[1]}/{len(rows)} {c[2]:.2g}" for c in list(counts.values())[:3]]
        cells += [f"{c[0]}/{c[1]} equal, max {c[2]:.2g}" for c in list(counts.values())[3:]]
        print(f"{kv:5s} {'on' if flash else 'off':5s}  {cells[0]:>26s} {cells[1]:>26s} {cells[2]:>26s} "
              f"{cells[3]:>32s} {cells[4]:>32s}  {time.perf_counter() - start:.0f}")
    model.close()


if __name__ == "__main__":
    main()
