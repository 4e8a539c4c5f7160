"""Teaching text: one paragraph per decoder, cache mode and iteration feature, shown next to the views.

Keyed by the names the engine registers; a decoder or cache mode added to the engine without a
paragraph here still runs, and the text says that it has no explanation yet.
"""

from __future__ import annotations

DECODERS = {
    "fixed": (
        "**Fixed steps (LLaDA's reference sampler).** Each block gets `steps / blocks` iterations and "
        "commits the same share of its masks in each, choosing the most confident predictions "
        "(`low_confidence`) or random ones. Tokens per forward is fixed by the schedule, whatever the "
        "model's certainty: the baseline the other decoders improve on."
    ),
    "threshold": (
        "**Threshold (Fast-dLLM, dInfer).** Every masked position of the current block whose top-1 "
        "probability reaches τ is committed in the same iteration; if none does, the single most "
        "confident one is committed anyway (orange *forced* cells), so every forward makes progress. "
        "A lower τ commits more per forward (higher TPF) and risks committing wrong tokens together."
    ),
    "hierarchical": (
        "**Hierarchical (dInfer).** The block's masks form runs of consecutive positions. Each run "
        "commits one *anchor* (its most confident position, or the one nearest its centre) if it beats "
        "the low threshold, plus everything above the high threshold τ. An anchor splits its run, so "
        "later iterations work on ever smaller spans, spreading commits across the block instead of "
        "clustering them."
    ),
    "credit": (
        "**Credit (CreditDecoding).** A token that stays the top-1 at a position across iterations "
        "earns credit (decaying by β each iteration, boosted by p^γ); the logits get "
        "`α·log(1 + credit)` added before the threshold rule. Stable predictions cross τ sooner, so "
        "fewer forwards are needed; the extras view shows the credit per position."
    ),
    "factor": (
        "**Factor (Fast-dLLM).** The masked positions are ranked by confidence and the n best are "
        "committed while the n-th still clears `1 - factor/(n+1)`: the more tokens committed together, "
        "the more confident each must be. There is no single threshold; the rank and its threshold "
        "are in the extras."
    ),
}

CACHE_MODES = {
    "none": (
        "**No cache.** Every iteration runs the model over the whole canvas (grey bands in the raster): "
        "exact, and the slowest, since prompt and finished blocks are recomputed every time."
    ),
    "prefix": (
        "**Prefix cache.** At block entry a full forward refreshes the K/V of everything; then each "
        "iteration recomputes only the block and what follows it against the cached prefix. The prefix "
        "is settled text, so the approximation is small."
    ),
    "dual": (
        "**Dual cache.** After the refresh at block entry, each iteration recomputes only the current "
        "block, reusing cached K/V on both sides. The suffix is still masks whose K/V go stale as the "
        "block fills: measure staleness to see by how much."
    ),
    "vicinity": (
        "**Vicinity (dInfer).** Like dual, but each iteration recomputes a window `prefix_look` before "
        "and `after_look` after the block (dashed rectangles), after `warmup` exact iterations; the "
        "neighbourhood most affected by the block's commits stays fresh."
    ),
}

SMOOTHING = (
    "**Iteration smoothing** feeds still-masked positions the [MASK] embedding plus a weighted "
    "expectation of the last prediction's embeddings, so information carries across iterations; the "
    "threshold starts at 1 and decays to τ (the threshold line in the per-iteration chart)."
)
UNROLLING = (
    "**Loop unrolling** queues several iterations between host checks of \"any mask left?\", removing "
    "device syncs; iterations queued after a block completes are no-ops but count as forwards."
)
READING = (
    "*Reading the views:* the grid shows the canvas after the selected iteration (hover a cell for its "
    "token, confidence and commit iteration; the yellow bar is the model's current confidence); the "
    "raster is iteration × position confidence of positions still masked, with the commits marked."
)


def explain(decoder: str, cache: str, smoothing: bool = False, unroll: bool = False) -> str:
    """Markdown for the chosen decoder, cache mode and features."""
    parts = [
        DECODERS.get(decoder, f"**{decoder}.** No explanation written for this decoder yet; the engine registers it, so it runs."),
        CACHE_MODES.get(cache, f"**{cache} cache.** No explanation written for this cache mode yet."),
    ]
    if smoothing:
        parts.append(SMOOTHING)
    if unroll:
        parts.append(UNROLLING)
    parts.append(READING)
    return "\n\n".join(parts)
