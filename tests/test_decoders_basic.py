"""The foundation decoders' rules on hand-made logits: fixed (LLaDA) and threshold (Fast-dLLM)."""

import math

import torch

from engine import GenerationConfig
from engine.decoders import make_decoder

from .conftest import fill_block

V, MASK = 6, 5


def logits_for(probs):
    """Logits whose softmax over the real tokens (MASK excluded) is `probs` [B, W, V-1]."""
    p = torch.tensor(probs, dtype=torch.float32)
    out = torch.full((*p.shape[:2], V), 0.0)
    out[..., : V - 1] = p.clamp_min(1e-12).log()
    return out


def decode(name, logits, masked, threshold=0.9, **cfg):
    config = GenerationConfig(decoder=name, threshold=threshold, **cfg)
    dec = make_decoder(config, MASK)
    dec.block_init(masked, 0)
    return dec.step(logits, fill_block(masked, threshold, MASK))


def test_threshold_commits_all_above_and_marks_nothing_forced():
    logits = logits_for([[[0.95, 0.05, 0, 0, 0], [0.1, 0.9, 0, 0, 0], [0.3, 0.3, 0.4, 0, 0]]])
    masked = torch.tensor([[True, True, True]])
    r = decode("threshold", logits, masked)
    assert r.commit.tolist() == [[True, True, False]]  # 0.9 >= 0.9 commits (>=, not >)
    assert r.forced.tolist() == [[False, False, False]]
    assert r.tokens[0, :2].tolist() == [0, 1]


def test_threshold_forces_best_when_none_is_above():
    logits = logits_for([[[0.5, 0.5, 0, 0, 0], [0.2, 0.8, 0, 0, 0], [0.7, 0.3, 0, 0, 0]]])
    r = decode("threshold", logits, torch.tensor([[True, True, True]]))
    assert r.commit.tolist() == [[False, True, False]]
    assert r.forced.tolist() == [[False, True, False]]


def test_threshold_ties_take_first_best_only():
    logits = logits_for([[[0.6, 0.4, 0, 0, 0], [0.6, 0.4, 0, 0, 0]]])
    r = decode("threshold", logits, torch.tensor([[True, True]]))
    assert r.commit.tolist() == [[True, False]]


def test_threshold_ignores_unmasked_positions_and_rows_without_masks():
    logits = logits_for([[[0.99, 0.01, 0, 0, 0], [0.6, 0.4, 0, 0, 0]], [[0.99, 0.01, 0, 0, 0], [0.99, 0.01, 0, 0, 0]]])
    masked = torch.tensor([[False, True], [False, False]])
    r = decode("threshold", logits, masked)
    assert r.commit.tolist() == [[False, True], [False, False]]
    assert r.forced.tolist() == [[False, True], [False, False]]


def test_predicted_mask_is_replaced_by_best_real_token():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 0.0, 0.0, 50.0]]])  # MASK has by far the top logit
    for name in ("threshold", "fixed"):
        r = decode(name, logits, torch.tensor([[True]]))
        assert r.tokens.tolist() == [[2]]
        assert r.commit.tolist() == [[True]]
        expected = math.exp(2) / (1 + math.exp(1) + math.exp(2) + 2)
        assert abs(r.confidence[0, 0].item() - expected) < 1e-6


def test_fixed_schedule_spreads_masks_over_steps_earliest_first():
    # 5 masks, 2 steps per block (steps=4 over 2 blocks): steps commit 3 then 2
    probs = [[[0.9 - 0.1 * j, 0.1 + 0.1 * j, 0, 0, 0] for j in range(5)]]
    logits = logits_for(probs)
    masked = torch.ones(1, 5, dtype=torch.bool)
    config = GenerationConfig(decoder="fixed", steps=4, gen_length=8, block_length=4)
    dec = make_decoder(config, MASK)
    dec.block_init(masked, 0)
    first = dec.step(logits, fill_block(masked, 0.9, MASK))
    # confidences 0.9, 0.8, 0.7, 0.6, 0.6(=max(0.5,0.5)): the three most confident
    assert first.commit.tolist() == [[True, True, True, False, False]]
    masked = masked & ~first.commit
    second = dec.step(logits, fill_block(masked, 0.9, MASK))
    assert second.commit.tolist() == [[False, False, False, True, True]]
    assert not dec.step(logits, fill_block(masked & ~second.commit, 0.9, MASK)).commit.any()  # beyond its steps: no-op


def test_fixed_batch_rows_have_their_own_quota():
    logits = logits_for([[[0.9, 0.1, 0, 0, 0]] * 4, [[0.8, 0.2, 0, 0, 0]] * 4])
    masked = torch.tensor([[True, True, True, True], [False, True, False, False]])
    config = GenerationConfig(decoder="fixed", steps=2, gen_length=4, block_length=4)
    dec = make_decoder(config, MASK)
    dec.block_init(masked, 0)
    r = dec.step(logits, fill_block(masked, 0.9, MASK))
    assert r.commit.sum(1).tolist() == [2, 1]
    assert (r.commit & ~masked).sum() == 0


def test_fixed_random_remasking_is_seeded():
    logits = logits_for([[[0.5, 0.5, 0, 0, 0]] * 8])
    masked = torch.ones(1, 8, dtype=torch.bool)
    config = GenerationConfig(decoder="fixed", steps=4, gen_length=8, block_length=8, remasking="random")
    picks = []
    for _ in range(2):
        dec = make_decoder(config, MASK, torch.Generator().manual_seed(3))
        dec.block_init(masked, 0)
        picks.append(dec.step(logits, fill_block(masked, 0.9, MASK)).commit)
    assert torch.equal(picks[0], picks[1]) and picks[0].sum() == 2
