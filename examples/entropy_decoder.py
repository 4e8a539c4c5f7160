"""An example decoder plug-in: entropy-bounded commits (after the EB-sampler, arXiv 2505.24857).

Commits the masked positions of lowest entropy, as many as keep the summed entropy of all but the
last one within a budget of -ln(threshold) nats (so at least one per row, and more when the
model is sure). It reads the config's `threshold`, so smoothing's threshold ramp applies to it too, and declares
one setting of its own, `max_per_step`, to show how a plug-in adds a setting.

Use it from the command line or the app by listing this file in DINFER_VIZ_DECODERS:

    DINFER_VIZ_DECODERS=examples/entropy_decoder.py python -m engine generate --decoder entropy --max-per-step 2 --prompt "Hi"
"""

import math

import torch

from engine import Decoder, DecoderOption, register_decoder
from engine.decoders import Block, DecodeResult, rank_in_row


@register_decoder
class EntropyBoundedDecoder(Decoder):
    """Commits the lowest-entropy masked positions while the entropy of all but the last stays within -ln(threshold)."""

    name = "entropy"
    # a setting of its own: the CLI gets `--max-per-step`, the app a control, the config
    # `decoder_options={"max_per_step": N}`
    options = {"max_per_step": DecoderOption(0, "commit at most this many positions per iteration (0: no cap)")}

    # one call per iteration: `block.masked` `[B, W]` the block's [MASK] positions, `block.threshold`
    # the threshold in force (also `block.tokens`, `block.editable` for a rule that revises commits)
    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked = block.masked
        tokens, confidence, probs = self.predict(logits)
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)
        rank = rank_in_row(-entropy, masked)  # lowest entropy first
        by_rank = torch.zeros_like(entropy).scatter_(1, rank, torch.where(masked, entropy, 0.0))
        spent_before = by_rank.cumsum(dim=1) - by_rank  # entropy of the better-ranked positions
        within = (spent_before <= -math.log(block.threshold)).gather(1, rank)
        commit = masked & within
        if self.option("max_per_step") > 0:
            commit &= rank < self.option("max_per_step")
        return DecodeResult(tokens, confidence, commit, torch.zeros_like(commit), {"entropy": entropy})
