"""The embedded model's tasks: prompts with checkable answers, answered by a short sentence.

Prompt format (documented in assets/tiny-llada/README.md):

    add  `Q: 48+57=? A:`  ->  ` The sum is 105.`   ` The sum is  98.`
    sub  `Q: 48-57=? A:`  ->  ` The difference is  -9.`   ` The difference is  34.`

Operands are 10-99. The result is right-aligned in a field of three characters, so each digit
of the answer sits at the same position in every response: measured on this project's CPU, a
small model trained with left-aligned results (whose units digit moves with the result's length)
left the units digit at chance after 3,400 steps, while the right-aligned format learned the
arithmetic within the hour (assets/tiny-llada/README.md).

Each family has a seeded generator, a checker that accepts exactly the templated sentence, and a
held-out split chosen by a hash of the operands, so the split is the same on every machine and
training (which samples only the train split) never sees it.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Callable

from .errors import EngineError

HELD_OUT_PERCENT = 10  # of each family's operand pairs
OPERAND_RANGE = range(10, 100)
RESULT_WIDTH = 3  # "105", " 98", "-34", " -9": every result digit at a fixed position


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    response: str  # what the model should generate before EOS
    answer: int


def is_held_out(task: str, a: int, b: int) -> bool:
    """A stable hash (not Python's salted `hash`) so the split never changes between runs."""
    digest = hashlib.sha256(f"{task}:{a}:{b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


@functools.cache
def _split_pairs(task: str, held_out: bool) -> tuple[tuple[int, int], ...]:
    return tuple((a, b) for a in OPERAND_RANGE for b in OPERAND_RANGE if is_held_out(task, a, b) == held_out)


@dataclass(frozen=True)
class ArithmeticTask:
    """Two-operand arithmetic answered by `<sentence> <result right-aligned in 3 characters>.`"""

    name: str
    symbol: str
    sentence: str
    compute: Callable[[int, int], int]

    def example(self, a: int, b: int) -> Example:
        result = self.compute(a, b)
        return Example(self.name, f"Q: {a}{self.symbol}{b}=? A:", f" {self.sentence} {result:>{RESULT_WIDTH}}.", result)

    def pairs(self, split: str) -> list[tuple[int, int]]:
        if split not in ("train", "held_out"):
            raise EngineError(f"unknown split '{split}'; choose train or held_out")
        return list(_split_pairs(self.name, split == "held_out"))

    def examples(self, split: str) -> list[Example]:
        return [self.example(a, b) for a, b in self.pairs(split)]

    def extract(self, response: str) -> int | None:
        """The number of an exactly templated response (surrounding whitespace aside), else None.

        The number's field must be exactly as the template writes it: right-aligned, 3 wide.
        """
        match = re.fullmatch(rf"\s*{re.escape(self.sentence)} ( *-?\d+)\.\s*", response)
        if not match:
            return None
        value = int(match.group(1))
        return value if match.group(1) == f"{value:>{RESULT_WIDTH}}" else None

    def check(self, example: Example, response: str) -> bool:
        return self.extract(response) == example.answer


TASKS: dict[str, ArithmeticTask] = {
    task.name: task
    for task in (
        ArithmeticTask("add", "+", "The sum is", lambda a, b: a + b),
        ArithmeticTask("sub", "-", "The difference is", lambda a, b: a - b),
    )
}


def parse_prompt(prompt: str) -> Example | None:
    """The example a task prompt asks for (`Q: 123+45=? A:`, any non-negative operands), else None.

    Operands outside 10-99 parse too: their right answer is known even though no model saw them.
    """
    for task in TASKS.values():
        match = re.fullmatch(rf"Q: (\d+){re.escape(task.symbol)}(\d+)=\? A:", prompt.strip())
        if match:
            return task.example(int(match.group(1)), int(match.group(2)))
    return None


def get_task(name: str) -> ArithmeticTask:
    if name not in TASKS:
        raise EngineError(f"unknown task '{name}'; choose from {', '.join(TASKS)}")
    return TASKS[name]


class ExampleSampler:
    """Seeded stream of training examples: a family (uniformly, or by `weights`), then one of its train pairs."""

    def __init__(self, task_names: list[str], seed: int, split: str = "train", weights: list[float] | None = None) -> None:
        self.tasks = [get_task(n) for n in task_names]
        if weights is not None and (len(weights) != len(self.tasks) or min(weights) < 0 or sum(weights) <= 0):
            raise EngineError(f"need one non-negative weight per task ({len(self.tasks)}), not all zero; got {list(weights)}")
        self.weights = list(weights) if weights is not None else [1.0] * len(self.tasks)
        self.pairs = {t.name: t.pairs(split) for t in self.tasks}
        self.rng = random.Random(seed)

    def sample(self) -> Example:
        task = self.rng.choices(self.tasks, weights=self.weights)[0]
        a, b = self.rng.choice(self.pairs[task.name])
        return task.example(a, b)

    def batch(self, size: int) -> list[Example]:
        return [self.sample() for _ in range(size)]

    def state(self) -> object:
        return self.rng.getstate()

    def restore(self, state: object) -> None:
        self.rng.setstate(state)


def held_out_examples(task_names: list[str], limit: int | None = None, seed: int = 0) -> list[Example]:
    """Each family's held-out examples, a seeded sample of `limit` per family when given."""
    out: list[Example] = []
    for name in task_names:
        examples = get_task(name).examples("held_out")
        if limit is not None and limit < len(examples):
            examples = random.Random(seed).sample(examples, limit)
        out.extend(examples)
    return out


OUT_OF_RANGE_OPERANDS = (range(1, 10), range(100, 200))  # one operand from these, the other 10-99


def out_of_range_examples(task_names: list[str], limit: int, seed: int = 0) -> list[Example]:
    """Per family, `limit` seeded prompts with one operand outside 10-99 (one or three digits).

    No training example looks like these, so a model trained on the tasks gets most of them wrong:
    they show what its committed confidence looks like when it is wrong (engine/eval.py `--split`).
    """
    rng = random.Random(seed)
    out: list[Example] = []
    for name in task_names:
        task = get_task(name)
        for _ in range(limit):
            odd = rng.choice(rng.choice(OUT_OF_RANGE_OPERANDS))
            usual = rng.choice(OPERAND_RANGE)
            out.append(task.example(*((odd, usual) if rng.random() < 0.5 else (usual, odd))))
    return out
