"""Decoders that revise what they committed (docs/algorithms.md §2.8): besides filling masks, they
may edit a committed token or return it to [MASK]. The loop (engine/kinds/masked.py) hands them the
block's current tokens and the positions they may change, applies the edits and remasks, records
each with the rule's numbers (docs/trace.md §3.1), and asks them when a block ends.

Edits and remasks stay inside the current block, whose K/V every cached forward computes fresh
(engine/cache.py), so no cache mode serves a stale K/V for a revised position.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..config import GenerationConfig
from ..errors import EngineError
from ..registry import DecoderOption, decoder_class, register_decoder
from ..trace import EDIT
from .base import Block, DecodeResult, Decoder, best_per_row

EDIT_RULE = "p(new) > edit threshold"
# Post-edit steps bound a block's forwards beyond its masks: a request's work stays bounded by
# its canvas (the published defaults use 16).
MAX_POST_EDIT_STEPS = 256


def penalise_repeats(logits: torch.Tensor, current: torch.Tensor, penalty: float) -> torch.Tensor:
    """LLaDA2.1's repetition penalty: at each block position after the first, `penalty` is taken
    from the logit of the token the position before it holds now (a copy; unchanged at 0)."""
    if penalty == 0:
        return logits
    logits = logits.clone()
    logits[:, 1:].scatter_add_(-1, current[:, :-1].unsqueeze(-1), torch.full_like(logits[:, 1:, :1], -penalty))
    return logits


@register_decoder
class EditDecoder(Decoder):
    """LLaDA2.1's joint threshold (mask-to-token plus token-to-token), row by row.

    Per iteration, for each row whose block is not finished: M2T fills every mask with confidence
    > τ (at least the row's most confident one); T2T overwrites each committed, generated position
    of the block whose top-1 differs from its token with probability > τ_edit (an edit). An
    iteration that starts with no mask in the row is one of its post-edit steps: at most
    `max_post_edit_steps` of them run, and the row finishes at one that changes nothing. The block
    ends when every row has finished. The rule of LLaDA2.1's own `generate` and SGLang's
    `joint_threshold.py` (docs/algorithms.md §2.8).
    """

    name = "edit"
    order = 80
    references = ("diffusers",)  # LLaDA2Pipeline with an editing threshold
    revises = True
    row_wise = True
    explanation = (
        "**Edit (LLaDA2.1's joint threshold).** Each iteration fills every mask whose top-1 "
        "probability exceeds τ (at least the most confident one), and also *edits*: a committed "
        "token of the block whose top-1 is another token with probability above τ_edit is "
        "overwritten (struck through in the grid). Once the block has no masks, up to "
        "`max_post_edit_steps` more iterations may edit; the block ends at an iteration that changes "
        "nothing. A low τ commits many tokens at once and lets the edits repair the wrong ones: "
        "LLaDA2.1's fast S-mode (τ 0.5) against its careful Q-mode."
    )
    options: ClassVar[dict[str, DecoderOption]] = {
        "edit_threshold": DecoderOption(0.5, "edit: overwrite a committed token when another has probability above this", least=0.0, most=1.0),
        "max_post_edit_steps": DecoderOption(16, "edit: iterations that may still edit once the block has no masks", least=0, most=MAX_POST_EDIT_STEPS),
        "repetition_penalty": DecoderOption(0.0, "edit: taken from the logit of the previous position's token (0: off)", least=0.0, most=100.0),
    }
    # the three published default sets (threshold, edit threshold, post-edit steps)
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "SGLang": {"threshold": 0.5, "edit_threshold": 0.0, "max_post_edit_steps": 16},
        "Hugging Face / dllm": {"threshold": 0.95, "edit_threshold": 0.9, "max_post_edit_steps": 16},
        "diffusers": {"threshold": 0.7, "edit_threshold": 0.5, "max_post_edit_steps": 16},
    }

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.edit_threshold = float(self.option("edit_threshold"))
        self.max_post = int(self.option("max_post_edit_steps"))
        self.penalty = float(self.option("repetition_penalty"))
        self.extra_forwards = self.max_post
        self.post_steps = torch.zeros(0, dtype=torch.long)
        self.finished = torch.zeros(0, dtype=torch.bool)
        self.stepped = (torch.zeros(0, 0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool))  # the last step's mask and rows with one

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        self.post_steps = torch.zeros(masked.shape[0], dtype=torch.long, device=masked.device)
        self.finished = torch.zeros(masked.shape[0], dtype=torch.bool, device=masked.device)

    def block_continues(self, masks_left: bool) -> bool:
        return not bool(self.finished.all())

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked, current, editable, threshold = block.masked, block.tokens, block.editable, block.threshold
        tokens, confidence, _ = self.predict(penalise_repeats(logits, current, self.penalty))
        running = ~self.finished
        active = running.unsqueeze(1)
        had_mask = masked.any(dim=1)
        self.post_steps += (~had_mask).long()  # this iteration is a post-edit step of those rows
        above = masked & (confidence > threshold)
        commit = (above | best_per_row(confidence, masked)) & active
        edit = editable & (tokens != current) & (confidence > self.edit_threshold) & active
        self.stepped = (masked, had_mask)
        return DecodeResult(
            tokens, confidence, commit, commit & ~above, edit=edit, remask=torch.zeros_like(edit),
            revision_score=confidence, revision_rules={EDIT: (EDIT_RULE, self.edit_threshold)}, active=running,
        )


    def applied(self, result: DecodeResult) -> None:
        """Rows finish by what the step wrote (a constraint may have dropped some of its writes).
        Settled: a mask-free iteration that changed nothing; spent: the next iteration would be
        one post-edit step too many, so it is not run (the reference checks before its forward)."""
        masked, had_mask = self.stepped
        settled = ~had_mask & ~(result.commit | result.edit).any(dim=1)
        spent = ~(masked & ~result.commit).any(dim=1) & (self.post_steps >= self.max_post)
        self.finished |= settled | spent


def apply_preset(config: GenerationConfig, preset: str) -> GenerationConfig:
    """`config` with one of its decoder's published default sets (`presets`): config fields set
    directly, the decoder's own options in `decoder_options`."""
    presets: dict[str, dict[str, Any]] = decoder_class(config.decoder).presets
    if preset not in presets:
        raise EngineError(f"decoder '{config.decoder}' has no preset '{preset}'" + (f"; it has {', '.join(presets)}" if presets else ""))
    values = presets[preset]
    options = decoder_class(config.decoder).options
    fields = {k: v for k, v in values.items() if k not in options}
    return config.replace(**fields, decoder_options={**config.decoder_options, **{k: v for k, v in values.items() if k in options}})
