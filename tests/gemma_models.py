"""A tiny random DiffusionGemma checkpoint (transformers' own classes, the char tokenizer), built
by the tests that need a uniform-state model: the engine's parity tests and the app's views."""

from __future__ import annotations

from pathlib import Path

import torch

from tinymodel.tokenizer import save_tokenizer
from tinymodel.uniform import UniformTrainConfig, model_config

CANVAS = 8
STOP = 67  # an id the widened random model drafts often enough to end rows (checked by test_early_stop_and_padding_were_exercised)


def tiny_config(**changes) -> dict:
    cfg = UniformTrainConfig(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, num_experts=2, top_k_experts=1, moe_intermediate_size=32, canvas_length=CANVAS)
    config = model_config(cfg)
    config["text_config"].update(changes)
    return config


def build_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A random tiny DiffusionGemma, written by transformers' save_pretrained (safetensors), with
    weights wide enough that entropies spread and the adaptive stop can fire; plus the char tokenizer."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(DiffusionGemmaConfig.from_dict(tiny_config()))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder
