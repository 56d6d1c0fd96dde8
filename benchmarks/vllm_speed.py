"""The suite's vLLM requests against vLLM's own `generate` of the same requests, side by side in one engine
(docs/vllm.md).

Per row of the causal SmolLM2 bank: the suite's live construction (one request from the prompt block,
greedy under the structural mask, the contract's top-k logprobs on every step, stopped at <|/answer|>)
and `LLM.generate` of the same prompt for as many tokens (greedy, no mask, no logprobs, no stop), in the
same engine, so that its start-up is counted once and for neither. Both reset the prefix cache first: no
request is a cache hit. The two alternate per row, `--repeats` times; the ratio is of the summed times.

    .venv-vllm/bin/python benchmarks/vllm_speed.py [--rows 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from side_by_side import alternate, report

from replaytests.engine.protocol import prompt_of
from replaytests.engine.vllm.runtime import Runtime
from replaytests.inputs.bank import read_bank
from replaytests.inputs.contract import load_contract
from replaytests.inputs.models import prepare

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    contract = load_contract(REPO / "contracts" / "cpu-smollm2-vllm.yaml")
    model = prepare("smollm2")
    runtime = Runtime.load(model, contract, "bf16")
    rows = read_bank(REPO / "fixtures" / "banks" / "smollm2-causal.jsonl", runtime.grammar, 8192,
                     contract.caps.suffix_room())[:args.rows]
    import vllm  # imported by Runtime.load, after the contract's pins

    engine = runtime.engine
    prompts = [prompt_of(row.tokens, runtime.grammar.delims) for row in rows]

    def suite(prompt: list[int]) -> int:
        live = runtime.live(prompt)
        return len(live.tokens) + len(live.state.suffix.tokens) - len(prompt)

    def generate(prompt: list[int], count: int) -> None:
        params = vllm.SamplingParams(temperature=0.0, max_tokens=count, ignore_eos=True, detokenize=False, seed=0)
        engine.reset_prefix_cache()
        out = engine.generate([vllm.inputs.TokensPrompt(prompt_token_ids=prompt)], [params], use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == count, (len(out[0].outputs[0].token_ids), count)

    report(f"{len(rows)} rows x {args.repeats}, {contract.cpu_threads} thread(s), bf16, vLLM "
           f"{runtime.describe(contract)['software']['vllm']}", "vLLM generate",
           *alternate(prompts, args.repeats, suite, generate))


if __name__ == "__main__":
    main()
