"""The entropy-bounded decoder (EB-Sampler, docs/algorithms.md §2.9): its acceptance rule
is also the uniform-state loop's (engine/kinds/uniform.py), so it lives here, once."""

from __future__ import annotations

import torch

from ..registry import OPTION_SETTING_PREFIX, DecoderOption, register_decoder
from .base import Block, DecodeResult, Decoder, real_token_logits


@register_decoder
class EntropyBoundDecoder(Decoder):
    """Commits the lowest-entropy masked positions while their summed entropy, less the largest, stays <= the bound.

    EB-Sampler (entropy-bounded unmasking, arXiv 2505.24857; docs/algorithms.md §2.9):
    sort the masked positions by the entropy of their distribution ([MASK] excluded) ascending and
    commit the first k while `sum(H_1..H_k) - H_k`, the sum of those before the k-th, is <= the
    bound; the lowest always passes, so every row with a mask commits at least one. Bound 0 gives
    one token per step (ties at zero entropy aside), a large bound every mask. The same rule is
    DiffusionGemma's acceptance over all canvas positions (engine/kinds/uniform.py calls `accept`).
    Extras: `entropy` and `entropy_sum` (each position's compared sum), 0 where unmasked.
    """

    name = "entropy_bound"
    order = 60
    explanation = (
        "**Entropy bound (EB-Sampler, arXiv 2505.24857).** The block's masked positions are sorted by "
        "the entropy of their prediction, lowest first, and committed while the summed entropy of "
        "those committed, less the largest, stays within the bound γ: an upper bound on how much the "
        "committed tokens can depend on each other. The most certain position always commits. A "
        "larger γ commits more per forward; γ = 0 commits about one at a time."
    )
    settings = ()
    sweep_setting = OPTION_SETTING_PREFIX + "entropy_bound"  # its own option
    uses_threshold = False
    row_wise = True
    options = {"entropy_bound": DecoderOption(0.1, "entropy_bound / uniform: accept the lowest-entropy positions while their summed entropy, less the largest, stays <= this", least=0.0)}

    @staticmethod
    def entropy(logits: torch.Tensor) -> torch.Tensor:
        """Entropy of softmax(logits) per position, by torch's Categorical (transformers' rule uses it)."""
        return torch.distributions.Categorical(logits=logits).entropy()

    @staticmethod
    def accept(entropy: torch.Tensor, bound: float, eligible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted, lower_sum) `[B, W]` over the `eligible` positions (all when None): sorted by
        entropy ascending, the first k whose sum of entropies before them is <= `bound`.
        `lower_sum` is that sum per position (0 where not eligible)."""
        if eligible is not None:
            entropy = entropy.masked_fill(~eligible, float("inf"))  # sorted last, never accepted
        ordered, order = torch.sort(entropy, dim=-1, descending=False)
        before = torch.cumsum(ordered, dim=-1) - ordered
        accepted = torch.zeros_like(entropy, dtype=torch.bool).scatter(-1, order, before <= bound)
        lower_sum = torch.empty_like(entropy).scatter(-1, order, before)
        if eligible is not None:
            accepted &= eligible
            lower_sum = torch.where(eligible, lower_sum, torch.zeros_like(lower_sum))
        return accepted, lower_sum

    def commit_order(self, result: DecodeResult) -> torch.Tensor:
        return -result.extras["entropy"]  # lowest entropy first, the rule's own order

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked = block.masked
        tokens, confidence, _ = self.predict(logits)
        entropy = self.entropy(real_token_logits(logits, self.mask_id))
        commit, lower_sum = self.accept(entropy, self.option("entropy_bound"), masked)
        extras = {"entropy": torch.where(masked, entropy, torch.zeros_like(entropy)), "entropy_sum": lower_sum}
        return DecodeResult(tokens, confidence, commit, torch.zeros_like(commit), extras)
