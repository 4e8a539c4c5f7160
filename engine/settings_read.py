"""Who reads which setting: the one answer that the CLI's help, the app's visible controls and the
engine's `fit` (its kind level) take from the settings' declarations.

A run reads a setting when every declaration on its way says so:

- its kind (`config.kind`, else the kind its decoder decodes): SHARED_SETTINGS (but the decoder's,
  for a kind that takes none), the kind's `reads` and its own options (`kind_options.<name>`)
  (engine/kinds/: `kind_reads`, which `fit` checks a request against);
- of the fields some decoder declares (`Decoder.settings`, engine/decoders/), only the chosen
  decoder's; of the decoders' own options (`decoder_options.<name>`), only its own;
- of the fields some cache mode declares (engine/cache_modes.py), only the chosen mode's;
- a field that needs a switch (engine/config.py: `_setting(needs=...)`, smoothing's weights and
  unroll's counts) only with the switch on.

A name the registries do not know (a decoder, a cache mode or a kind not registered: a page's
settings before the check) is read as widely as can be: every setting of its class.
"""

from __future__ import annotations

import dataclasses

from .cache_modes import cache_mode, cache_modes
from .config import GenerationConfig
from .errors import EngineError
from .kinds.base import KINDS, decoder_kind, kind_options, kind_reads
from .registry import KIND_OPTION_PREFIX, OPTION_SETTING_PREFIX, decoder_class, decoder_names

# the switches that choose what else a run reads, besides those a field `needs`
_CHOOSERS = ("kind", "decoder", "cache")


def _needs() -> dict[str, str]:
    """Field -> the bool field it needs on (`_setting(needs=...)`)."""
    return {f.name: f.metadata["needs"] for f in dataclasses.fields(GenerationConfig) if f.metadata.get("needs")}


def switch_settings() -> tuple[str, ...]:
    """The settings that choose which others a run reads (the app always shows their controls)."""
    return (*_CHOOSERS, *dict.fromkeys(_needs().values()))


def _decoder(name: object) -> type | None:
    try:
        return decoder_class(name) if isinstance(name, str) else None
    except EngineError:
        return None


def _kind_level(kind: str) -> frozenset[str]:
    """`kind_reads`; for a kind not registered, every field and every kind's options."""
    if kind in KINDS:
        return kind_reads(kind)
    return frozenset(f.name for f in dataclasses.fields(GenerationConfig)) | {KIND_OPTION_PREFIX + name for name in kind_options()}


def decoder_declared() -> dict[str, list[str]]:
    """Each GenerationConfig field some registered decoder declares -> those decoders."""
    found: dict[str, list[str]] = {}
    for name in decoder_names():
        for setting in decoder_class(name).settings:
            found.setdefault(setting, []).append(name)
    return found


def cache_declared() -> dict[str, list[str]]:
    """Each GenerationConfig field some cache mode declares -> those modes."""
    found: dict[str, list[str]] = {}
    for mode in cache_modes():
        for setting in mode.settings:
            found.setdefault(setting, []).append(mode.name)
    return found


def settings_read(config: GenerationConfig) -> frozenset[str]:
    """The settings a run of `config` reads: GenerationConfig field names, `kind_options.<name>`
    for each of its kind's own options and `decoder_options.<name>` for each of its decoder's
    (module docstring)."""
    chosen = _decoder(config.decoder)
    kind = config.kind or (decoder_kind(config.decoder) if chosen is not None else "masked")
    read = set(_kind_level(kind))
    if chosen is not None:
        read -= {f for f in decoder_declared() if f not in chosen.settings}
    mode = cache_mode(config.cache) if isinstance(config.cache, str) else None
    if mode is not None:
        read -= {f for f in cache_declared() if f not in mode.settings}
    read -= {f for f, switch in _needs().items() if not getattr(config, switch)}
    if "decoder_options" in read:
        owners = [chosen] if chosen is not None else [decoder_class(name) for name in decoder_names()]
        read |= {OPTION_SETTING_PREFIX + option for owner in owners for option in owner.options}
    return frozenset(read)


def readers_note(setting: str) -> str:
    """Who reads `setting` (a field, `kind_options.<name>` or `decoder_options.<name>`), in words for the CLI's help:
    "[speculative kind]", "[masked kind] [with smoothing on]", "[read by: fixed]",
    "[masked kind] [read by: cache vicinity]"; "" for a setting every run reads."""
    if setting.startswith(OPTION_SETTING_PREFIX):
        option = setting[len(OPTION_SETTING_PREFIX):]
        return f"[read by: {', '.join(n for n in decoder_names() if option in decoder_class(n).options)}]"
    parts = []
    kinds = [k for k in KINDS if setting in kind_reads(k)]
    if kinds and len(kinds) < len(KINDS):
        parts.append(f"[{', '.join(kinds)} kind{'s' if len(kinds) > 1 else ''}]")
    if setting in _needs():
        parts.append(f"[with {_needs()[setting]} on]")
    readers = decoder_declared().get(setting, []) + [f"cache {m}" for m in cache_declared().get(setting, [])]
    if readers:
        parts.append(f"[read by: {', '.join(readers)}]")
    return " ".join(parts)
