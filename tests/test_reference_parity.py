"""The engine's fixed and threshold decoders against plain implementations of the reference samplers.

The references below follow docs/algorithms.md §2.2 (LLaDA's generate.py) and §2.3 (Fast-dLLM's
threshold sampler) line by line, on full-canvas forwards with no cache, with two shared rules:
the [MASK] logit is -inf (dinfer-viz never commits a predicted [MASK]) and, at temperature > 0,
Gumbel noise is drawn for the current block's positions only (positions outside it are discarded
by the sampler anyway, so the distribution is the same; drawing the same numbers in the same
order is what makes the tokens identical).
"""

import pytest
import torch

from engine import GenerationConfig, run_diffusion

from .conftest import tiny_llada

MASK = 49


def _logits(model, x):
    logits = model(x).logits.float()
    logits[..., MASK] = float("-inf")
    return logits


def llada_reference(model, prompt, steps, gen_length, block_length, temperature, remasking, seed):
    gen = torch.Generator().manual_seed(seed)
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), MASK, dtype=torch.long)
    x[:, :p] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for block in range(num_blocks):
        s, e = p + block * block_length, p + (block + 1) * block_length
        n = (x[:, s:e] == MASK).sum(1, keepdim=True)
        k = n // steps_per_block + (torch.arange(steps_per_block) < n % steps_per_block).long()
        for i in range(steps_per_block):
            mask_index = x == MASK
            logits = _logits(model, x)
            x0 = logits.argmax(-1)
            if temperature > 0:
                u = torch.rand((b, e - s, logits.shape[-1]), dtype=torch.float64, generator=gen)
                noisy = logits[:, s:e].double().exp() / (-torch.log(u)) ** temperature
                x0[:, s:e] = noisy.argmax(-1)
            if remasking == "low_confidence":
                p_ = torch.softmax(logits, -1)
                conf = torch.gather(p_, -1, x0.unsqueeze(-1)).squeeze(-1)
            else:
                conf = torch.full(x.shape, float("-inf"))
                conf[:, s:e] = torch.rand((b, e - s), generator=gen)
            conf[:, e:] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, conf, torch.tensor(float("-inf")))
            for row in range(b):
                _, sel = torch.topk(conf[row], int(k[row, i]))
                x[row, sel] = x0[row, sel]
    return x


def fastdllm_threshold_reference(model, prompt, gen_length, block_length, threshold):
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), MASK, dtype=torch.long)
    x[:, :p] = prompt
    for block in range(gen_length // block_length):
        s, e = p + block * block_length, p + (block + 1) * block_length
        while (x[:, s:e] == MASK).any():
            mask_index = x == MASK
            logits = _logits(model, x)
            x0 = logits.argmax(-1)
            conf = torch.gather(torch.softmax(logits, -1), -1, x0.unsqueeze(-1)).squeeze(-1)
            conf[:, :s] = float("-inf")
            conf[:, e:] = float("-inf")
            conf = torch.where(mask_index, conf, torch.tensor(float("-inf")))
            for row in range(b):
                values, order = conf[row].sort(descending=True)
                take = [order[0]] + [order[j] for j in range(1, len(order)) if values[j] >= threshold]
                for j in take:
                    if mask_index[row, j]:
                        x[row, j] = x0[row, j]
    return x


@pytest.mark.parametrize(
    "steps,temperature,remasking",
    [(16, 0.0, "low_confidence"), (8, 0.0, "low_confidence"), (16, 0.7, "low_confidence"), (12, 0.0, "random"), (8, 1.0, "random")],
)
def test_fixed_decoder_matches_llada_reference(steps, temperature, remasking):
    model = tiny_llada(seed=1)
    prompt = torch.randint(0, 48, (2, 5))
    cfg = GenerationConfig(
        gen_length=16, block_length=4, decoder="fixed", steps=steps, temperature=temperature,
        remasking=remasking, seed=7, align_blocks=False, early_stop=False,
    )
    ours = run_diffusion(model, prompt.tolist(), cfg, stop_ids=[48])
    ref = llada_reference(model, prompt, steps, 16, 4, temperature, remasking, seed=7)
    assert torch.equal(ours.canvas, ref)
    assert ours.stats.nfe == steps  # fixed steps per block, every block runs them all


@pytest.mark.parametrize("threshold", [0.05, 0.3, 0.9, 1.0])
def test_threshold_decoder_matches_fastdllm_reference(threshold):
    model = tiny_llada(seed=2)
    prompt = torch.randint(0, 48, (2, 6))
    cfg = GenerationConfig(gen_length=16, block_length=8, decoder="threshold", threshold=threshold, align_blocks=False, early_stop=False)
    ours = run_diffusion(model, prompt.tolist(), cfg, stop_ids=[48])
    ref = fastdllm_threshold_reference(model, prompt, 16, 8, threshold)
    assert torch.equal(ours.canvas, ref)


def test_aligned_blocks_equal_unaligned_when_prompt_fills_whole_blocks():
    model = tiny_llada(seed=3)
    prompt = torch.randint(0, 48, (1, 8)).tolist()
    cfg = GenerationConfig(gen_length=16, block_length=4, decoder="threshold", threshold=0.5, early_stop=False)
    a = run_diffusion(model, prompt, cfg, stop_ids=[48])
    b = run_diffusion(model, prompt, cfg.replace(align_blocks=False), stop_ids=[48])
    assert torch.equal(a.canvas, b.canvas)
