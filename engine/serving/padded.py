"""Model forwards of several runs, of different lengths, as one padded model call (docs/serving.md §3).

A run's forward is shareable when it is a full forward of one row: token ids or embeddings of
canvas positions `[0, T)`, no stored K/V to read (`past_kv`), no slots (`replace`, `positions`),
and an attention mask that is the run's own `[T, T]` (a block-causal model's) or none, on a
model whose forward is the engine's shared layer stack (`DiffusionLM.forward`: a family with a
forward of its own, or a static-shape runtime, is called alone). Such forwards are stacked
right-padded: row `r` keeps its tokens at positions `[0, T_r)`, so its rotary positions are its
solo run's, and its queries attend only to its own keys (its mask, or all of `[0, T_r)`); the
padded positions are zero embeddings whose queries see the row's keys (never a query with no key,
whose softmax would be NaN) and whose outputs are dropped. Each row's logits and K/V are then its
solo forward's up to floating-point summation order: SDPA with a mask over a longer key axis, and
matrix products over more rows, may add the same terms in another order. The difference is
measured in tests/test_serve_continuous.py and docs/serving.md §3.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..models.base import DiffusionLM, ModelOutput

# what a shareable forward may pass (anything else, set, makes it a forward of its own)
SHARED_ARGUMENTS = frozenset({"input_ids", "inputs_embeds", "use_cache", "attention_mask"})


def shareable(model: DiffusionLM, inputs: dict[str, Any]) -> bool:
    """Whether this forward of `model` may be stacked with others (module docstring)."""
    if type(model).forward is not DiffusionLM.forward:
        return False
    if any(inputs[name] is not None and inputs[name] is not False for name in set(inputs) - SHARED_ARGUMENTS):
        return False
    x = inputs.get("inputs_embeds") if inputs.get("inputs_embeds") is not None else inputs.get("input_ids")
    if x is None or x.shape[0] != 1:
        return False
    mask = inputs.get("attention_mask")
    return mask is None or (mask.dim() == 2 and tuple(mask.shape) == (x.shape[1], x.shape[1]))


def padded_forward(model: DiffusionLM, calls: list[dict[str, Any]]) -> list[ModelOutput]:
    """Each shareable call's output, from one model call (module docstring)."""
    if len(calls) == 1:
        return [model(**calls[0])]
    embeds = [c["inputs_embeds"] if c.get("inputs_embeds") is not None else model.embed(c["input_ids"]) for c in calls]
    lengths = [e.shape[1] for e in embeds]
    width = max(lengths)
    masks = [c.get("attention_mask") for c in calls]
    mask = None
    if any(n != width for n in lengths) or any(m is not None for m in masks):
        mask = torch.zeros(len(calls), 1, width, width, dtype=torch.bool, device=embeds[0].device)
        for r, (n, own) in enumerate(zip(lengths, masks)):
            mask[r, 0, :n, :n] = True if own is None else own
            mask[r, 0, n:, :n] = True  # padded queries: any keys of the row, so no softmax over nothing
    x = torch.cat([F.pad(e, (0, 0, 0, width - n)) for e, n in zip(embeds, lengths)])
    cache = any(c.get("use_cache") for c in calls)
    out = model(inputs_embeds=x, attention_mask=mask, use_cache=cache)
    return [
        ModelOutput(
            out.logits[r : r + 1, :n].contiguous(),
            out.kv[:, :, r : r + 1, :, :n].contiguous() if c.get("use_cache") else None,
        )
        for r, (c, n) in enumerate(zip(calls, lengths))
    ]
