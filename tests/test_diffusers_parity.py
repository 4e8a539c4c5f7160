"""The `edit` decoder against an independent implementation: diffusers' `LLaDA2Pipeline` with its
`BlockRefinementScheduler` (pure PyTorch), on a tiny random LLaDA2 checkpoint built here, greedy.

Both sides run the same model object; the adapter diffusers calls gives it the block-causal
attention of LLaDA2 over the window diffusers feeds it (the prompt's blocks up to the current
one) and removes [MASK] from the proposals, as every decoder of ours does (a trained model never
proposes it; a random one would). The settings that make the two rules the same:
diffusers' schedule committing at least one mask per step (LLaDA2.1's rule), `eos_early_stop=False` against our `early_stop=False` (diffusers freezes a
row mid-block at its EOS, we stop after the block), a canvas of whole blocks, and runs whose
post-edit steps stay under the bound: at the bound diffusers still applies one more step's edits,
LLaDA2.1's rule (SGLang's `joint_threshold.py`, ours) does not; the test checks it is not reached.
With editing off (diffusers `editing_threshold=None`) it also checks our LLaDA2 block diffusion.
"""

from __future__ import annotations

import pytest
import torch

from engine import GenerationConfig, RunHooks, load_model, run_diffusion, save_model
from engine.reference import DiffusersAdapter

from .moe_models import tiny_llada2

diffusers = pytest.importorskip("diffusers")

BLOCK, GEN, MAX_POST = 4, 16, 16
PROMPTS = ([5, 6, 7, 9], [11, 3, 8, 2, 30, 14, 21, 6])  # a whole block; two blocks


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> torch.nn.Module:
    folder = tmp_path_factory.mktemp("llada2")
    save_model(tiny_llada2(seed=3), folder)
    return load_model(folder)


def diffusers_tokens(model, prompt: list[int], threshold: float, editing_threshold: float | None) -> list[int]:
    pipe = diffusers.LLaDA2Pipeline(model=DiffusersAdapter(model, BLOCK), scheduler=diffusers.BlockRefinementScheduler(), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipe(
            input_ids=torch.tensor([prompt]), use_chat_template=False, gen_length=GEN, block_length=BLOCK, num_inference_steps=GEN,
            temperature=0.0, sampling_method="greedy", threshold=threshold, editing_threshold=editing_threshold, max_post_steps=MAX_POST,
            eos_early_stop=False, mask_token_id=model.mask_token_id, eos_token_id=model.eos_token_id, output_type="seq",
        )
    return out.sequences[0].tolist()


def our_run(model, prompt: list[int], config: GenerationConfig):
    out = run_diffusion(model, [prompt], config.replace(gen_length=GEN, block_length=BLOCK, early_stop=False), hooks=RunHooks(trace=True))
    return out.canvas[0, len(prompt):].tolist(), out.trace


def post_edit_steps(trace) -> int:
    """The most iterations any block ran after its last mask was filled."""
    most, block, after = 0, None, 0
    for rec in trace.iterations:
        if rec.block != block:
            block, after, filled = rec.block, 0, False
        after += filled
        filled = filled or not any(p == trace.mask_id for p in trace.canvas_at(rec.iteration)[0][rec.block_range[0]:rec.block_range[1]])
        most = max(most, after)
    return most


@pytest.mark.parametrize("prompt", PROMPTS, ids=["one prompt block", "two prompt blocks"])
@pytest.mark.parametrize("threshold, edit_threshold", [(0.7, 0.5), (0.5, 0.3), (0.95, 0.9)])
def test_edit_decoder_gives_diffusers_tokens(checkpoint, prompt, threshold, edit_threshold):
    config = GenerationConfig(decoder="edit", threshold=threshold, decoder_options={"edit_threshold": edit_threshold, "max_post_edit_steps": MAX_POST})
    ours, trace = our_run(checkpoint, prompt, config)
    assert post_edit_steps(trace) < MAX_POST  # the one place the two rules differ is not reached
    assert ours == diffusers_tokens(checkpoint, prompt, threshold, edit_threshold)


def test_the_parity_cases_edit(checkpoint):
    """The comparison above is of runs that revise: at least one of them edits, and differs from
    the same run without editing."""
    config = GenerationConfig(decoder="edit", threshold=0.5, decoder_options={"edit_threshold": 0.3})
    ours, trace = our_run(checkpoint, PROMPTS[0], config)
    assert sum(len(row) for rec in trace.iterations for row in rec.revisions) > 0
    assert ours != diffusers_tokens(checkpoint, PROMPTS[0], 0.5, None)


@pytest.mark.parametrize("prompt", PROMPTS, ids=["one prompt block", "two prompt blocks"])
@pytest.mark.parametrize("threshold", [0.7, 0.3])
@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_editing_off_gives_diffusers_block_diffusion(checkpoint, prompt, threshold, cache):
    """Editing off: our edit decoder with an edit threshold no probability exceeds, and our
    threshold decoder, both give diffusers' tokens with its editing disabled."""
    expected = diffusers_tokens(checkpoint, prompt, threshold, None)
    never = GenerationConfig(decoder="edit", threshold=threshold, cache=cache, decoder_options={"edit_threshold": 1.0})
    assert our_run(checkpoint, prompt, never)[0] == expected
    assert our_run(checkpoint, prompt, GenerationConfig(decoder="threshold", threshold=threshold, cache=cache))[0] == expected
