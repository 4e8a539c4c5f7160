"""The embedded model's task families: formats, verifiers, held-out splits, seeded sampling."""

import random
import re

import pytest

from engine import EngineError
from tinymodel import grammar
from tinymodel.tasks import (
    PAIR_SUMS,
    TASKS,
    ExampleSampler,
    get_task,
    is_held_out,
    out_of_range_examples,
    parse_prompt,
    split_examples,
)


# ---- formats -----------------------------------------------------------------------------------
def test_arithmetic_restates_operands_right_aligned_then_the_result():
    add = get_task("add").example(123, 45)
    assert (add.prompt, add.response, add.answer, add.group) == ("Q: 123+45=? A:", " 123+ 45= 168", 168, "3-digit")
    sub = get_task("sub").example(7, 65)
    assert (sub.prompt, sub.response, sub.answer, sub.group) == ("Q: 7-65=? A:", "   7- 65= -58", -58, "1-digit")
    assert get_task("add").example(999, 999).response == " 999+999=1998"


def test_prompts_vary_in_length_within_every_family():
    rng = random.Random(0)
    for family in TASKS.values():
        lengths = {len(family.sample(rng).prompt) for _ in range(300)}
        assert len(lengths) >= 3, (family.name, lengths)


def test_pair_sum_and_rhyme_formats():
    assert get_task("pairsum").example(57, 5).prompt == "Q: ?+?=57 A:"
    assert get_task("pairsum").example(57, 5).response == "  5 + 52"
    assert get_task("rhyme").example("cat", "hat").prompt == "Q: rhymes with cat? A:"
    assert get_task("rhyme").example("cat", "hat").response == " hat"


# ---- verifiers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "task, a, b, text, ok",
    [
        ("add", 123, 45, " 123+ 45= 168", True),
        ("add", 123, 45, "123+45=168  ", True),  # spacing is not part of the answer
        ("add", 123, 45, " 123+ 45= 167", False),
        ("add", 123, 45, " 123+ 45= 168.", False),
        ("add", 123, 45, " 123- 45= 168", False),  # wrong operation
        ("add", 123, 45, " 168", False),  # not the answer sentence
        ("add", 123, 45, "", False),
        ("sub", 7, 65, "   7- 65= -58", True),
        ("sub", 7, 65, "   7- 65=  58", False),
        ("sub", 7, 65, "   7- 65= - 58", False),
    ],
)
def test_arithmetic_verifier_reads_the_result(task, a, b, text, ok):
    t = get_task(task)
    assert t.check(t.example(a, b), text) is ok


@pytest.mark.parametrize(
    "n, text, ok",
    [
        (57, " 23 + 34", True),
        (57, "23+34", True),
        (57, "  5 + 52", True),  # right-aligned
        (57, " 57 +  0", True),
        (57, " 23 + 35", False),  # wrong sum
        (57, " 07 + 50", False),  # leading zero
        (57, " 1 + 56 + 0", False),
        (57, "156 + -99", False),
        (198, " 99 + 99", True),
        (198, "100 + 98", False),  # a > 99
        (0, "  0 +  0", True),
        (57, " 23 - 34", False),
        (57, "", False),
    ],
)
def test_pair_sum_verifier(n, text, ok):
    family = get_task("pairsum")
    assert family.check(family.example(n), text) is ok


def test_rhyme_verifier_wants_another_word_of_the_group():
    family = get_task("rhyme")
    example = family.example("cat")
    assert family.check(example, " hat") and family.check(example, "flat ")
    assert not family.check(example, " cat")  # the prompt word itself
    assert not family.check(example, " cake") and not family.check(example, " hatt") and not family.check(example, "")


def test_grammar_verifier_parses_the_whole_sentence():
    family = get_task("grammar")
    example = family.example(["the", "red", "fox", "chased", "my", "cat"], 3)
    assert example.prompt == "the red fox" and example.response == " chased my cat."
    assert family.check(example, " chased my cat.")
    assert family.check(example, " saw every big hill.")
    assert not family.check(example, " chased my cat")  # no period
    assert not family.check(example, " chased my.")
    assert not family.check(example, " chased my red blue cat.")
    assert not family.check(example, " chsed my cat.")  # a non-word
    assert not family.check(example, " chased  my cat.")  # two spaces
    assert not family.check(example, " chased my cat. the")


def test_every_generated_response_passes_its_own_verifier():
    rng = random.Random(1)
    for family in TASKS.values():
        for split in ("train", "held_out"):
            for _ in range(200):
                example = family.sample(rng, split)
                assert family.check(example, example.response), example
        assert all(family.check(e, e.response) for e in family.prompts("held_out", 50))


def test_grammar_has_a_few_hundred_distinct_words():
    words = grammar.DETERMINERS + grammar.ADJECTIVES + grammar.NOUNS + grammar.VERBS
    assert len(words) == len(set(words)) == 200
    rhymes = [w for g in grammar.RHYME_GROUPS for w in g]
    assert len(rhymes) == len(set(rhymes))
    assert grammar.parses("the red fox chased my cat".split()) and not grammar.parses("the red fox chased".split())
    assert grammar.is_sentence_start(["every"]) and not grammar.is_sentence_start(["fox", "the"])


# ---- held-out splits ---------------------------------------------------------------------------
def test_pair_sum_held_out_sums_are_disjoint_from_training():
    family = get_task("pairsum")
    train, held = set(family.sums("train")), set(family.sums("held_out"))
    assert not train & held and train | held == set(PAIR_SUMS)
    assert 15 <= len(held) <= 45
    with pytest.raises(EngineError):
        family.sums("test")


