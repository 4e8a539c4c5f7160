"""Decoders that revise their commits (engine/decoders/revising.py) and the loop's part: edits applied and
recorded with the rule's numbers, post-edit steps, the trace replaying revisions."""

from __future__ import annotations

import math

import pytest
import torch

from engine import EngineError, GenerationConfig, RunHooks, Trace, run_diffusion
from engine.decoders.revising import EditDecoder, apply_preset, penalise_repeats

from .conftest import tiny_llada
from .moe_models import tiny_llada2
from .scripted import EOS, VOCAB, ScriptedLM

PROMPT = [1, 2, 3, 4]


def p_of(strength: float) -> float:
    """The probability of a scripted token with logit `strength` (the others 0, [MASK] excluded)."""
    return math.exp(strength) / (math.exp(strength) + VOCAB - 2)


class PerForwardLM(ScriptedLM):
    """ScriptedLM whose script changes with each forward (the last one repeats): a model that
    changes its mind about a committed position, as an editing decoder needs."""

    def __init__(self, scripts: list[tuple[list[int], list[float]]]) -> None:
        super().__init__(*scripts[0])
        self.scripts = scripts

    def forward(self, *args, **kwargs):
        script, strength = self.scripts[min(self.forwards, len(self.scripts) - 1)]
        self.script, self.strength = torch.tensor(script), torch.tensor(strength, dtype=torch.float32)
        return super().forward(*args, **kwargs)


def _edit_config(**options) -> GenerationConfig:
    return GenerationConfig(gen_length=4, block_length=4, decoder="edit", threshold=0.5, decoder_options={"edit_threshold": 0.9, **options})


def test_an_edit_is_applied_recorded_with_its_numbers_and_replayed():
    scripts = [
        (PROMPT + [5, 6, 7, EOS], [0] * 4 + [5, 5, 0, 0]),  # commits 4 and 5 (p 0.89 > 0.5)
        (PROMPT + [9, 6, 7, EOS], [0] * 4 + [8, 5, 5, 5]),  # commits 6, 7; 4: 9 with p 0.994 > 0.9, an edit
        (PROMPT + [9, 6, 7, EOS], [0] * 4 + [8, 5, 5, 5]),  # a post-edit step that changes nothing: the end
    ]
    model = PerForwardLM(scripts)
    out = run_diffusion(model, [PROMPT], _edit_config(), stop_ids=[EOS], hooks=RunHooks(trace=True))
    assert out.token_ids == [[9, 6, 7]]
    assert out.stats.nfe == 3 == model.forwards
    assert (out.stats.edits, out.stats.remasks, out.stats.tokens) == (1, 0, 3)  # the edited token counts once
    first, second, third = out.trace.iterations
    assert first.committed == [[4, 5]] and first.revisions == [[]]
    assert second.committed == [[6, 7]]
    assert second.revisions == [[{"position": 4, "old": 5, "new": 9, "kind": "edit", "rule": "p(new) > edit threshold", "score": round(p_of(8), 4), "bound": 0.9}]]
    assert third.committed == [[]] and third.revisions == [[]]
    trace = Trace.from_json(out.trace.to_json())  # a revision survives the file and its checks
    assert trace.canvas_at(len(trace.iterations) - 1) == trace.final
    assert trace.canvas_at(0)[0][4] == 5 and trace.canvas_at(1)[0][4] == 9


def test_the_edit_threshold_is_strict_and_the_prompt_is_never_edited():
    # position 4 predicts 9 with p exactly the bound: no edit; the prompt's 1..4 predict other tokens
    # with certainty: never edited
    certain = [12.0] * 4
    scripts = [
        ([8, 8, 8, 8, 5, 6, 7, EOS], certain + [5, 5, 5, 5]),
        ([8, 8, 8, 8, 9, 6, 7, EOS], certain + [5, 5, 5, 5]),
    ]
    out = run_diffusion(PerForwardLM(scripts), [PROMPT], _edit_config(edit_threshold=round(p_of(5), 6) + 1e-6), stop_ids=[EOS], hooks=RunHooks(trace=True))
    assert out.token_ids == [[5, 6, 7]]
    assert all(rec.revisions == [[]] for rec in out.trace.iterations)


