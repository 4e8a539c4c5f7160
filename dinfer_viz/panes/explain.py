"""The teaching text shown next to the views: the chosen decoder's, cache mode's and system
options' paragraphs, as the engine's declarations carry them (engine/decoders/,
engine/cache_modes.py, engine/system_options.py), composed with the iteration features' and the
views' own by the view of the decoder's kind (dinfer_viz/views/).

A decoder or cache mode registered without a paragraph still runs, and the text says that it has
no explanation yet (docs/app.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from engine.errors import EngineError
from engine.kinds import KINDS
from engine.registry import decoder_class
from engine.system_options import SYSTEM_OPTIONS, system_options
from engine.trace import MASKED

from ..drawing.cells import inert_markdown
from ..settings import decoder_presets
from ..views import view_of_kind


def explain(decoder: str, cache: str, smoothing: bool = False, unroll: bool = False, system: Mapping[str, Any] | None = None, kind: str | None = None) -> str:
    """Markdown for the chosen kind, decoder, cache mode and features, and the system options that
    are on (`system`: Engine keyword -> value, as the Model and system controls hold them), composed
    by the view of the kind chosen (none: the decoder's kind; a uniform-state sampler reads no
    cache mode or iteration feature, so its text names none)."""
    chosen = system or {}
    options = [SYSTEM_OPTIONS[name].explanation for name, value in chosen.items() if name in SYSTEM_OPTIONS and SYSTEM_OPTIONS[name].is_set(value)]
    rule = KINDS.get(kind or "")
    text = rule_explanation(rule) if rule is not None and rule.decoder_kind() is None else decoder_explanation(decoder)
    return view_of_kind(kind or decoder_kind(decoder)).explanation(text, cache, smoothing, unroll, options)


def rule_explanation(kind: type) -> str:
    """The paragraph of a kind that takes no decoder (its rule is its own, so the page's decoder
    explains nothing): its name and summary (a plug-in's words, escaped)."""
    summary = kind.summary or "no summary written for this kind yet; the engine registers it, so it runs"
    return f"**The {inert_markdown(kind.name)} kind (no decoder).** It {inert_markdown(summary)}."


def run_kind(config: Any) -> str:
    """The diffusion kind a run's settings run: the config's own `kind` (the engine's `fit` sets
    it), else the kind its decoder decodes."""
    return config.kind or decoder_kind(config.decoder)


def decoder_kind(decoder: str) -> str:
    """The diffusion kind a decoder decodes (its declared `kind`; masked for a name this app does not know)."""
    try:
        return str(getattr(decoder_class(decoder), "kind", MASKED))
    except EngineError:
        return MASKED


def decoder_explanation(decoder: str) -> str:
    """The decoder's own paragraph, or a line saying it has none yet (a plug-in, an unknown name);
    then its published default sets, when it declares any."""
    try:
        text = decoder_class(decoder).explanation
    except EngineError:
        text = ""
    text = text or f"**{inert_markdown(decoder)}.** No explanation written for this decoder yet; the engine registers it, so it runs."  # the name may come from a trace file
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
