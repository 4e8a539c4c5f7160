"""The cache-mode declarations: each mode's name, the GenerationConfig settings it reads, whether
its logits are exact, and the paragraphs that explain it, as decoders declare theirs.

The rule each mode follows lives in engine/cache.py (`KVCacheManager.plan`, docs/algorithms.md
§4.2-4.4); this module says what the CLI's help, the app's controls and explanations, the sample
traces, the batcher and the benchmarks need to know about a mode without a list of names of their
own. A setting's default and one-line help are its GenerationConfig field's (engine/config.py:
`setting_help`); a mode names the fields it reads. A module of its own, importing nothing, so that
config.py (which checks `cache`) and cache.py (which runs the modes) may both read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheMode:
    """One value of `GenerationConfig.cache`.

    `settings`: the GenerationConfig fields the mode reads (the app shows only these, the CLI's
    help names the mode beside each). `exact`: every logit equals an uncached forward's on a
    bidirectional model (docs/algorithms.md §4.4). `block_causal`: the mode applies to a
    block-causal model (LLaDA2's block diffusion, §5, where every mode that applies is exact).
    `reads_request_counter`: the plan reads the request's iteration counter (a warm-up), so rows decoded as one
    batch no longer each follow their solo run. `explanation`: the paragraph the app shows beside
    the views; `forward_rule`: how the mode counts forwards (NFE) and what a block entry costs.
    """

    name: str
    settings: tuple[str, ...]
    exact: bool
    block_causal: bool
    reads_request_counter: bool
    explanation: str
    forward_rule: str


# Sentences two or more forward rules share.
_STEP = (
    "Each block starts with a *refresh*, a full forward whose K/V become the store, and the same step "
    "runs the next forward at once, so a block costs at least two forwards: when the refresh's decode "
    "already completes the block, the forward after it has nothing left to commit (an iteration that "
    "commits nothing) and is still counted in NFE."
)
_STALE = (
    "Cached K/V were computed before the commits since the refresh, so they are stale (every K/V depends "
    "on every token in this bidirectional model); stale K/V can lower confidences, so the threshold "
    "commits fewer tokens per forward and the run may need more iterations."
)

# Each mode's paragraphs: what it does, and how it counts forwards
_NONE = (
    "**No cache.** Every iteration runs the model over the whole canvas (grey bands in the raster): "
    "exact, and the slowest, since prompt and finished blocks are recomputed every time."
)
_NONE_RULE = (
    "**Forward count, no cache.** Every iteration is one full forward over the whole canvas, so NFE is "
    "exactly the number of decode iterations and nothing is ever stale. Each forward pays for the "
    "prompt and the finished blocks again, which is cheap on a short canvas and dominates on a long one."
)
_PREFIX = (
    "**Prefix cache.** At block entry a full forward refreshes the K/V of everything; then each "
    "iteration recomputes only the block and what follows it against the cached prefix. The prefix "
    "is settled text, so the approximation is small."
)
_PREFIX_RULE = (
    "**Forward count, prefix cache.** " + _STEP + " The prefix forwards then recompute the block and "
    "everything after it against the cached prompt and earlier blocks. " + _STALE + " A prefix forward "
    "still covers the rest of the canvas, so it saves most on a long prompt."
)
_DUAL = (
    "**Dual cache.** After the refresh at block entry, each iteration recomputes only the current "
    "block, reusing cached K/V on both sides. The suffix is still masks whose K/V go stale as the "
    "block fills: measure staleness to see by how much."
)
_DUAL_RULE = (
    "**Forward count, dual cache.** " + _STEP + " The dual forwards recompute only the block, reading both "
    "the prefix and the suffix from the store. " + _STALE + " On a short canvas a forward's fixed cost "
    "(launching every layer) outweighs the tokens it skips, so a block's extra forward can make dual no "
    "faster than no cache; the saving appears as the canvas grows (the forward-cost chart)."
)
_VICINITY = (
    "**Vicinity (dInfer).** Like dual, but each iteration recomputes a window `prefix_look` before "
    "and `after_look` after the block (dashed rectangles), after `warmup` exact iterations; the "
    "neighbourhood most affected by the block's commits stays fresh."
)
_VICINITY_RULE = (
    "**Forward count, vicinity.** The first `warmup` forwards of the request are full, uncached ones; after "
    "that it works like dual. " + _STEP + " The window forwards recompute the block plus `prefix_look` "
    "positions before and `after_look` after it, so the neighbours most affected by a commit stay fresh "
    "while the rest of the store goes stale until the next refresh."
)

_DECLARED = (
    CacheMode("none", (), exact=True, block_causal=True, reads_request_counter=False, explanation=_NONE, forward_rule=_NONE_RULE),
    CacheMode("prefix", ("refresh_every", "measure_staleness"), exact=False, block_causal=True, reads_request_counter=False, explanation=_PREFIX, forward_rule=_PREFIX_RULE),
    CacheMode("dual", ("refresh_every", "measure_staleness"), exact=False, block_causal=False, reads_request_counter=False, explanation=_DUAL, forward_rule=_DUAL_RULE),
    CacheMode("vicinity", ("prefix_look", "after_look", "warmup", "refresh_every", "persist_window", "measure_staleness"), exact=False, block_causal=False, reads_request_counter=True, explanation=_VICINITY, forward_rule=_VICINITY_RULE),
)
CACHE_MODES: dict[str, CacheMode] = {mode.name: mode for mode in _DECLARED}


def cache_modes() -> tuple[CacheMode, ...]:
    """Every cache mode's declaration, in the order the CLI and the app list them."""
    return tuple(CACHE_MODES.values())


def cache_mode_names() -> tuple[str, ...]:
    """Every cache mode, in the order the CLI and the app list them."""
    return tuple(CACHE_MODES)


def cache_mode(name: str) -> CacheMode | None:
    """The declaration of `name`, None for a name no mode has (the config's check names the choices)."""
    return CACHE_MODES.get(name)
