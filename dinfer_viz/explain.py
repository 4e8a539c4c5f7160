"""The teaching text shown next to the views: the chosen decoder's, cache mode's and system
options' paragraphs, as the engine's declarations carry them (engine/decoders.py,
engine/cache_modes.py, engine/system_options.py), and the iteration features' and the views' own.

A decoder or cache mode registered without a paragraph still runs, and the text says that it has
no explanation yet (docs/app.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from engine.cache_modes import cache_mode
from engine.errors import EngineError
from engine.registry import decoder_class
from engine.system_options import SYSTEM_OPTIONS, system_options

from .cache_figure import cache_rule_markdown

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


def explain(decoder: str, cache: str, smoothing: bool = False, unroll: bool = False, system: Mapping[str, Any] | None = None) -> str:
    """Markdown for the chosen decoder, cache mode and features, and the system options that are
    on (`system`: Engine keyword -> value, as the Model and system controls hold them)."""
    mode = cache_mode(cache)
    parts = [
        decoder_explanation(decoder),
        mode.explanation if mode is not None else f"**{cache} cache.** No explanation written for this cache mode yet.",
    ]
    if mode is None or not mode.exact:  # what a cache costs in forwards, and why a short canvas hides its saving
        parts.append(cache_rule_markdown(cache))
    if smoothing:
        parts.append(SMOOTHING)
    if unroll:
        parts.append(UNROLLING)
    chosen = system or {}
    parts.extend(SYSTEM_OPTIONS[name].explanation for name, value in chosen.items() if name in SYSTEM_OPTIONS and SYSTEM_OPTIONS[name].is_set(value))
    parts.append(READING)
    return "\n\n".join(parts)


def decoder_explanation(decoder: str) -> str:
    """The decoder's own paragraph, or a line saying it has none yet (a plug-in, an unknown name)."""
    try:
        text = decoder_class(decoder).explanation
    except EngineError:
        text = ""
    return text or f"**{decoder}.** No explanation written for this decoder yet; the engine registers it, so it runs."


def system_markdown() -> str:
    """Every system option's paragraph: what the Model and system section shows beside its controls."""
    return "\n\n".join(option.explanation for option in system_options())
