"""The embedded model's tasks: prompt format, checkers, held-out split, seeded sampling."""

import pytest

from engine import EngineError
import re

from engine.tasks import OPERAND_RANGE, TASKS, ExampleSampler, get_task, held_out_examples, is_held_out


def test_prompt_and_response_format():
    add = get_task("add").example(48, 57)
    assert (add.prompt, add.response, add.answer) == ("Q: 48+57=? A:", " The sum is 105.", 105)
    sub = get_task("sub").example(48, 57)
    assert (sub.prompt, sub.response, sub.answer) == ("Q: 48-57=? A:", " The difference is  -9.", -9)
    # results are right-aligned in three characters: every digit keeps its position
    assert get_task("add").example(40, 58).response == " The sum is  98."
    assert get_task("sub").example(57, 48).response == " The difference is   9."


@pytest.mark.parametrize(
    "task, a, b, text, ok",
    [
        ("add", 48, 57, " The sum is 105.", True),
        ("add", 48, 57, "The sum is 105.  ", True),  # surrounding whitespace is not part of the answer
        ("add", 48, 57, " The sum is 104.", False),
        ("add", 48, 57, " The sum is 105", False),  # the sentence must end
        ("add", 48, 57, " The sum is 105.5.", False),
        ("add", 48, 57, " The sum is 1055.", False),
        ("add", 48, 57, " The difference is 105.", False),  # wrong template
        ("add", 48, 57, " The sum is 105. The sum is 105.", False),
        ("add", 48, 57, "", False),
        ("sub", 48, 57, " The difference is  -9.", True),
        ("sub", 48, 57, " The difference is -9.", False),  # not right-aligned
        ("sub", 48, 57, " The difference is   9.", False),
        ("sub", 57, 48, " The difference is   9.", True),
        ("sub", 50, 50, " The difference is   0.", True),
        ("add", 40, 58, " The sum is  98.", True),
        ("add", 40, 58, " The sum is 98.", False),
        ("add", 40, 58, " The sum is 098.", False),
    ],
)
def test_checker_accepts_only_the_exact_answer(task, a, b, text, ok):
    t = get_task(task)
    assert t.check(t.example(a, b), text) is ok


def test_every_generated_response_passes_its_own_checker():
    for task in TASKS.values():
        for split in ("train", "held_out"):
            assert all(task.check(e, e.response) for e in task.examples(split))


def _operands(prompt: str) -> tuple[int, int]:
    a, b = re.fullmatch(r"Q: (\d+)[+-](\d+)=\? A:", prompt).groups()
    return int(a), int(b)


def test_held_out_split_is_disjoint_complete_and_about_ten_percent():
    for task in TASKS.values():
        train, held = set(task.pairs("train")), set(task.pairs("held_out"))
        everything = train | held
        assert not train & held
        assert everything == {(a, b) for a in OPERAND_RANGE for b in OPERAND_RANGE}
        assert 0.07 < len(held) / len(everything) < 0.13
    # the split depends on the family, so add and sub hold out different pairs
    assert set(TASKS["add"].pairs("held_out")) != set(TASKS["sub"].pairs("held_out"))
    with pytest.raises(EngineError):
        TASKS["add"].pairs("test")


def test_sampler_is_seeded_and_never_draws_held_out_pairs():
    a, b = ExampleSampler(list(TASKS), seed=3), ExampleSampler(list(TASKS), seed=3)
    first = a.batch(500)
    assert first == b.batch(500)
    assert first != ExampleSampler(list(TASKS), seed=4).batch(500)
    assert {e.task for e in first} == set(TASKS)
    for e in first:
        assert not is_held_out(e.task, *_operands(e.prompt))
        assert e.answer == TASKS[e.task].compute(*_operands(e.prompt))
    state = a.state()
    nxt = a.batch(5)
    a.restore(state)
    assert a.batch(5) == nxt


def test_held_out_examples_limit_is_a_seeded_sample_per_task():
    sample = held_out_examples(["add", "sub"], limit=10, seed=1)
    assert [e.task for e in sample] == ["add"] * 10 + ["sub"] * 10
    assert sample == held_out_examples(["add", "sub"], limit=10, seed=1)
    assert all(e in get_task(e.task).examples("held_out") for e in sample)
    assert len(held_out_examples(["sub"])) == len(TASKS["sub"].pairs("held_out"))


def test_unknown_task_is_an_engine_error():
    with pytest.raises(EngineError, match="unknown task"):
        get_task("mul")


def test_out_of_range_examples_have_exactly_one_operand_outside_10_99():
    from engine.tasks import out_of_range_examples

    examples = out_of_range_examples(["add", "sub"], limit=50, seed=3)
    assert [e.task for e in examples] == ["add"] * 50 + ["sub"] * 50
    assert examples == out_of_range_examples(["add", "sub"], limit=50, seed=3)
    for e in examples:
        a, b = (int(x) for x in e.prompt.removeprefix("Q: ").removesuffix("=? A:").split("+" if e.task == "add" else "-"))
        assert (a in OPERAND_RANGE) != (b in OPERAND_RANGE)
        assert get_task(e.task).check(e, e.response)


def test_parse_prompt_recovers_every_example_and_out_of_range_operands():
    from engine.tasks import out_of_range_examples, parse_prompt

    for e in held_out_examples(list(TASKS)) + out_of_range_examples(list(TASKS), limit=20):
        assert parse_prompt(e.prompt) == e
    assert parse_prompt("  Q: 123-45=? A:\n").answer == 78
    assert parse_prompt("Q: 48*57=? A:") is None and parse_prompt("Q: 48+57=?") is None and parse_prompt("hi") is None


def test_the_app_knows_the_answer_to_out_of_range_prompts():
    from dinfer_viz.answers import expected_response

    assert expected_response("Q: 123+45=? A:") == " The sum is 168."
    assert expected_response("Q: 48-57=? A:") == " The difference is  -9."
    assert expected_response("tell me a story") == ""
