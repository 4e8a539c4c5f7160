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
from engine.trace import UNIFORM

from .cache_figure import cache_rule_markdown
from .settings import decoder_presets

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
# A uniform-state run (engine/kinds/uniform.py) reads none of the masked-diffusion settings, and its views show its own rule
UNIFORM_SETTINGS = (
    "The uniform-state loop caches the prompt and each finished canvas itself (the decoder reads that cache); "
    "the cache modes, smoothing and unrolling are masked-diffusion settings it does not read."
)
UNIFORM_READING = (
    "*Reading the views:* the grid shows the canvas after the selected step (accepted proposals, dimmed noise, "
    "finished canvases' output); the raster is step × position entropy (bright: low), the accepted positions "
    "circled and the bound in the legend; the per-iteration chart counts accepted and re-noised positions per step, "
    "with the temperature. Click a cell for the rule's numbers there."
)


def explain(decoder: str, cache: str, smoothing: bool = False, unroll: bool = False, system: Mapping[str, Any] | None = None) -> str:
    """Markdown for the chosen decoder, cache mode and features, and the system options that are
    on (`system`: Engine keyword -> value, as the Model and system controls hold them). The
    uniform-state sampler reads no cache mode or iteration feature, so its text names none."""
    chosen = system or {}
    options = [SYSTEM_OPTIONS[name].explanation for name, value in chosen.items() if name in SYSTEM_OPTIONS and SYSTEM_OPTIONS[name].is_set(value)]
    if decoder == UNIFORM:
        return "\n\n".join([decoder_explanation(decoder), UNIFORM_SETTINGS, *options, UNIFORM_READING])
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
    parts.extend(options)
    parts.append(READING)
    return "\n\n".join(parts)


def decoder_explanation(decoder: str) -> str:
    """The decoder's own paragraph, or a line saying it has none yet (a plug-in, an unknown name);
    then its published default sets, when it declares any."""
    try:
        text = decoder_class(decoder).explanation
    except EngineError:
        text = ""
    text = text or f"**{decoder}.** No explanation written for this decoder yet; the engine registers it, so it runs."
    return text + presets_markdown(decoder)


def presets_markdown(decoder: str) -> str:
    """The decoder's presets as a table (one row a preset, one column a setting), "" for none."""
    presets = decoder_presets(decoder)
    if not presets:
        return ""
    names = list(dict.fromkeys(k for values in presets.values() for k in values))
    head = "| preset | " + " | ".join(n.replace("_", " ") for n in names) + " |\n|---|" + "---|" * len(names)
    rows = "".join(f"\n| {preset} | " + " | ".join(f"{values.get(n, '')}" for n in names) + " |" for preset, values in presets.items())
    return f"\n\n*Published default sets* (choose one under **Published default set**, beside the decoder's settings, to fill the controls):\n\n{head}{rows}"


def system_markdown() -> str:
    """Every system option's paragraph: what the Model and system section shows beside its controls."""
    return "\n\n".join(option.explanation for option in system_options())
