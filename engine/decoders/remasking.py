"""Decoders that take back what they committed by returning it to [MASK] (docs/algorithms.md §2.8):
`remdm` (ReMDM: each committed token is remasked with a scheduled probability, seeded) and `wino`
(WINO: wide-in commits, narrow-out remasks the tokens a leave-one-out shadow block doubts).

They are revising decoders as engine/decoders/revising.py's `edit` is: the loop hands them the block's
current tokens and the positions they may change, applies their remasks and records each with the
rule's numbers (docs/trace.md §3.1). A remask stays inside the current block, whose K/V every
cached forward computes fresh (engine/cache.py), so no cache mode serves a stale K/V for it.

WINO needs more than the block's logits: one forward over the canvas with a *shadow block* appended
(engine/decoders/shadow.py), which the cache manager runs for it (`Decoder.shadow_block`).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..config import GenerationConfig
from ..errors import EngineError
from ..registry import DecoderOption, register_decoder
from ..trace import REMASK
from .base import Block, DecodeResult, Decoder, committed_after, rank_in_row, top1

# ---- ReMDM ----------------------------------------------------------------------------------

REMDM_SCHEDULES = ("cap", "rescale", "conf")
REMDM_RULE = "u < sigma_t"
REMDM_CONF_RULE = "u / low-confidence share < sigma_max"


def remdm_sigma_max(step: int, steps: int) -> float:
    """`min(1, (1 - α_s) / α_t)` for step `step` (0-based) of `steps`, with LLaDA's linear schedule
    inside a block: `α_t = step / steps` of the block is decoded before the step, `α_s = (step + 1) /
    steps` after it. ReMDM's bound on the remasking probability that keeps the marginals of the
    schedule (arXiv 2503.00307 §3); 1 at the first step (nothing is decoded yet), 0 at the last and
    after it (a refresh's second iteration may run one more), so those never remask."""
    if step + 1 >= steps:
        return 0.0
    alpha_t, alpha_s = step / steps, (step + 1) / steps
    return 1.0 if alpha_t == 0 else min(1.0, (1.0 - alpha_s) / alpha_t)


@register_decoder
class RemdmDecoder(Decoder):
    """ReMDM (remasking diffusion, arXiv 2503.00307) on LLaDA's block schedule.

    Each block runs exactly `steps / blocks` iterations (as `fixed`). At step i, every committed,
    generated token of the block is remasked where a uniform draw `u` (from the run's seeded
    generator) falls below its σ: `cap` σ = min(η, (1 - α_s)/α_t); `rescale` σ = η·σ_max; `conf`
    σ = σ_max·softmax(-p) over the block's committed tokens, p each one's probability when it was
    committed, so the least confident are the likeliest to go (σ_max = min(1, (1 - α_s)/α_t)).
    Then the most confident masks are committed until the block holds the schedule's count of masks
    after step i (the remasked ones included), so remasked positions are refilled by later steps.
    The last step has σ = 0 and fills every mask, so a block always ends. Rules from the authors'
    `diffusion.py` (kuleshov-group/remdm, `_ddpm_caching_update`); their LLaDA port
    (guanghanwang/ReMDM-LLaDA) remasks a fixed count instead. Extras: `remask_probability` (σ).
    """

    name = "remdm"
    order = 90
    revises = True
    # the draws of one generator are shared by a batch's rows: a row's remasks depend on the others
    row_wise = False
    settings = ("steps",)
    sweep_setting = "steps"
    uses_threshold = False
    explanation = (
        "**ReMDM (remasking diffusion, Wang et al. 2025, arXiv 2503.00307).** Each block gets a fixed "
        "number of steps, as `fixed`. At every step each committed token of the block is returned to "
        "[MASK] with a small probability σ (drawn from the run's seed: the same seed gives the same run): "
        "`cap` σ = min(η, (1 − α_s)/α_t), `rescale` η times that bound, `conf` the bound shared out by low "
        "confidence at commit time. Then the most confident masks are filled until the block is on "
        "schedule again, so a remasked token gets a second prediction in a later, better-informed step. "
        "The last step remasks nothing and fills every mask."
    )
    options: ClassVar[dict[str, DecoderOption]] = {
        "remdm_schedule": DecoderOption("cap", "remdm: how the remasking probability is set: cap, rescale or conf", REMDM_SCHEDULES),
        "remdm_eta": DecoderOption(0.02, "remdm: eta, the remasking probability of cap (its bound) and rescale (its share of the bound)", least=0.0, most=1.0),
    }

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.schedule = str(self.option("remdm_schedule"))
        self.eta = float(self.option("remdm_eta"))
        self.steps = config.steps_per_block()
        self.steps_done = 0
        self.masks_at_start = torch.zeros(0, dtype=torch.long)
        self.commit_confidence = torch.zeros(0)

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        self.steps_done = 0
        self.masks_at_start = masked.sum(dim=1)
        self.commit_confidence = torch.zeros(masked.shape, device=masked.device)

    def block_continues(self, masks_left: bool) -> bool:
        # a block that had masks runs all its steps, remasking on the way; one without never starts
        return masks_left or 0 < self.steps_done < self.steps

    def remask_probability(self, step: int, editable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(σ `[B, W]` at the editable positions, 0 elsewhere; each one's share of σ_max, 1 where
        the schedule gives every token the same σ; the bound the trace records: that σ, or σ_max)."""
        sigma_max = remdm_sigma_max(step, self.steps)
        if self.schedule == "conf":
            low = torch.where(editable, -self.commit_confidence, torch.full_like(self.commit_confidence, float("-inf")))
            share = torch.nan_to_num(torch.softmax(low, dim=1))  # a row with nothing committed: all 0
            return sigma_max * share, share, sigma_max
        # cap at the first step (α_t = 0) is the authors' η; nothing of the block is decoded then
        sigma = min(self.eta, sigma_max) if self.schedule == "cap" else self.eta * sigma_max
        return torch.where(editable, sigma, 0.0), torch.ones_like(self.commit_confidence), sigma

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked, editable = block.masked, block.editable
        tokens, confidence, _ = self.predict(logits)
        step = self.steps_done
        sigma, share, bound = self.remask_probability(step, editable)
        u = torch.rand(masked.shape, device=masked.device, generator=self.generator)
        remask = editable & (u < sigma)
        masks_after = self.masks_at_start - committed_after(self.masks_at_start, step, self.steps)
        count = masked.sum(dim=1)
        take = torch.clamp(count - masks_after + remask.sum(dim=1), min=0)
        take = torch.minimum(take, count)
        commit = masked & (rank_in_row(confidence, masked) < take.unsqueeze(1))
        self.commit_confidence = torch.where(commit, confidence, self.commit_confidence)
        self.steps_done += 1
        conf = self.schedule == "conf"
        score = u / share.clamp(min=torch.finfo(share.dtype).tiny) if conf else u
        return DecodeResult(
            tokens, confidence, commit, torch.zeros_like(commit), {"remask_probability": sigma},
            edit=torch.zeros_like(remask), remask=remask, revision_score=score, revision_rules={REMASK: (REMDM_CONF_RULE if conf else REMDM_RULE, bound)},
            active=self.masks_at_start > 0,  # a row whose block had no mask runs none of its steps
        )


# ---- WINO -----------------------------------------------------------------------------------

WINO_RULE = "p_leave-one-out(current) < narrow-out threshold"
# The authors' cap on one step's wide-in commits: 70% of the block's masks, within [5, 20].
WIDE_IN_SHARE, WIDE_IN_MIN, WIDE_IN_MAX = 0.7, 5, 20
# The cache modes whose forward the shadow block can join: it needs every canvas key fresh.
WINO_CACHE_MODES = ("none",)


def wide_in_narrow_out(
    confidence: torch.Tensor, masked: torch.Tensor, loo: torch.Tensor, editable: torch.Tensor, threshold_in: float, threshold_out: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """WINO's rule on one step, row by row: (commit, forced, remask), each `[B, W]`.

    Wide-in: the masks with `confidence > threshold_in`, at most `clamp(int(0.7·masks), 5, 20)` of
    them (the most confident), at least one (the most confident). Narrow-out: the editable tokens
    whose leave-one-out probability `loo` of their current token is `< threshold_out`, at most
    (this step's wide-in count - 1) of them (the lowest), so every step fills at least one mask
    more than it remasks. The authors' code caps by the previous step's count (30 at a block's
    first step), which does not guarantee progress; d2Cache's reimplementation uses this one.
    """
    masks = masked.sum(dim=1)
    cap = torch.clamp((masks.double() * WIDE_IN_SHARE).long(), WIDE_IN_MIN, WIDE_IN_MAX)
    above = masked & (confidence > threshold_in)
    take = torch.clamp(torch.minimum(above.sum(dim=1), cap), min=1)
    commit = masked & (rank_in_row(confidence, masked) < take.unsqueeze(1))
    doubted = editable & (loo < threshold_out)
    room = commit.sum(dim=1) - 1
    remask = doubted & (rank_in_row(-loo, doubted) < room.unsqueeze(1))
    return commit, commit & ~above, remask


@register_decoder
class WinoDecoder(Decoder):
    """WINO (wide-in, narrow-out; Hong et al. 2025, arXiv 2507.18578) with its shadow block.

    Each forward is engine/decoders/shadow.py's `shadow_forward`: the canvas plus a copy of the block as [MASK], whose position
    j sees everything but real position j. Wide-in commits the masks above τ (the `threshold`
    setting, the authors' τ_in 0.6) within the published caps; narrow-out remasks committed block
    tokens whose shadow probability of their current token is below `wino_threshold_out` (τ_out,
    0.9), at most the wide-in count less one (`wide_in_narrow_out`). Runs without a cache (every
    canvas key fresh), on LLaDA and LLaDA-MoE. Extras: `leave_one_out` (that probability, 0 at
    masks and the prompt).
    """

    name = "wino"
    order = 100
    revises = True
    row_wise = True
    shadow_block = True  # the cache manager runs the canvas with the shadow block (engine/decoders/shadow.py)
    options: ClassVar[dict[str, DecoderOption]] = {
        "wino_threshold_out": DecoderOption(0.9, "wino: remask a committed token whose leave-one-out probability is below this", least=0.0, most=1.0),
    }
    explanation = (
        "**WINO (wide-in, narrow-out; Hong et al. 2025, arXiv 2507.18578).** Every forward also runs a "
        "*shadow* copy of the block, all [MASK], in which each position sees the whole canvas except its own "
        "real position: a leave-one-out check of every committed token. *Wide in*: the masks above τ are "
        "committed, generously (up to 70% of the masks, 5 to 20). *Narrow out*: a committed token whose "
        "leave-one-out probability falls below τ_out is returned to [MASK], fewer than were just committed, "
        "so the block still fills. A low τ commits boldly and lets the check take the doubtful tokens back."
    )

    @classmethod
    def refuses(cls, config: GenerationConfig) -> str | None:
        if config.cache not in WINO_CACHE_MODES:
            return f"decoder 'wino' runs its shadow block over the whole canvas: cache '{config.cache}' is not supported; use cache {' or '.join(WINO_CACHE_MODES)}"
        return super().refuses(config)

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.threshold_out = float(self.option("wino_threshold_out"))

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked, current, editable, threshold = block.masked, block.tokens, block.editable, block.threshold
        if block.shadow_logits is None:
            raise EngineError("decoder 'wino' decides from its shadow forward, and none ran before this decode (the cache manager runs it for decoders with shadow_block)")
        tokens, confidence, _ = self.predict(logits)
        _, _, shadow = top1(block.shadow_logits, self.mask_id)  # the fp32 softmax, [MASK] excluded
        loo = torch.where(editable, shadow.gather(-1, current.unsqueeze(-1)).squeeze(-1), torch.zeros_like(confidence))
        commit, forced, remask = wide_in_narrow_out(confidence, masked, loo, editable, threshold, self.threshold_out)
        return DecodeResult(
            tokens, confidence, commit, forced, {"leave_one_out": loo},
            edit=torch.zeros_like(remask), remask=remask, revision_score=loo, revision_rules={REMASK: (WINO_RULE, self.threshold_out)},
        )
