"""The diffusion kinds, one file each (SGLang's `srt/dllm/algorithm/` shape): a run class and a
settings declaration per kind (engine/kinds/base.py). A new kind is a file here that registers
itself with `@register_kind`, imported below."""

from . import masked, uniform  # noqa: F401  (each registers its kind and its decoders)
from .base import KINDS, DiffusionKind, KindSettings, check_system_options, decoder_kind, fit, ignored_settings, kind_decoders, kind_named, register_kind

__all__ = [
    "KINDS", "DiffusionKind", "KindSettings", "check_system_options", "decoder_kind", "fit", "ignored_settings", "kind_decoders", "kind_named", "register_kind",
]
