"""tinymodel/block.py: the LLaDA -> LLaDA2 conversion (exact), the block-diffusion training forward
(the same logits the engine's block-causal decoding computes), its noise, a tiny run, and the
shipped assets/tiny-llada2."""

from __future__ import annotations

import json

import pytest
import torch

from engine import load_model
from engine.__main__ import main as engine_main
from engine.cache import block_causal_mask
from engine.models.loader import EMBEDDED_ROOT
from tinymodel.block import BlockTrainConfig, BlockTrainer, block_logits, block_noise, convert_llada, main, train_block, training_mask

from .conftest import tiny_llada

SHIPPED = EMBEDDED_ROOT / "tiny-llada"
BLOCK_MODEL = EMBEDDED_ROOT / "tiny-llada2"
TINY = dict(d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=32, steps=3, max_minutes=0.0, eval_every=3, eval_per_task=1,
            tokens_per_batch=0, batch_size=4, min_gen=16, max_gen=16, threads=1, convert_from="", tasks=("add",), warmup=1)  # fmt: skip


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_converted_model_computes_exactly_what_the_llada_does(kv_heads):
    llada = tiny_llada(n_kv_heads=kv_heads)
    converted = convert_llada(llada).eval()
    ids = torch.randint(0, 49, (2, 23))
    full = torch.ones(23, 23, dtype=torch.bool)
    causal = block_causal_mask(23, 4, torch.device("cpu"))
    with torch.no_grad():
        for mask in (None, full, causal):  # the same attention pattern gives the same logits
            assert torch.allclose(converted(input_ids=ids, attention_mask=mask).logits, llada(input_ids=ids, attention_mask=mask).logits, atol=1e-5)
    assert converted.block_causal and converted.config["first_k_dense_replace"] == converted.config["num_hidden_layers"]


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="the embedded model is not shipped in this checkout")
def test_the_shipped_model_converts_exactly():
    llada = load_model(SHIPPED)
    ids = torch.randint(3, 99, (2, 40))
    with torch.no_grad():
        assert torch.allclose(convert_llada(llada)(input_ids=ids).logits, llada(input_ids=ids).logits, atol=1e-5)


@pytest.mark.parametrize(("length", "block"), [(1, 1), (7, 1), (12, 4), (13, 4), (9, 32)])
def test_the_training_mask_is_the_engines_block_causal_pattern_split_over_the_two_copies(length, block):
    mask, causal = training_mask(length, block), block_causal_mask(length, block, torch.device("cpu"))
    noisy_to_noisy, noisy_to_clean = mask[:length, :length], mask[:length, length:]
    assert torch.equal(mask[length:, length:], causal) and not mask[length:, :length].any()  # clean: the committed prefix
    assert torch.equal(noisy_to_noisy | noisy_to_clean, causal) and not (noisy_to_noisy & noisy_to_clean).any()  # each key once
    same_block = (torch.arange(length) // block).unsqueeze(1) == (torch.arange(length) // block).unsqueeze(0)
    assert torch.equal(noisy_to_noisy, same_block)  # a noisy block sees itself only in its noisy form


def test_the_training_forward_gives_each_block_the_logits_the_engines_decoding_sees():
    model = convert_llada(tiny_llada())
    clean = torch.randint(0, 48, (2, 19))
    noisy = torch.where(torch.rand(2, 19) < 0.5, torch.full_like(clean, 49), clean)
    block = 4
    with torch.no_grad():
        logits = block_logits(model, noisy, clean, block)
        for start in range(0, 19, block):
            end = min(start + block, 19)  # block k decodes on the committed prefix and its own noisy tokens
            canvas = torch.cat([clean[:, :start], noisy[:, start:end]], dim=1)
            seen = model(input_ids=canvas, attention_mask=block_causal_mask(end, block, torch.device("cpu"))).logits[:, start:]
            assert torch.allclose(logits[:, start:end], seen, atol=1e-5)


def test_the_noise_is_per_block_spares_the_prompt_and_masks_every_response_token_at_block_one():
    ids = torch.arange(2 * 24).view(2, 24) % 40 + 2
    response = torch.zeros(2, 24, dtype=torch.bool)
    response[:, 5:] = True
    generator = torch.Generator().manual_seed(0)
    noisy, masked, t = block_noise(ids, response, 1, 1, 1e-3, generator)
    assert torch.equal(masked, response) and (noisy[masked] == 1).all() and torch.equal(noisy[~masked], ids[~masked])
    noisy, masked, t = block_noise(ids, response, 8, 1, 1e-3, generator)
    assert not (masked & ~response).any() and torch.equal(t.view(2, 3, 8), t.view(2, 3, 8)[..., :1].expand(2, 3, 8))


def test_a_tiny_run_lowers_the_loss_and_writes_a_llada2_folder(tmp_path):
    cfg = BlockTrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), **TINY)
    trainer = BlockTrainer(cfg, log=lambda _: None)
    torch.manual_seed(0)
    ids = torch.randint(3, 99, (4, 20))
    response = torch.arange(20).expand(4, 20) >= 8
    from tinymodel.block import block_diffusion_loss

    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=3e-3)
    losses = []
    for step in range(12):  # one fixed batch and noise, block sizes 1 and 4 in turn: the loss must fall
        loss = block_diffusion_loss(trainer.model, ids, response, (1, 4)[step % 2], 1, 1e-3, torch.Generator().manual_seed(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0] and losses[-2] < 0.9 * losses[1]
    summary = train_block(cfg, log=lambda _: None)
    assert summary["steps"] == 3
    saved = load_model(cfg.out)
    assert saved.block_causal and json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "llada2_moe"


def test_the_train_stage_refuses_mismatched_block_flags(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--block-sizes", "1", "8", "--block-weights", "1"])
    assert "--block-sizes" in capsys.readouterr().err


@pytest.mark.skipif(not BLOCK_MODEL.is_dir(), reason="assets/tiny-llada2 is not shipped in this checkout")
@pytest.mark.parametrize("block", ["1", "8"])
def test_the_shipped_block_model_generates_by_name(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["generate", "--model", "tiny-llada2", "--block-length", block, "--gen-length", "32", "--prompt", "Q: 12+34=? A:", "--cache", "prefix", "--json"]
    assert engine_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert "46" in out["text"], out["text"]
