"""The six-block text of the protocol-following SmolLM2 checkpoint (docs/models.md): arithmetic
problems in the model's chat format, and the worked solution each block holds. The bank's problems
(fixtures/make_problems_protocol.py) and the adapter's training corpus (fixtures/make_protocol_adapter.py)
are both written from here, the corpus with every bank problem excluded. No torch.

A solution is five strings: three reasoning branches that each see only the prompt (tens, ones, an
estimate), a merge that sees all three and states the result, and the answer, which sees the prompt
and the merge only (docs/protocol.md §2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

BACKGROUND = (
    "Water boils at one hundred degrees Celsius at sea level.",
    "The Earth orbits the Sun once a year.",
    "A week has seven days.",
    "The Pacific is the largest ocean on Earth.",
    "Light travels faster than sound.",
    "Plants make their food from sunlight, water and air.",
    "The Moon orbits the Earth.",
    "Ice is frozen water.",
    "A triangle has three sides.",
    "The human heart pumps blood through the body.",
    "Honey is made by bees from the nectar of flowers.",
    "Mount Everest is the highest mountain above sea level.",
    "A year usually has three hundred and sixty-five days.",
    "Whales are mammals that live in the sea.",
    "The alphabet of the English language has twenty-six letters.",
    "Rain falls from clouds when water droplets grow heavy.",
    "Iron rusts when it meets water and air.",
    "The Sahara is a large desert in Africa.",
    "Sound cannot travel through empty space.",
    "A square has four equal sides.",
    "Bread is baked from flour, water and yeast.",
    "The Amazon river flows through South America.",
    "Copper conducts electricity well.",
    "Penguins cannot fly, but they swim well.",
    "A clock face shows twelve hours.",
    "Snow is made of small ice crystals.",
    "The Sun rises in the east.",
    "Trees take in carbon dioxide from the air.",
    "A rainbow shows the colours of white light.",
    "Salt dissolves in water.",
    "Bats are the only mammals that can truly fly.",
    "The Nile is one of the longest rivers in the world.",
    "Gold does not rust.",
    "A spider spins its web from silk.",
    "Most of the air we breathe is nitrogen.",
    "The Arctic is cold for most of the year.",
    "Leaves of many trees turn red and yellow in autumn.",
    "A compass needle points to the north.",
    "Glass is made by melting sand.",
    "Frogs begin life as tadpoles in water.",
    "The heart of a hummingbird beats very fast.",
    "Wool comes from the fleece of sheep.",
    "Volcanoes can throw out hot ash and lava.",
    "A magnet attracts iron.",
    "Owls hunt mostly at night.",
)
NAMES = ("Tom", "Anna", "Ravi", "Mei", "Lucas", "Sara", "Omar", "Nina", "Jack", "Lena", "Kofi", "Ines")
THINGS = ("apples", "stickers", "marbles", "books", "coins", "shells", "stamps", "pencils", "cards", "beads")
KINDS = ("add", "sub", "mul")


@dataclass(frozen=True)
class Problem:
    kind: str   # add, sub or mul
    a: int      # two digits
    b: int      # two digits (add, sub: b < a) or one digit (mul)
    story: bool  # asked as a one-step word problem instead of a bare sum

    @property
    def result(self) -> int:
        return {"add": self.a + self.b, "sub": self.a - self.b, "mul": self.a * self.b}[self.kind]

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.kind, self.a, self.b)


def draw(rng: random.Random, kind: str) -> Problem:
    if kind == "mul":
        return Problem(kind, rng.randint(12, 99), rng.randint(3, 9), rng.random() < 0.5)
    a = rng.randint(21, 99)
    b = rng.randint(11, 99) if kind == "add" else rng.randint(11, a - 1)
    return Problem(kind, a, b, rng.random() < 0.5)


def question(p: Problem, rng: random.Random) -> str:
    if not p.story:
        sign = {"add": "+", "sub": "-", "mul": "*"}[p.kind]
        return f"What is {p.a} {sign} {p.b}? Answer with a number only."
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if p.kind == "add":
        return f"{name} has {p.a} {thing} and gets {p.b} more. How many {thing} does {name} have now?"
    if p.kind == "sub":
        return f"{name} has {p.a} {thing} and gives {p.b} away. How many {thing} are left?"
    return f"{name} has {p.b} bags with {p.a} {thing} in each bag. How many {thing} are there in all?"


def prompt(p: Problem, rng: random.Random, sentences: int) -> str:
    """The chat-format prompt: `sentences` true background sentences, then the question."""
    background = " ".join(rng.sample(BACKGROUND, k=sentences))
    user = f"{background}\n\n{question(p, rng)}" if background else question(p, rng)
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _round(n: int) -> int:
    return (n + 5) // 10 * 10


def solution(p: Problem) -> tuple[str, str, str, str, str]:
    """(branch 1, branch 2, branch 3, merge, answer): the worked solution in the six-block format."""
    ta, oa = divmod(p.a, 10)
    if p.kind == "mul":
        tens, ones = 10 * ta * p.b, oa * p.b
        return (f"Multiply the tens. {p.a} has {ta} tens. {ta} tens times {p.b} is {ta * p.b} tens, "
                f"which is {tens}.",
                f"Multiply the ones. {p.a} has {oa} ones. {oa} times {p.b} is {ones}.",
                f"Estimate. {p.a} is close to {_round(p.a)}. {_round(p.a)} times {p.b} is "
                f"{_round(p.a) * p.b}, so the product is near {_round(p.a) * p.b}.",
                f"The tens give {tens} and the ones give {ones}. {tens} + {ones} = {p.result}. "
                f"This is near the estimate {_round(p.a) * p.b}, so the result is {p.result}.",
                str(p.result))
    tb, ob = divmod(p.b, 10)
    estimate = _round(p.a) + _round(p.b) if p.kind == "add" else _round(p.a) - _round(p.b)
    if p.kind == "add":
        tens, ones = 10 * (ta + tb), oa + ob
        joined = f"{tens} + {ones}"
        words = ("Add the tens", "plus", "Add the ones", "plus", "sum")
    else:
        tens, ones = 10 * (ta - tb), oa - ob
        joined = f"{tens} + {ones}" if ones >= 0 else f"{tens} - {-ones}"
        words = ("Subtract the tens", "minus", "Subtract the ones", "minus", "difference")
    sign = "+" if p.kind == "add" else "-"
    return (f"{words[0]}. {p.a} has {ta} tens and {p.b} has {tb} tens. {ta} tens {words[1]} {tb} tens "
            f"is {tens // 10} tens, which is {tens}.",
            f"{words[2]}. {p.a} has {oa} ones and {p.b} has {ob} ones. {oa} {words[3]} {ob} is {ones}.",
            f"Estimate. {p.a} is close to {_round(p.a)} and {p.b} is close to {_round(p.b)}. "
            f"{_round(p.a)} {sign} {_round(p.b)} = {estimate}, so the {words[4]} is near {estimate}.",
            f"The tens give {tens} and the ones give {ones}. {joined} = {p.result}. "
            f"This is near the estimate {estimate}, so the result is {p.result}.",
            str(p.result))


def problem_set(seed: int, count: int, sentences: tuple[int, int]) -> list[tuple[Problem, str]]:
    """`count` problems, the kinds in turn, each with its prompt (background sentences drawn in the
    range `sentences`), seeded."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        p = draw(rng, KINDS[index % len(KINDS)])
        out.append((p, prompt(p, rng, rng.randint(*sentences))))
    return out


def corpus(seed: int, count: int, exclude: set[tuple[str, int, int]],
           sentences: tuple[int, int]) -> list[tuple[Problem, str, tuple[str, ...]]]:
    """The training examples: (problem, prompt, solution) for `count` seeded problems, none of them in
    `exclude` (the bank's problems, by kind and operands)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        p = draw(rng, KINDS[len(out) % len(KINDS)])
        if p.key in exclude:
            continue
        out.append((p, prompt(p, rng, rng.randint(*sentences)), solution(p)))
    return out
