"""The embedded model's task families: seeded generators, verifiers and stable held-out splits.

    add      `Q: 123+45=? A:`    ->  ` 123+ 45= 168`     operands 0..999, result read after `=`
    sub      `Q: 7-65=? A:`      ->  `   7- 65= -58`
    pairsum  `Q: ?+?=57 A:`      ->  ` 23 + 34`          any a + b = N with a, b in 0..99 is valid
    rhyme    `Q: rhymes with cat? A:`  ->  ` hat`       any other word of the rhyme group is valid
    grammar  `the red fox`       ->  ` chased my small cat.`   valid when the whole sentence parses

Arithmetic answers restate both operands right-aligned in three characters before the result
(right-aligned in four): the prompt's operands move with their lengths, but inside the answer every
digit of a column sits at the same offset, so the result is a fixed-offset computation once the
operands are copied (copying by content is easy for attention; adding digits at varying offsets is
what the previous model could not learn). It also gives the animation an order: copies first, then
the result's digits.

Pair-sum, rhyme and grammar have many valid answers whose positions depend on each other, which
is the speed/accuracy trade-off parallel decoders exist for (assets/tiny-llada/README.md, "Task
families").

Prompts vary in length within every family, so no answer sits at a fixed absolute position. Each
family's held-out split is chosen by a SHA-256 hash of what the prompt asks (not Python's salted
`hash`), so it is the same on every machine, and training samples only the train split.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from engine.errors import EngineError

from . import grammar

SPLITS = ("train", "held_out")


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    response: str  # one valid response (what the model generates before EOS); the app's expected answer
    answer: int | None = None  # arithmetic's result
    group: str = ""  # the subgroup results are reported by (arithmetic: digits of the first operand)


def is_held_out(key: str, percent: int) -> bool:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def _check_split(split: str) -> bool:
    if split not in SPLITS:
        raise EngineError(f"unknown split '{split}'; choose train or held_out")
    return split == "held_out"


OPERAND_DIGITS = (1, 2, 3)


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


@dataclass(frozen=True)
class Arithmetic:
    """`Q: a+b=? A:` -> ` aaa+ bbb= rrrr` (operands right-aligned in 3, result in 4 characters)."""

    name: str
    symbol: str
    held_out_percent: int = 10

    def compute(self, a: int, b: int) -> int:
        return a + b if self.symbol == "+" else a - b

    def example(self, a: int, b: int) -> Example:
        result = self.compute(a, b)
        return Example(
            self.name,
            f"Q: {a}{self.symbol}{b}=? A:",
            f" {a:>3}{self.symbol}{b:>3}={result:>4}",
            result,
            f"{len(str(a))}-digit",
        )

    def is_held_out(self, a: int, b: int) -> bool:
        return is_held_out(f"{self.name}:{a}:{b}", self.held_out_percent)

    def sample(self, rng: random.Random, split: str = "train") -> Example:
        """Digits of each operand uniform in 1-3, then the operand uniform among those numbers."""
        held_out = _check_split(split)
        while True:
            a, b = (_operand(rng, rng.choice(OPERAND_DIGITS)) for _ in range(2))
            if self.is_held_out(a, b) == held_out:
                return self.example(a, b)

    def prompts(self, split: str, limit: int, seed: int = 0) -> list[Example]:
        """`limit` distinct prompts of `split`, a third for each digit count of the first operand."""
        held_out = _check_split(split)
        rng, out = random.Random(f"{self.name}:{seed}"), []
        for digits in OPERAND_DIGITS:
            while len(out) < limit * digits // len(OPERAND_DIGITS):
                a, b = _operand(rng, digits), _operand(rng, rng.choice(OPERAND_DIGITS))
                if self.is_held_out(a, b) == held_out and self.example(a, b) not in out:
                    out.append(self.example(a, b))
        return out

    def extract(self, response: str) -> int | None:
        """The result of a response shaped `a<op>b=result` (any spacing), else None."""
        match = re.fullmatch(rf"\s*\d+ *{re.escape(self.symbol)} *\d+ *= *(-?\d+)\s*", response)
        return int(match.group(1)) if match else None

    def check(self, example: Example, response: str) -> bool:
        return self.extract(response) == example.answer

    def parse(self, prompt: str) -> Example | None:
        match = re.fullmatch(rf"Q: (\d+){re.escape(self.symbol)}(\d+)=\? A:", prompt.strip())
        return self.example(int(match.group(1)), int(match.group(2))) if match else None


PAIR_OPERANDS = range(100)  # a and b in 0..99
PAIR_SUMS = range(199)  # N in 0..198


def _pair_splits(n: int) -> range:
    """The first operands a with a + b = n, a and b in 0..99."""
    return range(max(0, n - 99), min(n, 99) + 1)


@dataclass(frozen=True)
class PairSum:
    """`Q: ?+?=N A:` -> any ` a + b` with a + b = N, a, b in 0..99 (right-aligned: `  5 + 52`)."""

    name: str = "pairsum"
    held_out_percent: int = 15

    def example(self, n: int, a: int | None = None) -> Example:
        splits = _pair_splits(n)
        a = splits[len(splits) // 2] if a is None else a
        return Example(self.name, f"Q: ?+?={n} A:", f"{a:>3} +{n - a:>3}", n)

    def sums(self, split: str) -> list[int]:
        held_out = _check_split(split)
        return [n for n in PAIR_SUMS if is_held_out(f"{self.name}:{n}", self.held_out_percent) == held_out]

    def sample(self, rng: random.Random, split: str = "train") -> Example:
        """N uniform over the split's sums, then a uniform among N's valid splits."""
        n = rng.choice(self.sums(split))
        return self.example(n, rng.choice(_pair_splits(n)))

    def prompts(self, split: str, limit: int, seed: int = 0) -> list[Example]:
        sums = self.sums(split)
        if limit < len(sums):
            sums = sorted(random.Random(f"{self.name}:{seed}").sample(sums, limit))
        return [self.example(n) for n in sums]

    def check(self, example: Example, response: str) -> bool:
        match = re.fullmatch(r"\s*(0|[1-9]\d?) *\+ *(0|[1-9]\d?)\s*", response)
        return bool(match) and int(match.group(1)) + int(match.group(2)) == example.answer

    def parse(self, prompt: str) -> Example | None:
        match = re.fullmatch(r"Q: \?\+\?=(\d+) A:", prompt.strip())
        return self.example(int(match.group(1))) if match and int(match.group(1)) in PAIR_SUMS else None


@dataclass(frozen=True)
class Rhyme:
    """`Q: rhymes with cat? A:` -> ` hat`: any other word of the prompt word's rhyme group."""

    name: str = "rhyme"
    held_out_percent: int = 20

    def example(self, word: str, answer: str | None = None) -> Example:
        group = grammar.rhyme_group(word)
        answer = answer or next(w for w in group if w != word)
        return Example(self.name, f"Q: rhymes with {word}? A:", f" {answer}")

    def words(self, split: str) -> list[str]:
        held_out = _check_split(split)
        return [w for g in grammar.RHYME_GROUPS for w in g if is_held_out(f"{self.name}:{w}", self.held_out_percent) == held_out]

    def sample(self, rng: random.Random, split: str = "train") -> Example:
        word = rng.choice(self.words(split))
        return self.example(word, rng.choice([w for w in grammar.rhyme_group(word) if w != word]))

    def prompts(self, split: str, limit: int, seed: int = 0) -> list[Example]:
        words = self.words(split)
        if limit < len(words):
            words = random.Random(f"{self.name}:{seed}").sample(words, limit)
        return [self.example(w) for w in words]

    def check(self, example: Example, response: str) -> bool:
        word = re.fullmatch(r"Q: rhymes with (\w+)\? A:", example.prompt).group(1)
        answer = response.strip()
        return answer != word and answer in grammar.rhyme_group(word)

    def parse(self, prompt: str) -> Example | None:
        match = re.fullmatch(r"Q: rhymes with ([a-z]+)\? A:", prompt.strip())
        return self.example(match.group(1)) if match and grammar.rhyme_group(match.group(1)) else None


