"""lm-eval hooks of the tiny_families task: the embedded model's own verifiers (tinymodel/tasks.py)."""

from __future__ import annotations

from tinymodel.tasks import get_task, parse_prompt


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """valid: 1.0 when the family's verifier accepts the generated answer (any valid answer counts:
    pair sums and rhymes have many), else 0.0."""
    example = parse_prompt(doc["prompt"])
    if example is None or example.task != doc["task"]:
        raise ValueError(f"not a prompt of the {doc['task']} family: {doc['prompt']!r}")
    return {"valid": float(get_task(doc["task"]).check(example, results[0]))}
