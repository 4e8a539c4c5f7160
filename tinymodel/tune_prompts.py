"""The embedded tasks as the tuner's prompts: each family's tuning (train) and held-out splits,
scored by the family's verifier through `answer_prompts` (docs/tuning.md §3).

The split is tinymodel/tasks.py's (`split_examples`, a SHA-256 hash of what a prompt asks), the
one the Sweep tab reads too (dinfer_viz/studies/sweep_study.py `sweep_examples`): trials run the train split,
the front's report the held-out one, never a prompt of both. A prompts file (one prompt a line,
each of some family, whose verifier scores it, as the sweep's own prompts) is split by the same
hash of each line (`FILE_HELD_OUT_PERCENT` held out).

`python -m engine tune` loads this module by name (engine/tuning/command.py): the engine never
imports this package, whose tasks are the project's own, not the engine's.
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine.errors import EngineError
from engine.pipeline import Engine
from engine.tuning.study import HELD_OUT_SPLIT, TUNING_SPLIT, Evaluate, Figures

from .eval import answer_prompts, check_answer
from .tasks import Example, get_task, is_held_out, parse_prompt, split_examples

FILE_HELD_OUT_PERCENT = 30
MAX_FILE_PROMPTS = 300  # as many as the sweep takes of a user's own


def file_examples(path: str, split: str) -> list[Example]:
    """The prompts of `path` on `split`; EngineError in one line for a line in no family."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineError(f"cannot read --prompts-file {path[:200]}: {getattr(exc, 'strerror', None) or exc}") from None
    if len([line for line in lines if line.strip()]) > MAX_FILE_PROMPTS:
        raise EngineError(f"--prompts-file holds more than {MAX_FILE_PROMPTS} prompts")
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        example = parse_prompt(line)
        if example is None:
            raise EngineError(f"--prompts-file line {number} ({line.strip()[:40]!r}) is in no task family, so it cannot be scored")
        if is_held_out(f"prompts-file:{example.prompt}", FILE_HELD_OUT_PERCENT) == (split == HELD_OUT_SPLIT):
            out.append(example)
    return out


def tune_examples(families: list[str], split: str, per_family: int, seed: int = 0, prompts_file: str | None = None) -> list[Example]:
    """The prompts of `split`: `per_family` seeded ones of each family, or a file's."""
    if prompts_file:
        examples = file_examples(prompts_file, split)
    else:
        for name in families:
            get_task(name)  # EngineError naming the families for an unknown one
        examples = split_examples(families, split, limit=per_family, seed=seed)
    if not examples:
        raise EngineError(f"no {split} prompts: name a family (--families) or give more lines in --prompts-file")
    return examples


def evaluator(engine: Engine, splits: dict[str, list[Example]], cancel: threading.Event | None = None) -> Evaluate:
    """Score a config on a split's prompts, one prompt a call (TPF is the per-sequence figure), each
    answer by its family's verifier; `cancel` stops the running call (GenerationCancelled)."""
    encoded: dict[str, list[list[int]]] = {}

    def evaluate(config, split: str) -> Figures:
        examples = splits[split]
        key = f"{split}:{config.use_chat_template}"
        if key not in encoded:
            encoded[key] = [engine.encode(ex.prompt, config.use_chat_template) for ex in examples]
        figures = Figures()
        for answer in answer_prompts(engine.generate_ids, engine.decode, examples, encoded[key], config, check_answer, cancel=cancel):
            stats = answer.output.stats
            figures.add(bool(answer.correct), stats.tokens, stats.nfe, stats.seconds, answer.item.prompt, answer.text)
        return figures

    return evaluate


def make_evaluator(engine: Engine, families: list[str], per_family: int, seed: int = 0, prompts_file: str | None = None, cancel: threading.Event | None = None) -> Evaluate:
    """`python -m engine tune`'s scorer: both splits' prompts (each checked before any trial)."""
    return evaluator(engine, {s: tune_examples(families, s, per_family, seed, prompts_file) for s in (TUNING_SPLIT, HELD_OUT_SPLIT)}, cancel)
