"""WINO's shadow block (Hong et al. 2025, arXiv 2507.18578; engine/decoders/remasking.py): one forward of
the canvas with a copy of the block, all [MASK], appended, in which shadow position j sees the whole
canvas except real position `s + j` (a leave-one-out check of every committed token). The cache
manager runs it when a decoder asks for it (`Decoder.shadow_block`), so no decoder runs a forward
of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import EngineError
from ..models.base import DiffusionLM, ModelOutput


def shadow_attention_mask(canvas: int, s: int, e: int, device: torch.device) -> torch.Tensor:
    """`[canvas + W, canvas + W]` boolean (True = may attend) for a canvas with a shadow copy of block
    `[s, e)` appended: the canvas attends to itself only (nothing attends to the shadow); shadow
    position j attends to the canvas except real position `s + j` (leave-one-out) and to the whole
    shadow block, as in WINO's `decoding_wino` (Feng-Hong/WINO-DLLM, LLaDA/decoding.py)."""
    w = e - s
    mask = torch.ones(canvas + w, canvas + w, dtype=torch.bool, device=device)
    mask[:canvas, canvas:] = False
    mask[canvas:, s:e] = ~torch.eye(w, dtype=torch.bool, device=device)
    return mask


def shadow_positions(canvas: int, s: int, e: int, device: torch.device) -> torch.Tensor:
    """`[canvas + W]`: every canvas token at its own position, shadow position j at `s + j`."""
    return torch.cat([torch.arange(canvas, device=device), torch.arange(s, e, device=device)])


def check_shadow_support(model: DiffusionLM | Any) -> None:
    """Refuse, before any forward, a model whose family does not declare that its forward takes the
    shadow block (`DiffusionLM.takes_shadow_block`: the bidirectional families on the engine's own
    layer stack, LLaDA and LLaDA-MoE; not a block-causal one, a uniform-state one or a wrapper)."""
    if not model.takes_shadow_block:
        family = getattr(model, "family", type(model).__name__) or "model's"  # a model's class, or its ModelTraits' record of it
        raise EngineError(
            f"decoder 'wino' does not support the {family} family: its forward does not take the shadow block "
            "(block-causal, uniform-state or a forward of its own); it runs on LLaDA and LLaDA-MoE"
        )


def shadow_forward(model: DiffusionLM, inputs: dict[str, torch.Tensor], s: int, e: int) -> ModelOutput:
    """One forward of the canvas (`inputs`: token ids or embeddings, the whole canvas) with a shadow
    block of [MASK] at block `[s, e)`'s positions appended: the canvas's output, with the shadow's
    logits `[B, W, V]` as its `shadow_logits`. Nothing attends to the shadow, so the canvas's logits are those of the
    plain forward; shadow position j never sees real position `s + j`."""
    ids, embeds = inputs.get("input_ids"), inputs.get("inputs_embeds")
    canvas = embeds.shape[1] if ids is None else ids.shape[1]
    batch = embeds.shape[0] if ids is None else ids.shape[0]
    device = model.device
    shadow_ids = torch.full((batch, e - s), model.mask_token_id, dtype=torch.long, device=device)
    model.rope.table(canvas, device)  # positions given as a tensor read the rotary table, never grow it
    joined = (
        {"input_ids": torch.cat([ids, shadow_ids], dim=1)} if ids is not None
        else {"inputs_embeds": torch.cat([embeds, model.embed(shadow_ids).to(embeds.dtype)], dim=1)}
    )
    out = model(**joined, replace=shadow_positions(canvas, s, e, device), attention_mask=shadow_attention_mask(canvas, s, e, device))
    return ModelOutput(logits=out.logits[:, :canvas], shadow_logits=out.logits[:, canvas:])
