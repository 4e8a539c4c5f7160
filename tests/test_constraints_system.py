"""A constraint holds through the system options (issue #35 item 4): tensor-parallel workers and
torch.compile decode the same constrained tokens as one eager process, and every answer keeps the
constraint's shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from engine import Engine, GenerationConfig, RunHooks
from engine.constraints import ConstraintSpec

EMBEDDED_MODEL = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"
PROMPTS = ["Q: ?+?=38 A:", "Q: ?+?=120 A:", "Q: ?+?=9 A:"]
PAIR_SUM = r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])"  # benchmarks/constraints.py's
# an aggressive threshold, where the unconstrained model writes malformed answers
CONFIG = GenerationConfig(gen_length=16, block_length=8, threshold=0.1, regex=PAIR_SUM)


def answers(engine: Engine) -> list[tuple[list[int], str]]:
    torch.manual_seed(0)
    outs = [engine.generate(p, CONFIG) for p in PROMPTS]
    return [(o.output.token_ids[0], o.text) for o in outs]


@pytest.fixture(scope="module")
def eager() -> list[tuple[list[int], str]]:
    torch.set_num_threads(1)
    return answers(Engine(str(EMBEDDED_MODEL)))


def test_the_eager_answers_keep_the_regex(eager):
    for _, text in eager:
        assert re.fullmatch(PAIR_SUM, text), text


def rows_constrained(engine: Engine) -> list[list[int]]:
    """One batch whose rows carry their own constraints (the server's per-request ones), the
    middle row none."""
    torch.manual_seed(0)
    hooks = RunHooks(constraints=(ConstraintSpec("regex", PAIR_SUM), None, ConstraintSpec("choice", (" 4 + 5", " 9 + 0"))))
    return engine.generate(PROMPTS, GenerationConfig(gen_length=16, block_length=8, threshold=0.1), hooks).output.token_ids


@pytest.mark.workers
def test_tensor_parallel_workers_decode_the_constrained_tokens_of_one_process(eager):
    """The workers adopt the automata their caller built (a daemonic worker may start no build
    process of its own), the per-row constraints of a request's hooks too."""
    per_row = rows_constrained(Engine(str(EMBEDDED_MODEL)))
    with Engine(str(EMBEDDED_MODEL), tp_size=2) as engine:
        assert answers(engine) == eager
        assert rows_constrained(engine) == per_row


@pytest.mark.compile
def test_a_compiled_engine_decodes_the_constrained_tokens_of_the_eager_one(eager):
    assert answers(Engine(str(EMBEDDED_MODEL), compile=True)) == eager
