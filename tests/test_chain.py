"""Chain self-speculation on the embedded full-attention model (engine/kinds/chain.py, docs/algorithms.md
§10.3): the tokens of the one-token-per-step decode (`--decoder fixed --steps gen_length`), prompt by
prompt, on held-out prompts of every family, in fewer forwards than tokens; what it refuses."""

from __future__ import annotations

from typing import Callable

import pytest

from engine import Engine, EngineError, GenerationConfig, RunHooks
from engine.kinds import ModelTraits, fit
from tinymodel.tasks import TASKS, split_examples

PER_FAMILY = 3


@pytest.fixture(scope="module")
def engine():
    with Engine("tiny-llada") as eng:
        yield eng


@pytest.fixture(scope="module")
def references(engine) -> Callable[[int], list]:
    """The one-token-per-step decode of each held-out prompt, by block length, made once: three of
    the chain cases below compare against the same block length's."""
    made: dict[int, list] = {}

    def of(block_length: int) -> list:
        if block_length not in made:
            reference = GenerationConfig(decoder="fixed", steps=32, gen_length=32, block_length=block_length)
            made[block_length] = [(example, engine.generate(example.prompt, reference)) for example in split_examples(list(TASKS), "held_out", PER_FAMILY)]
        return made[block_length]

    return of


@pytest.mark.parametrize("block_length, draft_length", [(32, 4), (8, 4), (32, 1), (32, 12)])
def test_it_writes_the_one_token_per_step_decode_in_fewer_forwards(engine, references, block_length, draft_length):
    chain = GenerationConfig(kind="chain", kind_options={"draft_length": draft_length}, gen_length=32, block_length=block_length)
    forwards = tokens = accepted = reference_forwards = 0
    for example, ref in references(block_length):
        out = engine.generate(example.prompt, chain, RunHooks(trace=True))
        assert out.output.token_ids == ref.output.token_ids, example.prompt
        trace = out.output.trace
        assert out.output.stats.nfe == len(trace.iterations) == sum(rec.forwards for rec in trace.iterations)
        replayed = trace.canvas_at(len(trace.iterations) - 1)[0]  # every commit is in a record (early stop's fill is not)
        assert all(a in (b, trace.mask_id) for a, b in zip(replayed, trace.final[0]))
        for rec in trace.iterations:  # a step commits its accepted drafts and one decision more
            assert len(rec.committed[0]) == rec.extras["accepted"] + 1 and rec.extras["accepted"] <= rec.extras["drafted"] <= draft_length
        forwards, tokens = forwards + out.output.stats.nfe, tokens + out.output.stats.tokens
        reference_forwards += ref.output.stats.nfe
        accepted += out.output.stats.counts["accepted_draft_tokens"]
    assert forwards < reference_forwards and accepted > 0, (forwards, reference_forwards, accepted)
    if draft_length >= 4:  # a chain of five canvases and more: fewer forwards than tokens
        assert forwards < tokens, (forwards, tokens)


def test_what_it_cannot_run_is_refused_in_one_line():
    refusals = [
        (GenerationConfig(kind="chain"), ModelTraits("masked", block_causal=True), "it needs a full-attention"),
        (GenerationConfig(kind="chain", regex="[a-z]+"), ModelTraits("masked"), "takes no answer constraint"),
        (GenerationConfig(kind="chain", decoder="wino"), ModelTraits("masked"), "chain diffusion takes no decoder"),
        (GenerationConfig(kind="chain", kind_options={"draft_length": 0}), ModelTraits("masked"), "draft_length must be"),
    ]
    for config, model, message in refusals:
        with pytest.raises(EngineError, match=message) as caught:
            fit(config, model)
        assert "\n" not in str(caught.value)


def test_two_prompts_at_once_are_refused(engine):
    with pytest.raises(EngineError, match="one prompt at a time"):
        engine.generate_ids([[5, 6, 7], [8, 9, 10]], GenerationConfig(kind="chain", gen_length=8, block_length=8))
