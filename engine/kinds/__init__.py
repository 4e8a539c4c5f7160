"""The diffusion kinds, one file each (SGLang's `srt/dllm/algorithm/` shape): a run class and a
settings declaration per kind (engine/kinds/base.py). A new kind is a file dropped here that
registers itself with `@register_kind`: every module of this package is imported below, as
SGLang's `algorithm/__init__.py` imports its algorithm files, so nothing else is edited. A kind
file kept elsewhere is loaded by its path from $DINFER_VIZ_KINDS (as decoder plug-ins are from
$DINFER_VIZ_DECODERS; examples/margin_kind.py), after the built-in kinds."""

import importlib
import logging
import pkgutil

from ..errors import EngineError
from ..registry import KIND_PLUGIN_ENV, load_plugins
from .base import KINDS, DiffusionKind, KindSettings, ModelTraits, check_system_options, decoder_kind, fit, ignored_settings, kind_decoders, kind_named, kind_options, kind_reads, kinds_described, register_kind, run_kind

# masked first: the kinds' order is the order the page and the CLI's help list them in
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "masked", m.name)):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

try:
    load_plugins(env=KIND_PLUGIN_ENV, what="kind")
except EngineError as _exc:  # at import time: one line, and the kinds that did load still run
    logging.getLogger(__name__).warning("%s", _exc)

__all__ = [
    "KINDS", "DiffusionKind", "KindSettings", "ModelTraits", "check_system_options", "decoder_kind", "fit", "ignored_settings", "kind_decoders", "kind_named",
    "kind_options", "kind_reads", "kinds_described", "register_kind", "run_kind",
]
