"""An example decoder plug-in: entropy-bounded commits (after the EB-sampler, arXiv 2505.24857).

Commits the masked positions of lowest entropy, as many as keep the summed entropy of all but the
last one within a budget of -ln(threshold) nats (so at least one per row, and more when the
model is sure). It reads only the config's existing `threshold`, so smoothing's threshold ramp
applies to it too.

Use it from the command line or the app by listing this file in DINFER_VIZ_DECODERS:

    DINFER_VIZ_DECODERS=examples/entropy_decoder.py python -m engine generate --decoder entropy --prompt "Hi"
"""

import math

import torch

from engine.decoders import DecodeResult, Decoder, rank_in_row, register_decoder


@register_decoder
class EntropyBoundedDecoder(Decoder):
    """Commits the lowest-entropy masked positions while the entropy of all but the last stays within -ln(threshold)."""

    name = "entropy"

    def decode(self, logits: torch.Tensor, masked: torch.Tensor, threshold: float) -> DecodeResult:
        tokens, confidence, probs = self.predict(logits)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)
        rank = rank_in_row(-entropy, masked)  # lowest entropy first
        by_rank = torch.zeros_like(entropy).scatter_(1, rank, torch.where(masked, entropy, 0.0))
        spent_before = by_rank.cumsum(dim=1) - by_rank  # entropy of the better-ranked positions
        within = (spent_before <= -math.log(threshold)).gather(1, rank)
        commit = masked & within
        return DecodeResult(tokens, confidence, commit, torch.zeros_like(commit), {"entropy": entropy})
