"""Model calls of several runs, of different lengths, as one model call (docs/serving.md §3).

A run's forward is shareable when it is a forward of one row on a model whose forward is the
engine's shared layer stack (`DiffusionLM.forward`: a family with a forward of its own, or a
static-shape runtime, is called alone), with cache arguments that forward takes: a store of its
own or none (`past_kv`), its slots (`replace`, `positions`, `persist`) and a `[q, keys]` attention
mask or none. Such forwards are packed into one sequence of their real tokens, row after row, with
no padding (vLLM's and SGLang's flattened batch; flex_attention's document masking): the
projections and MLPs run once over every row's tokens, and each row's attention runs with exactly
its solo forward's arguments (`Segments`, engine/models/layers.py: its rotary positions, its
store, its mask), so the attention costs what the rows' own do. A forward of rows of 106, 106, 26,
26, 26 and 26 tokens then processes 316 tokens, not the 636 a padded batch would
(benchmarks/RESULTS.md, issue 58). So the masked kind's full and cached forwards (every cache mode)
and the speculative kind's draft and verify forwards (each row reads its own store) share one call.

A family whose runs call the network through methods of their own (`DiffusionLM.routed_calls`:
DiffusionGemma's encoder and denoising forwards) says which calls of them may run together
(`DiffusionLM.pack_key`) and runs them (`DiffusionLM.run_packed`).

Each row's logits and K/V are its solo call's up to floating-point summation order (matrix
products over more rows; a padded key axis, where a family pads); the difference is measured in
tests/test_serve_continuous.py, tests/test_serve_kinds_batched.py and docs/serving.md §3.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

from ..errors import EngineError
from ..models.base import DiffusionLM, ModelOutput
from ..models.layers import PackedRow, Segments
from ..run import FORWARD

# what a shareable forward may pass (anything else, set, makes it a forward of its own)
SHARED_ARGUMENTS = frozenset({"input_ids", "inputs_embeds", "use_cache", "attention_mask", "past_kv", "replace", "persist", "positions"})


def shareable(model: DiffusionLM, inputs: dict[str, Any]) -> bool:
    """Whether this forward of `model` may be packed with others (module docstring). A forward
    whose arguments its solo call would refuse is not: it runs alone and fails alone."""
    if type(model).forward is not DiffusionLM.forward:
        return False
    if any(inputs[name] is not None and inputs[name] is not False for name in set(inputs) - SHARED_ARGUMENTS):
        return False
    x = inputs.get("inputs_embeds") if inputs.get("inputs_embeds") is not None else inputs.get("input_ids")
    past = inputs.get("past_kv")
    if x is None or x.shape[0] != 1 or (past is not None and (past.dim() != 6 or past.shape[2] != 1)):
        return False
    try:
        model.query_slots(x.shape[1], past, inputs.get("replace"), bool(inputs.get("persist")), inputs.get("positions"))
    except EngineError:
        return False
    mask = inputs.get("attention_mask")
    keys = x.shape[1] if past is None else past.shape[4]
    return mask is None or (isinstance(mask, torch.Tensor) and tuple(mask.shape) == (x.shape[1], keys))


def packed_forward(model: DiffusionLM, calls: list[dict[str, Any]]) -> list[ModelOutput]:
    """Each shareable call's output, from one model call over their tokens packed (module docstring)."""
    if len(calls) == 1:
        return [model(**calls[0])]
    embeds = [c["inputs_embeds"] if c.get("inputs_embeds") is not None else model.embed(c["input_ids"]) for c in calls]
    rows = tuple(
        PackedRow(
            e.shape[1], c.get("past_kv"), model.query_slots(e.shape[1], c.get("past_kv"), c.get("replace"), bool(c.get("persist")), c.get("positions")),
            bool(c.get("persist")), c.get("attention_mask"), c.get("positions"),
        )
        for e, c in zip(embeds, calls)
    )
    cache = any(c.get("use_cache") for c in calls)
    out = model(inputs_embeds=torch.cat(embeds, dim=1), attention_mask=Segments(rows), use_cache=cache)
    outputs, a = [], 0
    for row, c in zip(rows, calls):
        n = row.length
        outputs.append(ModelOutput(
            out.logits[:, a : a + n].contiguous(),
            out.kv[:, :, :, :, a : a + n].contiguous() if c.get("use_cache") else None,
        ))
        a += n
    return outputs


def query_positions(method: str, inputs: dict[str, Any]) -> int | None:
    """The positions a forward computes (its rows' tokens: a cached forward's block, not its
    canvas), what a round's position budget counts; None for a family's own calls."""
    if method != FORWARD:
        return None
    x = inputs.get("inputs_embeds") if inputs.get("inputs_embeds") is not None else inputs.get("input_ids")
    return None if x is None else x.shape[0] * x.shape[1]


def pack_key(model: DiffusionLM, method: str, inputs: dict[str, Any]) -> Hashable | None:
    """Calls of `model.method` with equal keys run as one (`run_calls`); None: this one runs alone."""
    if method == FORWARD:
        return FORWARD if shareable(model, inputs) else None
    return model.pack_key(method, inputs)


def call(model: DiffusionLM, method: str, inputs: dict[str, Any]) -> Any:
    """One routed call, as its run would have made it."""
    return model(**inputs) if method == FORWARD else getattr(model, method)(**inputs)


def run_calls(model: DiffusionLM, method: str, calls: list[dict[str, Any]]) -> list[Any]:
    """Each call's result: one call alone, several (of one `pack_key`) as one."""
    if len(calls) == 1:
        return [call(model, method, calls[0])]
    return packed_forward(model, calls) if method == FORWARD else model.run_packed(method, calls)
