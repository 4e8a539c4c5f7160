"""Known answers: the embedded model's task prompts (engine/tasks.py) and where a run went wrong.

A prompt from a task family has one right response; the grid marks committed tokens that differ
from it, and `first_wrong` finds the first such commit with the confidence it had then.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import Engine
from engine import tasks as engine_tasks

from .timeline import Timeline


def task_names() -> list[str]:
    return list(engine_tasks.TASKS)


def expected_response(prompt: str) -> str:
    """The right response when `prompt` is a task prompt (any operands), else ''."""
    example = engine_tasks.parse_prompt(prompt)
    return example.response if example else ""


def expected_ids(engine: Engine, response: str) -> list[int] | None:
    """Token ids the generation should hold from the prompt's end: the response, then an end of text."""
    if not response:
        return None
    return list(engine.encode(response, use_chat_template=False)) + [engine.stop_ids[0]]


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