def test_post_edit_steps_are_bounded_when_the_model_keeps_changing_its_mind():
    flip = [(PROMPT + [t, 6, 7, EOS], [0] * 4 + [8, 8, 8, 8]) for t in (5, 9, 5, 9, 5, 9, 5, 9)]
    model = PerForwardLM(flip)
    out = run_diffusion(model, [PROMPT], _edit_config(max_post_edit_steps=2), stop_ids=[EOS], hooks=RunHooks(trace=True))
    # forward 1 fills the block; post-edit steps 1 and 2 edit 4 (5 -> 9 -> 5); a third would exceed
    # the bound, so it never runs
    assert model.forwards == 3
    assert [len(rec.revisions[0]) for rec in out.trace.iterations] == [0, 1, 1]
    assert out.token_ids == [[5, 6, 7]]


def test_rows_finish_on_their_own():
    """Row 0 edits once more after its masks are gone; row 1 changes nothing: each gets what it
    gets alone (the decoder is row-wise)."""
    scripts = [
        (PROMPT + [5, 6, 7, EOS], [0] * 4 + [8, 8, 8, 8]),
        (PROMPT + [9, 6, 7, EOS], [0] * 4 + [8, 8, 8, 8]),
    ]
    batch = run_diffusion(PerForwardLM(scripts), [PROMPT, PROMPT], _edit_config(), stop_ids=[EOS]).token_ids
    assert batch == [run_diffusion(PerForwardLM(scripts), [PROMPT], _edit_config(), stop_ids=[EOS]).token_ids[0]] * 2 == [[9, 6, 7]] * 2
    assert EditDecoder.row_wise


def test_repetition_penalty_lowers_the_previous_positions_token():
    logits = torch.zeros(1, 3, 5)
    current = torch.tensor([[2, 3, 4]])
    out = penalise_repeats(logits, current, 1.5)
    assert out[0, 0].tolist() == [0] * 5  # the first position has no previous one
    assert out[0, 1, 2] == -1.5 and out[0, 2, 3] == -1.5 and out.sum() == -3.0
    assert penalise_repeats(logits, current, 0.0) is logits and logits.sum() == 0


def test_presets_set_the_published_defaults():
    config = apply_preset(GenerationConfig(decoder="edit"), "SGLang")
    assert config.threshold == 0.5 and config.decoder_options == {"edit_threshold": 0.0, "max_post_edit_steps": 16}
    assert apply_preset(GenerationConfig(decoder="edit"), "Hugging Face / dllm").threshold == 0.95
    with pytest.raises(EngineError, match="no preset"):
        apply_preset(GenerationConfig(decoder="threshold"), "SGLang")


def test_a_non_revising_decoder_records_no_revisions():
    out = run_diffusion(tiny_llada(), [PROMPT], GenerationConfig(gen_length=8, block_length=4), hooks=RunHooks(trace=True))
    assert all(rec.revisions is None for rec in out.trace.iterations)


@pytest.mark.parametrize("edit_threshold", [0.3, 0.0])
def test_block_causal_prefix_cache_gives_the_uncached_tokens_with_edits(edit_threshold):
    """Edits stay in the current block, which every forward computes fresh: LLaDA2's exact prefix
    cache gives the uncached run's tokens and revisions."""
    model = tiny_llada2()
    config = GenerationConfig(gen_length=16, block_length=4, decoder="edit", threshold=0.3, decoder_options={"edit_threshold": edit_threshold, "max_post_edit_steps": 3})
    plain = run_diffusion(model, [[5, 6, 7]], config.replace(cache="none"), hooks=RunHooks(trace=True))
    cached = run_diffusion(model, [[5, 6, 7]], config.replace(cache="prefix"), hooks=RunHooks(trace=True))
    assert cached.token_ids == plain.token_ids
    assert [r.revisions for r in cached.trace.iterations] == [r.revisions for r in plain.trace.iterations]
    assert any(r.revisions[0] for r in plain.trace.iterations)  # the case has edits to keep
