"""Shared fixtures: tiny random LLaDA models and checkpoints built by the tests themselves."""

from __future__ import annotations

import pytest
import torch

from engine.models.llada import LLaDAModelLM

# Tests use tiny tensors: one thread avoids oversubscribing CI's two cores (measured: 95 s -> 12 s
# for the decoder tests on a loaded machine).
torch.set_num_threads(1)

TINY_CONFIG = dict(
    model_type="llada",
    architectures=["LLaDAModelLM"],
    d_model=64,
    n_heads=4,
    n_kv_heads=4,
    n_layers=2,
    mlp_hidden_size=96,
    vocab_size=50,
    embedding_size=50,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    mask_token_id=49,
    eos_token_id=48,
    pad_token_id=48,
)


def tiny_llada(seed: int = 0, **overrides) -> LLaDAModelLM:
    """A random fp32 LLaDA small enough for exact comparisons in milliseconds."""
    torch.manual_seed(seed)
    model = LLaDAModelLM({**TINY_CONFIG, **overrides})
    with torch.no_grad():  # default init gives near-uniform logits; widen them so confidences vary
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval().requires_grad_(False)


@pytest.fixture
def model() -> LLaDAModelLM:
    return tiny_llada()


@pytest.fixture(scope="session")
def tiny_gemma_folder(tmp_path_factory):
    """A tiny random DiffusionGemma checkpoint with the char tokenizer (tests/gemma_models.py)."""
    from .gemma_models import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("tiny-gemma"))
