"""One view per diffusion kind (dinfer_viz/views/base.py: the contract and the registry), chosen
once per run from its trace header's `kind`: `view_for(timeline)`.

- masked/: masked diffusion (LLaDA and its family): commits, forced commits, a revising decoder's
  edits and remasks, the cache's recomputed ranges
- uniform/: uniform-state diffusion (DiffusionGemma): accepted proposals and noise, the entropy
  bound, canvases that write their output

A new kind is one more subpackage (or module) here with a `@register` KindView, imported below.
"""

from __future__ import annotations

from . import masked, uniform  # noqa: F401  (each registers its view)
from .base import VIEWS, KindView, register, view_for, view_of_kind

__all__ = ["VIEWS", "KindView", "register", "view_for", "view_of_kind"]
