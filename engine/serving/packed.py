"""Model forwards of several runs, of different lengths, as one packed model call (docs/serving.md §3).

A run's forward is shareable when it is a full forward of one row: token ids or embeddings of
canvas positions `[0, T)`, no stored K/V to read (`past_kv`), no slots (`replace`, `positions`),
and an attention mask that is the run's own `[T, T]` (a block-causal model's) or none, on a
model whose forward is the engine's shared layer stack (`DiffusionLM.forward`: a family with a
forward of its own, or a static-shape runtime, is called alone). Such forwards are packed into one
sequence of their real tokens, row after row, with no padding (vLLM's and SGLang's flattened
batch; flex_attention's document masking): each token's rotary position is its position in its
own row (an index-tensor `replace` without a past: the layers' "position of each query token"),
and the attention runs row by row (`Segments`: a row's queries see only its own keys, its mask or
all of them), so the projections and MLPs run once over every row's real tokens while the
attention costs what the rows' own do. A forward of rows of 106, 106, 26, 26, 26 and 26 tokens then processes 316 tokens, not
the 636 a padded batch would (benchmarks/RESULTS.md, issue 58). Each row's logits and K/V are its
solo forward's up to floating-point summation order (SDPA over a longer, masked key axis, matrix
products over more rows); the difference is measured in tests/test_serve_continuous.py and
docs/serving.md §3.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.base import DiffusionLM, ModelOutput
from ..models.layers import Segments

# what a shareable forward may pass (anything else, set, makes it a forward of its own)
SHARED_ARGUMENTS = frozenset({"input_ids", "inputs_embeds", "use_cache", "attention_mask"})


def shareable(model: DiffusionLM, inputs: dict[str, Any]) -> bool:
    """Whether this forward of `model` may be packed with others (module docstring)."""
    if type(model).forward is not DiffusionLM.forward:
        return False
    if any(inputs[name] is not None and inputs[name] is not False for name in set(inputs) - SHARED_ARGUMENTS):
        return False
    x = inputs.get("inputs_embeds") if inputs.get("inputs_embeds") is not None else inputs.get("input_ids")
    if x is None or x.shape[0] != 1:
        return False
    mask = inputs.get("attention_mask")
    return mask is None or (mask.dim() == 2 and tuple(mask.shape) == (x.shape[1], x.shape[1]))


def packed_forward(model: DiffusionLM, calls: list[dict[str, Any]]) -> list[ModelOutput]:
    """Each shareable call's output, from one model call over their tokens packed (module docstring)."""
    if len(calls) == 1:
        return [model(**calls[0])]
    embeds = [c["inputs_embeds"] if c.get("inputs_embeds") is not None else model.embed(c["input_ids"]) for c in calls]
    lengths = [e.shape[1] for e in embeds]
    starts = [sum(lengths[:r]) for r in range(len(calls))]
    device = embeds[0].device
    mask = Segments(tuple(lengths), tuple(c.get("attention_mask") for c in calls))
    positions = torch.cat([torch.arange(n, device=device) for n in lengths])
    model.rope.table(max(lengths), device)  # positions given as a tensor are read from the table: it must cover them
    cache = any(c.get("use_cache") for c in calls)
    out = model(inputs_embeds=torch.cat(embeds, dim=1), replace=positions, attention_mask=mask, use_cache=cache)
    return [
        ModelOutput(
            out.logits[:, a : a + n].contiguous(),
            out.kv[:, :, :, :, a : a + n].contiguous() if c.get("use_cache") else None,
        )
        for a, n, c in zip(starts, lengths, calls)
    ]
