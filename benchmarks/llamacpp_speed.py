"""The suite's llama.cpp decoding against llama.cpp's own generation, side by side in one process
(docs/llamacpp.md).

Per row of the causal SmolLM2 bank: the suite's live construction (the prompt block in one call, then
one greedy token per call under the structural mask, K/V saved at the boundary) and llama-cpp-python's
own `Llama.generate` of as many tokens from the same prompt block (greedy, no mask), same GGUF, threads,
K/V type and flash-attention setting, each in a context created before the clock starts. The two
alternate per row, `--repeats` times; the ratio is of the summed times.

    .venv-llamacpp/bin/python benchmarks/llamacpp_speed.py [--rows 4] [--repeats 2]
"""

from __future__ import annotations

import argparse

from llamacpp_invariance import smollm2
from side_by_side import alternate, report

from replaytests.engine.llamacpp.context import import_llama_cpp
from replaytests.engine.llamacpp.runtime import Runtime
from replaytests.engine.protocol import prompt_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    contract, gguf, rows = smollm2(args.rows)
    runtime = Runtime.load(gguf, contract, "fp32")
    llama_cpp = import_llama_cpp()
    settings = contract.runtime("llamacpp")
    own = llama_cpp.Llama(str(gguf), n_ctx=settings["n_ctx"], n_batch=settings["n_ctx"], n_ubatch=settings["n_ctx"],
                          n_threads=contract.cpu_threads, n_threads_batch=contract.cpu_threads, type_k=0, type_v=0,
                          flash_attn=settings["flash_attention"], verbose=False)
    prompts = [prompt_of(row.tokens, runtime.grammar.delims) for row in rows]

    def suite(prompt: list[int]) -> int:
        return len(runtime.live(prompt).tokens) - len(prompt)

    def generate(prompt: list[int], count: int) -> None:
        for i, _token in enumerate(own.generate(prompt, top_k=1, temp=0.0, reset=True), 1):
            if i == count:
                break

    report(f"{len(rows)} rows x {args.repeats}, {contract.cpu_threads} thread(s)", "llama.cpp generate",
           *alternate(prompts, args.repeats, suite, generate))


if __name__ == "__main__":
    main()
