"""Named engine configurations: the baselines by name, and user configurations as `key:value` changes.

A configuration is a base GenerationConfig (the run's gen/block lengths and `--set` values) with
a preset's changes applied, then the user's. The three baselines differ from the base only in
decoding, cache, smoothing and unrolling, so a ratio between them measures those alone:

- `llada`: LLaDA's reference sampler: the fixed decoder with one token per step, no cache.
- `fastdllm`: Fast-dLLM: threshold 0.9 with the dual cache, no smoothing, no unrolling.
- `dinfer`: dInfer's defaults: threshold 0.9, vicinity refresh (16 before, 16 after, 4 warm-up
  iterations), iteration smoothing (cont_weight 0.3) and loop unrolling (docs/algorithms.md §3, §4.5).

Spec grammar (`--configs`), comma-separated pieces:
    PRESET               a named configuration (llada, fastdllm, dinfer)
    NAME=PRESET          a copy of a preset under a new name (changes may follow)
    NAME=KEY:VALUE       a new configuration from the base, with KEY set
    KEY:VALUE            one more change to the configuration named just before
KEY is a GenerationConfig field or a decoder's own option (`low_threshold`, `remdm_eta`), which
goes into `decoder_options` (its decoder must be the configuration's).
e.g. `llada,fastdllm,dinfer,dinfer08=dinfer,threshold:0.8,cache:dual`.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.kinds import kind_options
from engine.registry import decoder_options

PRESETS: dict[str, dict[str, Any]] = {
    "llada": dict(decoder="fixed", steps=None, remasking="low_confidence", cache="none", smoothing=False, unroll=False),
    "fastdllm": dict(decoder="threshold", threshold=0.9, cache="dual", smoothing=False, unroll=False),
    # unrolling as dInfer's benchmarks and server pass it: expected_tpf 4, maximum_unroll 4 (docs/algorithms.md §3.2)
    "dinfer": dict(
        decoder="threshold",
        threshold=0.9,
        cache="vicinity",
        prefix_look=16,
        after_look=16,
        warmup=4,
        smoothing=True,
        cont_weight=0.3,
        unroll=True,
        expected_tpf=4,
        max_unroll=4,
    ),
}


@dataclass(frozen=True)
class NamedConfig:
    name: str
    config: GenerationConfig


def parse_value(key: str, text: str) -> Any:
    """`text` as the type GenerationConfig declares for `key` (`none` for an optional field), or a
    decoder's option declares (`remasking`, `low_threshold`, `remdm_eta`: engine/decoders/), or
    a kind's (`verify`, `verify_threshold`: engine/kinds/speculative.py)."""
    hints = typing.get_type_hints(GenerationConfig)
    declared = {**decoder_options(), **kind_options()}
    if key not in hints and key not in declared:
        raise EngineError(f"unknown generation setting '{key}'")
    kind = hints[key] if key in hints else type(declared[key][1].default)
    options = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
    if type(None) in typing.get_args(kind) and text.lower() == "none":
        return None
    base = options[0]
    if base is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise EngineError(f"{key} takes true or false, got '{text}'")
    try:
        return base(text)
    except ValueError:
        raise EngineError(f"{key} takes a {base.__name__}, got '{text}'") from None


def parse_assignment(text: str, separator: str) -> tuple[str, Any]:
    """`key<separator>value` -> (key, typed value)."""
    key, found, value = text.partition(separator)
    if not found or not key.strip():
        raise EngineError(f"expected KEY{separator}VALUE, got '{text}'")
    return key.strip(), parse_value(key.strip(), value.strip())


def preset_settings(name: str) -> dict[str, Any]:
    """A copy of a preset's changes to the base configuration."""
    if name not in PRESETS:
        raise EngineError(f"unknown configuration '{name}'; presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def parse_configs(spec: str, base: GenerationConfig) -> list[NamedConfig]:
    """The configurations named by `spec` (grammar in the module docstring), each validated."""
    entries: list[tuple[str, dict[str, Any]]] = []  # (name, settings over the base), in order
    for piece in (p.strip() for p in spec.split(",")):
        if not piece:
            continue
        name, is_new, rest = piece.partition("=")
        if is_new:
            if ":" in rest:
                key, value = parse_assignment(rest, ":")
                entries.append((name.strip(), {key: value}))
            else:
                entries.append((name.strip(), preset_settings(rest.strip())))
        elif ":" in piece:
            if not entries:
                raise EngineError(f"'{piece}' changes no configuration: name one first (NAME=KEY:VALUE)")
            key, value = parse_assignment(piece, ":")
            entries[-1][1][key] = value
        else:
            entries.append((piece, preset_settings(piece)))
    if not entries:
        raise EngineError("no configuration given")
    names = [n for n, _ in entries]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise EngineError(f"configuration '{duplicate}' is named twice")
    return [NamedConfig(name, _apply(base, settings)) for name, settings in entries]


def _apply(base: GenerationConfig, settings: dict[str, Any]) -> GenerationConfig:
    """`base` with `settings`, a kind's option inside `kind_options` and a decoder's (any other name
    no config field has) inside `decoder_options`."""
    fields = {k: v for k, v in settings.items() if k in GenerationConfig.__dataclass_fields__}
    kinds = {k: v for k, v in settings.items() if k not in fields and k in kind_options()}
    options = {k: v for k, v in settings.items() if k not in fields and k not in kinds}
    return base.replace(**fields, decoder_options={**base.decoder_options, **options}, kind_options={**base.kind_options, **kinds})

