"""Two ways of generating the same tokens, timed alternately in one process (the runtime speed benchmarks:
llamacpp_speed.py, vllm_speed.py): the ratio of their summed times is what they report."""

from __future__ import annotations

import time
from collections.abc import Callable


def alternate(prompts: list[list[int]], repeats: int, suite: Callable[[list[int]], int],
              own: Callable[[list[int], int], None]) -> tuple[float, float, int]:
    """Per prompt, `suite(prompt)` (returns how many tokens it generated) then `own(prompt, count)`, `repeats`
    times over; their summed seconds and the tokens generated."""
    suite_s = own_s = 0.0
    tokens = 0
    for _ in range(repeats):
        for prompt in prompts:
            start = time.perf_counter()
            count = suite(prompt)
            suite_s += time.perf_counter() - start
            start = time.perf_counter()
            own(prompt, count)
            own_s += time.perf_counter() - start
            tokens += count
    return suite_s, own_s, tokens


def report(what: str, own_name: str, suite_s: float, own_s: float, tokens: int) -> None:
    print(f"{what}, {tokens} generated tokens after their prompt blocks")
    print(f"suite live:  {suite_s:7.2f} s  {1000 * suite_s / tokens:6.1f} ms/token")
    print(f"{own_name}:  {own_s:7.2f} s  {1000 * own_s / tokens:6.1f} ms/token")
    print(f"ratio suite / {own_name}: {suite_s / own_s:.2f}x")
