"""One view per diffusion kind (dinfer_viz/views/base.py: the contract and the registry), chosen
once per run from its trace header's `kind`: `view_for(timeline)`.

- masked/: masked diffusion (LLaDA and its family): commits, forced commits, a revising decoder's
  edits and remasks, the cache's recomputed ranges
- uniform/: uniform-state diffusion (DiffusionGemma): accepted proposals and noise, the entropy
  bound, canvases that write their output

- speculative/: self-speculative decoding (a block-causal model drafts, then verifies its draft
  autoregressively): each step's draft, accepted prefix, rejected suffix and correction

A new kind's view is one more subpackage (or module) dropped here with a `@register` KindView:
every module of this package is imported below (as engine/kinds/ discovers the kinds), so
nothing else is edited.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import VIEWS, KindView, register, view_for, view_of_kind

# masked first: a view may build on another's (the speculative view on the masked one)
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "masked", m.name)):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["VIEWS", "KindView", "register", "view_for", "view_of_kind"]
