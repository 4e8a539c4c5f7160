"""Fast-dLLM's factor decoder (docs/algorithms.md §2.4), a file of its own beside the other filling
rules of engine/decoders/filling.py; it lists after them (`order`)."""

from __future__ import annotations

import torch

from ..registry import OPTION_SETTING_PREFIX, DecoderOption, register_decoder
from .base import Block, DecodeResult, Decoder, rank_in_row


@register_decoder
class FactorDecoder(Decoder):
    """Commits the n most confident masks while the n-th confidence stays above 1 - factor/(n+1), at least one.

    Fast-dLLM's factor rule as dInfer's `get_transfer_index_dynamic` implements it (docs/algorithms.md
    §2.4): with the K masked confidences sorted, `c_(1) >= c_(2) >= ...`, and thresholds
    `t_n = 1 - factor / (n + 1)` (`t_1 = -1`), take the leading run of ranks with `c_(n) >= t_n`;
    when it stops at rank K - 1 or covers all K, take all K (the reference's quirk that also admits
    a failing last token). `forced` marks commits below their rank's threshold (rank 1 against
    `1 - factor / 2`). Extras: `rank` (0-based, -1 unmasked) and `factor_threshold` (the threshold
    of each masked position's rank; meaningful where `rank >= 0`).
    """

    name = "factor"
    order = 50
    explanation = (
        "**Factor (Fast-dLLM).** The masked positions are ranked by confidence and the n best are "
        "committed while the n-th still clears `1 - factor/(n+1)`: the more tokens committed together, "
        "the more confident each must be. There is no single threshold; the rank and its threshold "
        "are in the extras."
    )
    row_wise = True
    settings = ()
    options = {"factor": DecoderOption(1.0, "factor (Fast-dLLM): commit the n best while the n-th clears 1 - factor/(n+1)", least=0.0, above=True)}
    sweep_setting = OPTION_SETTING_PREFIX + "factor"
    uses_threshold = False

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked = block.masked
        tokens, confidence, _ = self.predict(logits)
        rank = rank_in_row(confidence, masked)
        nominal = 1.0 - float(self.option("factor")) / (rank + 2).to(confidence.dtype)  # t_(rank+1)
        passes = masked & ((confidence >= nominal) | (rank == 0))  # t_1 = -1: rank 1 always passes
        # leading run of passing ranks: sort the pass flags by rank and count the prefix of Trues
        by_rank = torch.zeros_like(passes).scatter_(1, rank, passes)
        leading = by_rank.long().cumprod(dim=1).sum(dim=1, keepdim=True)
        k = masked.sum(dim=1, keepdim=True)
        take = torch.where(leading >= k - 1, k, leading)
        commit = masked & (rank < take)
        forced = commit & (confidence < nominal)
        extras = {"rank": torch.where(masked, rank, torch.full_like(rank, -1)), "factor_threshold": nominal}
        return DecodeResult(tokens, confidence, commit, forced, extras)