@dataclass(frozen=True)
class Grammar:
    """A sentence's first two or three words -> the rest of a sentence that parses."""

    name: str = "grammar"
    held_out_percent: int = 10

    def sentence(self, rng: random.Random) -> list[str]:
        return [rng.choice(grammar.WORDS_BY_TAG[tag]) for tag in rng.choice(grammar.sentence_shapes())]

    def example(self, words: list[str], prompt_words: int) -> Example:
        return Example(self.name, " ".join(words[:prompt_words]), " " + " ".join(words[prompt_words:]) + ".")

    def sample(self, rng: random.Random, split: str = "train") -> Example:
        held_out = _check_split(split)
        while True:
            example = self.example(self.sentence(rng), rng.choice((2, 3)))
            if is_held_out(f"{self.name}:{example.prompt}", self.held_out_percent) == held_out:
                return example

    def prompts(self, split: str, limit: int, seed: int = 0) -> list[Example]:
        rng, out, prompts = random.Random(f"{self.name}:{seed}"), [], set()
        while len(out) < limit:
            example = self.sample(rng, split)
            if example.prompt not in prompts:
                prompts.add(example.prompt)
                out.append(example)
        return out

    def check(self, example: Example, response: str) -> bool:
        text = (example.prompt + response).strip()
        return text.endswith(".") and " ".join(text[:-1].split()) == text[:-1] and grammar.parses(text[:-1].split())

    def parse(self, prompt: str) -> Example | None:
        words = prompt.split()
        if not (2 <= len(words) <= 5) or " ".join(words) != prompt.strip() or not grammar.is_sentence_start(words):
            return None
        # a valid completion for the app's "expected" row: the first word of each slot still open
        shape = next(s for s in grammar.sentence_shapes() if s[: len(words)] == tuple(grammar.PART_OF_SPEECH[w] for w in words))
        rest = [grammar.WORDS_BY_TAG[tag][0] for tag in shape[len(words) :]]
        return Example(self.name, " ".join(words), " " + " ".join(rest) + "." if rest else ".")


