"""Fill-in-the-middle cases on the embedded model's held-out families (docs/algorithms.md §11): a
hole inside a known answer, the text after it pinned, and the family's verifier on the whole answer.

    pairsum  `Q: ?+?=57 A:`   hole of 3, suffix ` + 34`          the hole must hold 23 (57 - 34)
    add/sub  `Q: 12+345=? A:` hole of 4, suffix `+345= 357`      the hole must hold the first operand
    grammar  `the red`        hole up to the last two words, suffix ` small cat.`   the sentence must parse

The pinned values are drawn by a seeded RNG over the valid choices (pair-sum: any split of the
held-out sum; grammar: a held-out prompt's sampled sentence). Each case is answered twice with the
same hole: with the suffix pinned, and without it (the same `gen_length`, nothing after the hole),
where the hole is then checked against the suffix the model never saw: what seeing the pinned end
is worth. benchmarks/infill.py prints the table; tinymodel.span logs the pair-sum rate at each
checkpoint; tests/test_infill_eval.py tests the cases and the scoring.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from engine import Engine, GenerationConfig

from .tasks import Arithmetic, Example, Grammar, PairSum, get_task

INFILL_TASKS = ("pairsum", "add", "sub", "grammar")
PINNED_WORDS = 2  # grammar: the sentence's last words pinned (with its full stop), fewer if the rest is one word


@dataclass(frozen=True)
class InfillCase:
    """One held-out prompt with a hole of `hole` positions and the text pinned after it."""

    example: Example  # the prompt, its family and (arithmetic, pair-sum) the answer the verifier wants
    hole: int
    suffix: str

    def valid(self, filled: str) -> bool:
        """The family's verifier on the answer the hole's text makes with the pinned suffix; an
        arithmetic answer's pinned result must also be what its operands give (the verifier reads
        only the result, which is pinned)."""
        family = get_task(self.example.task)
        answer = filled + self.suffix
        if isinstance(family, Arithmetic):
            return family.check(self.example, answer) and answer.replace(" ", "") == self.example.response.replace(" ", "")
        return family.check(self.example, answer)


def pairsum_cases(limit: int | None = None, seed: int = 0) -> list[InfillCase]:
    """Held-out sums N, a seeded valid split a + b = N each: the hole of 3 holds a, ` +bbb` pinned."""
    family: PairSum = get_task("pairsum")
    rng, cases = random.Random(f"infill:pairsum:{seed}"), []
    for n in family.sums("held_out"):
        a = rng.choice(range(max(0, n - 99), min(n, 99) + 1))
        cases.append(InfillCase(family.example(n, a), 3, f" +{n - a:>3}"))
    return _sample(cases, limit, rng)


def arithmetic_cases(name: str, limit: int, seed: int = 0) -> list[InfillCase]:
    """Held-out `a<op>b`: the hole of 4 holds ` aaa`, `<op>bbb= rrrr` (the answer) pinned after it."""
    family: Arithmetic = get_task(name)
    return [InfillCase(e, 4, e.response[4:]) for e in family.prompts("held_out", limit, seed)]


def grammar_cases(limit: int, seed: int = 0) -> list[InfillCase]:
    """Held-out sentence starts, the rest of a sampled sentence with its last words pinned: the
    hole is as long as the words before them (a word of another length fits if spaces or
    end-of-text make up the difference)."""
    family: Grammar = get_task("grammar")
    cases = []
    for e in family.prompts("held_out", limit, seed):
        words = e.response.split()
        pinned = " " + " ".join(words[-min(PINNED_WORDS, len(words) - 1) :])  # a word at least in the hole
        cases.append(InfillCase(e, len(e.response) - len(pinned), pinned))
    return cases


def infill_cases(task: str, limit: int, seed: int = 0) -> list[InfillCase]:
    """`limit` held-out cases of `task` (pair-sum has 34 held-out sums: at most that many)."""
    if task == "pairsum":
        return pairsum_cases(limit, seed)
    if task == "grammar":
        return grammar_cases(limit, seed)
    return arithmetic_cases(task, limit, seed)


def _sample(cases: list[InfillCase], limit: int | None, rng: random.Random) -> list[InfillCase]:
    return cases if limit is None or limit >= len(cases) else rng.sample(cases, limit)


@dataclass
class InfillScore:
    n: int = 0
    valid: int = 0
    tokens: int = 0
    forwards: int = 0

    @property
    def accuracy(self) -> float:
        return self.valid / self.n if self.n else 0.0

    @property
    def tpf(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0


def score_infill(engine: Engine, cases: list[InfillCase], config: GenerationConfig, pinned: bool) -> InfillScore:
    """Each case's hole filled with `config` (`gen_length` and `block_length` set to the hole), with the suffix
    pinned or without it, one request a case (the suffix is a request's); verified with the suffix."""
    score = InfillScore()
    for case in cases:
        request = replace(config, gen_length=case.hole, block_length=case.hole, suffix=case.suffix if pinned else None, use_chat_template=False)
        result = engine.generate(case.example.prompt, request)
        score.n += 1
        score.valid += case.valid(result.holes[0][0] if pinned else result.text)
        score.tokens += result.output.stats.tokens
        score.forwards += result.output.stats.nfe
    return score
