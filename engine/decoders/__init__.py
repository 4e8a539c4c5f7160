"""Component 3, the decoders: which masked positions of the current block to commit, and to what.
One file per family of rules (SGLang's `srt/dllm/algorithm/` shape, as engine/kinds/): what
every decoder shares is in base.py, the rules that only fill masks in filling.py, the others
(factor, entropy_bound, revising, remasking) in files of their own, and WINO's shadow forward in
shadow.py. A new decoder is a file dropped here that registers itself with `@register_decoder`:
every module of this package is imported below, so nothing else is edited, and `Decoder.order`
places it in the lists of decoders whatever order the files import in."""

import importlib
import pkgutil

from .base import (
    Block, DecodeResult, Decoder, apply_decode, best_per_row, committed_after, gumbel_argmax, make_decoder, rank_in_row, real_token_logits, top1,
    top_candidates,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Block", "DecodeResult", "Decoder", "apply_decode", "best_per_row", "committed_after", "gumbel_argmax", "make_decoder", "rank_in_row",
    "real_token_logits", "top1", "top_candidates",
]