Family = Arithmetic | PairSum | Rhyme | Grammar
TASKS: dict[str, Family] = {
    family.name: family for family in (Arithmetic("add", "+"), Arithmetic("sub", "-"), PairSum(), Rhyme(), Grammar())
}


def get_task(name: str) -> Family:
    if name not in TASKS:
        raise EngineError(f"unknown task '{name}'; choose from {', '.join(TASKS)}")
    return TASKS[name]


def parse_prompt(prompt: str) -> Example | None:
    """The example a prompt of some family asks for (arithmetic with any operands), else None."""
    for family in TASKS.values():
        example = family.parse(prompt)
        if example is not None:
            return example
    return None


class ExampleSampler:
    """Seeded stream of training examples: a family (uniformly, or by `weights`), then one of its train examples."""

    def __init__(self, task_names: list[str], seed: int, split: str = "train", weights: list[float] | None = None) -> None:
        self.tasks = [get_task(n) for n in task_names]
        if weights is not None and (len(weights) != len(self.tasks) or min(weights) < 0 or sum(weights) <= 0):
            raise EngineError(f"need one non-negative weight per task ({len(self.tasks)}), not all zero; got {list(weights)}")
        self.weights = list(weights) if weights is not None else [1.0] * len(self.tasks)
        self.split = split
        _check_split(split)
        self.rng = random.Random(seed)

    def sample(self) -> Example:
        task = self.rng.choices(self.tasks, weights=self.weights)[0]
        return task.sample(self.rng, self.split)

    def batch(self, size: int) -> list[Example]:
        return [self.sample() for _ in range(size)]

    def state(self) -> object:
        return self.rng.getstate()

    def restore(self, state: object) -> None:
        self.rng.setstate(state)


def split_examples(task_names: list[str], split: str = "held_out", limit: int | None = None, seed: int = 0) -> list[Example]:
    """Each family's distinct prompts of `split`: `limit` per family (a seeded sample), default 300
    (all where fewer). The held-out ones score a model; training-split ones choose between
    checkpoints without looking at what is reported (`python -m tinymodel.eval --split train`)."""
    return [e for name in task_names for e in get_task(name).prompts(split, 300 if limit is None else limit, seed)]


# Prompts outside every family (`--split free_text` of the eval): no verifier, only what the
# model's committed confidence looks like on text it never saw.
FREE_TEXT_PROMPTS = (
    "Hello, how are you?", "What is the capital of France?", "Tell me a story about a dragon.",
    "Q: 2*3=? A:", "Q: what is love? A:", "the red fox jumped over the lazy dog", "Once upon a time",
    "Translate to French: good morning", "def add(a, b):", "1, 2, 3, 4,", "Q: ?*?=12 A:", "Q: rhymes with dog? A:",
    "My favourite colour is", "SELECT * FROM users;", "Why is the sky blue?", "Q: 12/4=? A:",
    "Write a haiku about rain.", "The quick brown", "Q: spell cat backwards A:", "Dear Sir or Madam,",
)  # fmt: skip


def free_text_examples() -> list[Example]:
    return [Example("free text", prompt, "") for prompt in FREE_TEXT_PROMPTS]


OUT_OF_RANGE_OPERANDS = range(1000, 10000)  # four digits: no training example has one


def out_of_range_examples(task_names: list[str], limit: int, seed: int = 0) -> list[Example]:
    """Per arithmetic family, `limit` seeded prompts with one four-digit operand.

    No training example looks like these, so a model trained on the tasks gets most of them wrong:
    they show what its committed confidence looks like when it is wrong (`--split out_of_range`).
    Families whose prompts cannot go out of range (pair-sum, rhyme, grammar) contribute none.
    """
    rng = random.Random(seed)
    out: list[Example] = []
    for name in task_names:
        task = get_task(name)
        if not isinstance(task, Arithmetic):
            continue
        for _ in range(limit):
            odd, usual = rng.choice(OUT_OF_RANGE_OPERANDS), _operand(rng, rng.choice(OPERAND_DIGITS))
            out.append(task.example(*((odd, usual) if rng.random() < 0.5 else (usual, odd))))
    return out