def test_rhyme_holds_out_prompt_words_of_several_groups():
    family = get_task("rhyme")
    held = family.words("held_out")
    assert held and not set(held) & set(family.words("train"))
    assert len({grammar.rhyme_group(w) for w in held}) >= 5


def test_samplers_never_draw_held_out_prompts():
    rng = random.Random(2)
    for name, family in TASKS.items():
        held_prompts = {e.prompt for e in family.prompts("held_out", 300)}
        drawn = {family.sample(rng).prompt for _ in range(500)}
        assert not drawn & held_prompts, name
    for _ in range(300):
        e = TASKS["add"].sample(rng)
        a, b = map(int, re.fullmatch(r"Q: (\d+)\+(\d+)=\? A:", e.prompt).groups())
        assert not is_held_out(f"add:{a}:{b}", 10)


def test_held_out_split_is_stable_and_arithmetic_is_stratified_by_digits():
    sample = split_examples(["add", "sub"], "held_out", limit=30, seed=1)
    assert sample == split_examples(["add", "sub"], "held_out", limit=30, seed=1)
    assert [e.task for e in sample] == ["add"] * 30 + ["sub"] * 30
    assert [e.group for e in sample[:30]] == ["1-digit"] * 10 + ["2-digit"] * 10 + ["3-digit"] * 10
    assert len(set(sample)) == 60
    # the split is the hash's, not Python's: these two are fixed forever
    assert [e.prompt for e in split_examples(["pairsum"])][:3] == [e.prompt for e in get_task("pairsum").prompts("held_out", 300)][:3]


def test_training_split_prompts_are_distinct_seeded_and_never_held_out():
    train = split_examples(list(TASKS), "train", limit=30, seed=2)
    held = {e.prompt for e in split_examples(list(TASKS), "held_out")}
    assert train == split_examples(list(TASKS), "train", limit=30, seed=2)
    assert len({e.prompt for e in train}) == len(train) == 30 * len(TASKS)
    assert not {e.prompt for e in train} & held
    assert [e.group for e in train if e.task == "sub"] == ["1-digit"] * 10 + ["2-digit"] * 10 + ["3-digit"] * 10
    with pytest.raises(EngineError, match="unknown split"):
        split_examples(["add"], "test")


def test_sampler_is_seeded_weighted_and_restorable():
    a, b = ExampleSampler(list(TASKS), seed=3), ExampleSampler(list(TASKS), seed=3)
    first = a.batch(300)
    assert first == b.batch(300)
    assert first != ExampleSampler(list(TASKS), seed=4).batch(300)
    assert {e.task for e in first} == set(TASKS)
    only = ExampleSampler(["add", "rhyme"], seed=0, weights=[0, 1]).batch(50)
    assert {e.task for e in only} == {"rhyme"}
    state = a.state()
    nxt = a.batch(5)
    a.restore(state)
    assert a.batch(5) == nxt
    with pytest.raises(EngineError):
        ExampleSampler(["add"], seed=0, weights=[-1])
    with pytest.raises(EngineError, match="unknown task"):
        get_task("mul")


def test_out_of_range_examples_have_one_four_digit_operand():
    examples = out_of_range_examples(list(TASKS), limit=20, seed=3)
    assert [e.task for e in examples] == ["add"] * 20 + ["sub"] * 20  # only arithmetic can go out of range
    assert examples == out_of_range_examples(list(TASKS), limit=20, seed=3)
    for e in examples:
        digits = [len(x) for x in re.findall(r"\d+", e.prompt)]
        assert sorted(digits)[-1] == 4 and sorted(digits)[0] <= 3
        assert get_task(e.task).check(e, e.response)


def test_parse_prompt_recognises_every_family_and_nothing_else():
    for e in split_examples(list(TASKS), "held_out", limit=20):
        parsed = parse_prompt(e.prompt)
        assert parsed is not None and parsed.task == e.task
        assert get_task(e.task).check(parsed, parsed.response)
    assert parse_prompt("  Q: 123-45=? A:\n").answer == 78
    assert parse_prompt("the red").task == "grammar" and parse_prompt("the red").response == " cat saw the cat."
    for text in ("Q: 48*57=? A:", "Q: 48+57=?", "hi", "Hello, how are you?", "Q: ?+?=199 A:", "Q: rhymes with dog? A:", "fox the"):
        assert parse_prompt(text) is None, text


def test_the_app_knows_answers_notes_and_verdicts():
    from dinfer_viz.studies.answers import FAMILY_EXAMPLES, expected_response, prompt_note, verdict

    assert expected_response("Q: 123+45=? A:") == " 123+ 45= 168"
    assert expected_response("Q: ?+?=57 A:") == ""  # many valid answers: no single expected one
    assert expected_response("tell me a story") == ""
    for family, prompts in FAMILY_EXAMPLES.items():
        assert all(parse_prompt(p).task == family for p in prompts)
    assert "outside every family" in prompt_note("Hello, how are you?")
    assert "pairsum" in prompt_note("Q: ?+?=57 A:") and "out of the trained range" in prompt_note("Q: 1234+5=? A:")
    assert verdict("Q: ?+?=57 A:", " 50 +  7") == "pairsum verifier: valid"
    assert verdict("Q: ?+?=57 A:", " 57 +  7") == "pairsum verifier: NOT valid"
    assert verdict("Hello", "x") == ""
