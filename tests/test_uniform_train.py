"""tinymodel.uniform: the embedded uniform-state model's objective and its resumable run, for a few
steps of a tiny DiffusionGemma."""

from __future__ import annotations

import pytest
import torch

from engine.models import DiffusionGemmaLM, load_model
from tinymodel.tasks import split_examples
from tinymodel.uniform import UniformTrainConfig, UniformTrainer, make_canvases, parse_args, uniform_loss, uniform_noise


def tiny(tmp_path, **changes) -> UniformTrainConfig:
    sizes = dict(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, num_experts=2, top_k_experts=1, moe_intermediate_size=32)
    run = dict(batch_size=6, tokens_per_batch=0, threads=1, eval_per_task=2, max_minutes=0, steps=4)
    return UniformTrainConfig(out=str(tmp_path / "model"), run_dir=str(tmp_path), **{**sizes, **run, **changes})


def test_noise_replaces_a_share_of_positions_with_any_token():
    canvas = torch.zeros(400, 48, dtype=torch.long)
    noisy = uniform_noise(canvas, 99, 1e-3, torch.Generator().manual_seed(0))
    changed = (noisy != 0).float().mean().item()
    assert 0.4 < changed < 0.6  # t ~ U(0, 1): half on average (less the draws that hit 0 itself)
    assert noisy.max().item() >= 95  # any id of the vocabulary


def test_canvases_hold_prompt_as_prefix_and_response_padded_with_eos(tmp_path):
    trainer = UniformTrainer(tiny(tmp_path))
    examples = split_examples(["add", "grammar"], "train", 4)
    prefix, real, canvas = make_canvases(examples, trainer.tokenizer, 48, trainer.ids["pad_token_id"])
    for row, example in enumerate(examples):
        prompt = trainer.tokenizer.encode(example.prompt, add_special_tokens=False).ids
        response = trainer.tokenizer.encode(example.response, add_special_tokens=False).ids
        assert prefix[row][real[row]].tolist() == prompt
        assert canvas[row, : len(response)].tolist() == response and (canvas[row, len(response) :] == trainer.ids["eos_token_id"]).all()


def test_loss_falls_on_a_fixed_batch(tmp_path):
    trainer = UniformTrainer(tiny(tmp_path))
    model = trainer.model.train()
    examples = split_examples(["add"], "train", 6)
    prefix, real, canvas = make_canvases(examples, trainer.tokenizer, 48, trainer.ids["pad_token_id"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = uniform_loss(model, prefix, real, canvas, model.vocab_size, 1e-3, 0.5, torch.Generator().manual_seed(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_self_conditioning_changes_only_the_rows_it_is_given_to(tmp_path):
    model = UniformTrainer(tiny(tmp_path)).model.eval()
    prefix = torch.randint(3, 99, (2, 5))
    canvas = torch.randint(0, 99, (2, 48))
    with torch.no_grad():
        plain = model(input_ids=prefix, decoder_input_ids=canvas)
        fed = model(input_ids=prefix, decoder_input_ids=canvas, self_conditioning_logits=plain * 3, self_conditioning_mask=torch.tensor([True, False]))
    assert not torch.allclose(fed[0], plain[0]) and torch.allclose(fed[1], plain[1])


def test_resume_continues_the_same_run(tmp_path):
    """Two steps, a checkpoint, a new trainer resuming from it: its next loss is the one the first
    trainer computes next (same weights, optimizer, sampler and noise generator)."""
    first = UniformTrainer(tiny(tmp_path))
    for _ in range(2):
        loss = first.loss(first.model)
        first.optimizer.zero_grad()
        loss.backward()
        first.optimizer.step()
        first.step += 1
    first.checkpoint(0.5)
    assert isinstance(load_model(tmp_path / "model"), DiffusionGemmaLM)  # the folder the engine loads
    resumed = UniformTrainer(tiny(tmp_path, resume=True))
    assert resumed.step == 2
    torch.manual_seed(1)
    expected = first.loss(first.model).item()
    torch.manual_seed(1)
    assert resumed.loss(resumed.model).item() == pytest.approx(expected, rel=1e-6)


def test_bad_flags_are_one_line(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--self-conditioning", "1.5"])
    err = capsys.readouterr().err.strip()
    assert "--self-conditioning" in err and "\n" not in err


def test_a_short_run_scores_and_writes_the_model(tmp_path):
    trainer = UniformTrainer(tiny(tmp_path, steps=2, eval_every=2))
    summary = trainer.run(trainer.loss)
    assert summary["steps"] == 2 and set(summary["held_out_accuracy"])


def test_eval_counts_a_uniform_rows_forwards_as_the_engine_does(tiny_gemma_folder):
    """A uniform-state row's forwards read off its trace (active steps plus one encoder forward per
    canvas) equal the engine's NFE for that row run alone. (A row's solo run draws other random
    numbers than its batched run, so unlike a greedy masked run its batched steps are not its solo
    ones: the eval counts what the batched run did.)"""
    from engine import Engine, GenerationConfig, RunHooks
    from tinymodel.eval import per_row_commits

    engine = Engine(str(tiny_gemma_folder))
    config = GenerationConfig(gen_length=16, block_length=8, decoder="uniform", decoder_options={"max_denoising_steps": 5})
    for prompt in ("Q: ?+?=38 A:", "Q: 12+35=? A:"):
        out = engine.generate_ids([engine.encode(prompt, False)], config, RunHooks(trace=True))
        assert [f for _, f in per_row_commits(out, engine.stop_ids, engine.model.mask_token_id)] == [out.stats.nfe]


def test_eval_settings_follow_the_models_kind():
    from tinymodel.eval import ENTROPY_BOUNDS, SETTINGS, settings_for

    uniform, masked = settings_for("uniform"), settings_for("masked")
    assert uniform == [f"uniform {b:g}" for b in ENTROPY_BOUNDS]
    assert set(uniform).isdisjoint(masked) and set(uniform) | set(masked) == set(SETTINGS)
    assert all(f"eb {b:g}" in masked for b in ENTROPY_BOUNDS)  # EB-Sampler is a masked model's decoder
