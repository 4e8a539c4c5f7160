"""Known answers: the embedded model's task prompts (tinymodel/tasks.py) and where a run went wrong.

An arithmetic prompt has one right response: the grid marks committed tokens that differ from it,
and `first_wrong` finds the first such commit with the confidence it had then. Pair-sum, rhyme and
grammar prompts have many valid responses, so no token is "the" expected one: the family's verifier
judges the finished answer instead (`verdict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tinymodel import tasks as model_tasks
from tinymodel.grammar import vocabulary_text

from ..live.host import DISTILLED, embedded_models, model_title
from ..reading.timeline import Timeline


def task_names() -> list[str]:
    return list(model_tasks.TASKS)


FAMILY_DESCRIPTIONS = {
    "add": "addition, operands 0-999: one right answer",
    "sub": "subtraction, operands 0-999: one right answer",
    "pairsum": "pair-sum: any a + b = N with a, b in 0-99 is valid (many answers that depend on each other)",
    "rhyme": "rhyme: any other word of the prompt word's rhyme group is valid",
    "grammar": "grammar: a sentence's first words; any completion that parses is valid",
}
# Per family, prompts the app offers as examples: each answered right by the shipped model with the
# default decoder; some held out (never trained on), others from the training split (the tasks'
# is_held_out says which).
FAMILY_EXAMPLES = {
    "pairsum": ["Q: ?+?=38 A:", "Q: ?+?=57 A:", "Q: ?+?=120 A:", "Q: ?+?=9 A:"],
    "add": ["Q: 7+58=? A:", "Q: 123+45=? A:", "Q: 908+376=? A:"],
    "sub": ["Q: 7-65=? A:", "Q: 250-999=? A:"],
    "rhyme": ["Q: rhymes with cat? A:", "Q: rhymes with night? A:"],
    "grammar": ["the red fox", "the slow"],
}
OUT_OF_FAMILY_EXAMPLES = ["Hello, how are you?", "Q: 1234+5678=? A:"]
# Pair-sum's shape with no sum: in no family, on purpose (lesson 7: the model is unsure of the
# answer's shape, which a regex then holds); its note says so instead of warning of nonsense
NO_SUM_PROMPT = "Q: ?+? A:"


def single_answer(example: model_tasks.Example) -> bool:
    """Arithmetic has one right answer; the other families have many."""
    return isinstance(model_tasks.get_task(example.task), model_tasks.Arithmetic)


def expected_response(prompt: str) -> str:
    """The right response when `prompt` is an arithmetic prompt (one right answer), else ''.

    The only answer the page fills the expected box with (typing, an example, a Tune trial or a
    sweep's wrong answer opened): one of many right answers would strike out valid ones."""
    example = model_tasks.parse_prompt(prompt)
    return example.response if example and single_answer(example) else ""


def no_first_wrong(example: model_tasks.Example) -> str:
    """Why a wrong answer of a family with many right answers has no first wrong commit: no token
    is wrong against "the" answer, and the verifier judges only the finished text."""
    return (
        f"no first wrong commit: {example.task} has many right answers, so no commit is wrong against one of them "
        "(the verifier judged the finished answer; left out)"
    )


def prompt_note(prompt: str) -> str:
    """One line on what the embedded model knows about this prompt (shown under the prompt box)."""
    if not prompt.strip():
        return ""
    example = model_tasks.parse_prompt(prompt)
    if prompt.strip() == NO_SUM_PROMPT:
        return (
            "outside every family **on purpose** (lesson 7): pair-sum's shape with no sum, so the model is unsure of the "
            "answer's shape; no verifier judges it (a regex can hold it to ` a + b`)"
        )
    if example is None:
        return (
            "⚠ **outside every family** the embedded model was trained on: expect low confidence and "
            "nonsense (see *What this model knows*)"
        )
    note = f"family **{example.task}**: {FAMILY_DESCRIPTIONS[example.task]}"
    if isinstance(model_tasks.get_task(example.task), model_tasks.Arithmetic) and max(map(len, _operands(prompt))) > 3:
        note += " (⚠ an operand above 999: out of the trained range)"
    return note


def _operands(prompt: str) -> list[str]:
    return [t for t in re.split(r"[^0-9]+", prompt) if t]


def verdict(prompt: str, text: str) -> str:
    """'' outside the families, else whether the family's verifier accepts `text` as the answer."""
    example = model_tasks.parse_prompt(prompt)
    if example is None:
        return ""
    ok = model_tasks.get_task(example.task).check(example, text)
    return f"{example.task} verifier: {'valid' if ok else 'NOT valid'}"


def model_knows_markdown() -> str:
    """What the embedded model was trained on: families, example prompts, the grammar's words."""
    lines = ["The embedded model (assets/tiny-llada) knows five task families and nothing else:", ""]
    for name, description in FAMILY_DESCRIPTIONS.items():
        examples = ", ".join(f"`{p}`" for p in FAMILY_EXAMPLES[name])
        lines.append(f"- **{name}**: {description}. e.g. {examples}")
    if DISTILLED in embedded_models():
        lines += [
            "",
            f"**{model_title(DISTILLED)}** (assets/{DISTILLED}, docs/distillation.md) knows the same families: the same "
            "model, architecture and tokenizer, post-trained on its own verified decodings to commit more tokens per "
            "forward. Name it as the model, or set the two side by side in Compare (model B) and in the threshold sweep.",
        ]
    lines += ["", "Words of the grammar and the rhyme groups (type a sentence start of your own):", "", "```", vocabulary_text(), "```"]
    return "\n".join(lines)


@dataclass(frozen=True)
class WrongCommit:
    position: int
    iteration: int
    token: int
    expected: int
    confidence: float
    forced: bool


def first_wrong(timeline: Timeline, expected: list[int]) -> WrongCommit | None:
    """The earliest-committed token that differs from `expected` (ties: leftmost)."""
    wrong = []
    for p, c in timeline.commits.items():
        offset = p - timeline.prompt_length
        if 0 <= offset < len(expected) and c.token != expected[offset]:
            wrong.append(WrongCommit(p, c.iteration, c.token, expected[offset], c.confidence, c.forced))
    return min(wrong, key=lambda w: (w.iteration, w.position)) if wrong else None
