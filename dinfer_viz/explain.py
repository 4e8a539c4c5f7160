"""Teaching text: one paragraph per decoder, cache mode, iteration feature and system option, shown
next to the views (the system options' also in the Model and system section).

Keyed by the names the engine registers; a decoder or cache mode added to the engine without a
paragraph here still runs, and the text says that it has no explanation yet.
"""

from __future__ import annotations

from typing import Any, Mapping

from .cache_figure import cache_rule_markdown
from .settings import _option_is_set

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
        "On a model trained on EOS-padded answers that is often the EOS beside the last one, forward "
        "after forward, until the block's end stops it (lesson 4). "
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
# Keyed by the Engine keyword arguments dinfer_viz/system.py offers; the per-iteration cost chart
# (dinfer_viz/cost_figure.py) is where each one's price and saving show.
SYSTEM = {
    "tp_size": (
        "**Tensor parallelism (TP = N).** N worker processes each hold 1/N of every layer: the "
        "attention heads and the MLP's hidden units are split, each process computes its share, and "
        "an all-reduce sums the shares after the attention and after the MLP: two all-reduces per "
        "layer, every forward. It pays when a layer's matrices are big enough that computing a part "
        "saves more than the all-reduces cost (a 7-8B model whose weights one GPU cannot hold or "
        "stream fast enough, GPUs joined by a fast link). The embedded model's layers take "
        "microseconds, so TP=2 on this CPU is slower than one process: the two processes share the "
        "same cores, and in the cost chart each forward's communication (red) is taller than its "
        "compute (blue): the all-reduces' fixed cost, and the wait for the slower rank, outweigh the "
        "halved matmuls."
    ),
    "ep_size": (
        "**Expert parallelism (EP = N, MoE models).** N worker processes each hold 1/N of the "
        "experts, each expert whole; attention and the router are replicated, every token is routed on every "
        "process, each computes its own experts' share and one all-reduce per MoE layer sums them "
        "(no all-to-all). It pays when the experts' weights, most of an MoE model, do not fit or "
        "stream fast enough on one device; on a tiny MoE the all-reduces cost more than they save."
    ),
    "compile": (
        "**torch.compile.** Every forward runs through inductor, which fuses the layer's small "
        "operations into fewer kernels. Lengths are padded to a few bucket sizes so a run compiles "
        "one graph per bucket, the first time it meets it (tens of seconds on the CPU, the purple "
        "bar and the line in the cost chart; 1-2 s from inductor's disk cache), and no more after "
        "warm-up. It pays over many runs of the same shapes: a warm compiled forward is faster (about "
        "1.1× for the embedded model on this CPU), the first run is much slower."
    ),
    "cuda_graphs": (
        "**CUDA graphs (CUDA, one process).** The first forward at each bucket is captured into a "
        "graph; later ones replay it as one launch instead of one per kernel (starred in the cost "
        "chart). It removes the host's launch overhead, which dominates when kernels are short "
        "(small models, cached forwards over one block); it costs a capture per bucket and a fixed "
        "K/V scratch store per bucket."
    ),
}
READING = (
    "*Reading the views:* the grid shows the canvas after the selected iteration (hover a cell for its "
    "token, confidence and commit iteration; the yellow bar is the model's current confidence); the "
    "raster is iteration × position confidence of positions still masked, with the commits marked."
)


def explain(decoder: str, cache: str, smoothing: bool = False, unroll: bool = False, system: Mapping[str, Any] | None = None) -> str:
    """Markdown for the chosen decoder, cache mode and features, and the system options that are
    on (`system`: Engine keyword -> value, as the Model and system controls hold them)."""
    parts = [
        DECODERS.get(decoder, f"**{decoder}.** No explanation written for this decoder yet; the engine registers it, so it runs."),
        CACHE_MODES.get(cache, f"**{cache} cache.** No explanation written for this cache mode yet."),
    ]
    if cache != "none":  # what a cache costs in forwards, and why a short canvas hides its saving
        parts.append(cache_rule_markdown(cache))
    if smoothing:
        parts.append(SMOOTHING)
    if unroll:
        parts.append(UNROLLING)
    parts.extend(SYSTEM[name] for name, value in (system or {}).items() if name in SYSTEM and _option_is_set(value))
    parts.append(READING)
    return "\n\n".join(parts)


def system_markdown() -> str:
    """Every system option's paragraph: what the Model and system section shows beside its controls."""
    return "\n\n".join(SYSTEM.values())

