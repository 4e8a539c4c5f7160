"""The decoders that only fill masks, each by a rule of its own (docs/algorithms.md §2.2-2.6):
`fixed` (LLaDA's schedule), `threshold` (Fast-dLLM, dInfer), `hierarchical` (dInfer) and
`credit` (CreditDecoding), with the helpers only they use."""

from __future__ import annotations

import torch

from ..config import GenerationConfig
from ..registry import DecoderOption, register_decoder
from .base import Block, DecodeResult, Decoder, best_per_row, committed_after, rank_in_row, top1

REMASKING = ("low_confidence", "random")
ANCHORS = ("confidence", "centre")


def threshold_commit(confidence: torch.Tensor, masked: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM's rule: every masked position with confidence >= threshold, plus each row's best.

    Returns (commit, forced) where forced marks the best-of-row commits below the threshold.
    """
    above = masked & (confidence >= threshold)
    commit = above | best_per_row(confidence, masked)
    return commit, commit & ~above


def masked_runs(masked: torch.Tensor) -> torch.Tensor:
    """`[B, W]` index (0-based, per row) of the maximal run of consecutive masked positions each
    position belongs to; -1 where unmasked."""
    before = torch.cat([torch.zeros_like(masked[:, :1]), masked[:, :-1]], dim=1)
    run = (masked & ~before).long().cumsum(dim=1) - 1
    return torch.where(masked, run, torch.full_like(run, -1))


def reduce_per_run(values: torch.Tensor, runs: torch.Tensor, reduce: str, empty: float) -> torch.Tensor:
    """`[B, W]`: for each masked position, `reduce` ("amax"/"amin") of `values` over its run;
    `empty` at unmasked positions. A row has at most W runs, so slot `b * W + run` is unique."""
    b, w = runs.shape
    slots = torch.arange(b, device=runs.device).unsqueeze(1) * w + runs
    slots = torch.where(runs >= 0, slots, torch.full_like(slots, b * w))  # unmasked -> a spare slot
    table = torch.full((b * w + 1,), empty, dtype=values.dtype, device=values.device)
    table = table.scatter_reduce(0, slots.flatten(), values.flatten(), reduce=reduce, include_self=True)
    return torch.where(runs >= 0, table[slots], torch.full_like(values, empty))


@register_decoder
class FixedStepDecoder(Decoder):
    """Commits a fixed number of the most confident (or random) masked positions per step, LLaDA's schedule.

    LLaDA's reference sampler (docs/algorithms.md §2.2). With `n` masks at block start and `s = steps / num_blocks` steps, step `i` commits
    `n // s + (1 if i < n % s else 0)` positions, chosen by confidence (`low_confidence`) or at
    random (`random`). Per-row counts are tensors, so a batch needs no host sync.
    """

    name = "fixed"
    order = 10
    explanation = (
        "**Fixed steps (LLaDA's reference sampler).** Each block gets `steps / blocks` iterations and "
        "commits the same share of its masks in each, choosing the most confident predictions "
        "(`low_confidence`) or random ones. Tokens per forward is fixed by the schedule, whatever the "
        "model's certainty: the baseline the other decoders improve on."
    )
    row_wise = True
    settings = ("steps",)
    options = {"remasking": DecoderOption("low_confidence", "fixed: commit the most confident positions, or random ones", REMASKING)}
    sweep_setting = "steps"
    uses_threshold = False

    @classmethod
    def row_wise_for(cls, config: GenerationConfig) -> bool:
        return cls.row_wise and cls.option_in(config, "remasking") != "random"  # random remasking draws from the batch's one stream

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.random = self.option("remasking") == "random"
        self.steps_per_block = config.steps_per_block()
        self.steps_done = 0
        self.masks_at_start = torch.zeros(0, dtype=torch.long)

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        self.masks_at_start = masked.sum(dim=1)
        self.steps_done = 0

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked = block.masked
        tokens, confidence, _ = self.predict(logits)
        # the count that leaves the block on schedule after this step: the step's share, or more
        # when a constraint kept back an earlier step's commit (then the last step fills the rest)
        on_schedule = self.masks_at_start - committed_after(self.masks_at_start, self.steps_done, self.steps_per_block)
        k = torch.clamp(masked.sum(dim=1) - on_schedule, min=0)
        self.steps_done += 1
        if self.random:
            score = torch.rand(masked.shape, device=masked.device, generator=self.generator)
        else:
            score = confidence
        commit = masked & (rank_in_row(score, masked) < k.unsqueeze(1))
        return DecodeResult(tokens, confidence, commit, torch.zeros_like(commit))


@register_decoder
class ThresholdDecoder(Decoder):
    """Commits every masked position whose confidence reaches the threshold, and at least the row's most confident one.

    Fast-dLLM / dInfer threshold decoding (docs/algorithms.md §2.3).
    """

    name = "threshold"
    order = 20
    references = ("diffusers",)  # LLaDA2Pipeline without an editing threshold
    explanation = (
        "**Threshold (Fast-dLLM, dInfer).** Every masked position of the current block whose top-1 "
        "probability reaches τ is committed in the same iteration; if none does, the single most "
        "confident one is committed anyway (orange *forced* cells), so every forward makes progress. "
        "On a model trained on EOS-padded answers that is often the EOS beside the last one, forward "
        "after forward, until the block's end stops it (lesson 4). "
        "A lower τ commits more per forward (higher TPF) and risks committing wrong tokens together."
    )
    row_wise = True

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        tokens, confidence, _ = self.predict(logits)
        commit, forced = threshold_commit(confidence, block.masked, block.threshold)
        return DecodeResult(tokens, confidence, commit, forced)


@register_decoder
class HierarchicalDecoder(Decoder):
    """Commits one anchor per run of consecutive masks, every position above the threshold, and the row's best.

    dInfer's hierarchical decoding (docs/algorithms.md §2.6), for any batch size: an anchor is a run's
    position with confidence > `low_threshold`, chosen by `anchor`: "confidence" (the run's most
    confident position, every exact tie included, as dInfer's code) or "centre" (the eligible
    position nearest the run's centre; ties go to the more confident, then the left one, as the
    report describes centre-first splitting). Committing an anchor splits its run, so later
    iterations work on ever smaller runs. The high threshold is strict (`>`), as in dInfer.
    Extras: `runs` (run index per position, -1 unmasked) and `anchors` (bool).
    """

    name = "hierarchical"
    order = 30
    explanation = (
        "**Hierarchical (dInfer).** The block's masks form runs of consecutive positions. Each run "
        "commits one *anchor* (its most confident position, or the one nearest its centre) if it beats "
        "the low threshold, plus everything above the high threshold τ. An anchor splits its run, so "
        "later iterations work on ever smaller spans, spreading commits across the block instead of "
        "clustering them."
    )
    row_wise = True
    options = {
        "low_threshold": DecoderOption(0.6, "hierarchical: a span's anchor must exceed this", least=0.0, most=1.0),
        "anchor": DecoderOption("confidence", "hierarchical: most confident position of a span, or the one nearest its centre", ANCHORS),
    }

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        masked = block.masked
        tokens, confidence, _ = self.predict(logits)
        runs = masked_runs(masked)
        eligible = masked & (confidence > float(self.option("low_threshold")))
        if self.option("anchor") == "confidence":
            anchors = eligible & (confidence == reduce_per_run(confidence, runs, "amax", float("-inf")))
        else:
            anchors = self._centre_anchors(confidence, runs, eligible)
        above = masked & (confidence > block.threshold)
        best = best_per_row(confidence, masked)
        commit = anchors | above | best
        return DecodeResult(tokens, confidence, commit, commit & ~(anchors | above), {"runs": runs, "anchors": anchors})

    @staticmethod
    def _centre_anchors(confidence: torch.Tensor, runs: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
        w = runs.shape[1]
        position = torch.arange(w, device=runs.device).expand_as(runs)
        first = reduce_per_run(position, runs, "amin", w)
        last = reduce_per_run(position, runs, "amax", -1)
        distance = (2 * position - first - last).abs()  # twice the distance to the run's centre: an integer
        distance = torch.where(eligible, distance, torch.full_like(distance, 2 * w + 1))
        nearest = eligible & (distance == reduce_per_run(distance, runs, "amin", 2 * w + 1))
        score = torch.where(nearest, confidence, torch.full_like(confidence, float("-inf")))
        chosen = nearest & (score == reduce_per_run(score, runs, "amax", float("-inf")))
        leftmost = reduce_per_run(torch.where(chosen, position, torch.full_like(position, w)), runs, "amin", w)
        return chosen & (position == leftmost)


@register_decoder
class CreditDecoder(Decoder):
    """Commits by the threshold rule on logits boosted by each token's credit, earned by staying the top-1 across iterations.

    CreditDecoding (docs/algorithms.md §2.5): per block a credit `C[b, j, v]` decays by `credit_beta`
    every iteration, and the raw top-1 token of each masked position gains `p1 ** credit_gamma`;
    the fused logits `l + credit_alpha * log(1 + C)` choose both the token and the commit.
    Memory is one `[B, W, V]` fp32 tensor for the current block only, freed when the block
    completes; no host sync (dInfer's version ends each call with one). Extras: `credit` (credit of
    each position's candidate token) and `raw_confidence` (its probability before fusion).
    """

    name = "credit"
    order = 40
    explanation = (
        "**Credit (CreditDecoding).** A token that stays the top-1 at a position across iterations "
        "earns credit (decaying by β each iteration, boosted by p^γ); the logits get "
        "`α·log(1 + credit)` added before the threshold rule. Stable predictions cross τ sooner, so "
        "fewer forwards are needed; the extras view shows the credit per position."
    )
    row_wise = True
    options = {
        "credit_alpha": DecoderOption(0.7, "credit: weight of log(1 + credit) added to the logits (CreditDecoding's default)", least=0.0),
        "credit_beta": DecoderOption(0.8, "credit: per-iteration decay of the accumulated credit", least=0.0, most=1.0, above=True),
        "credit_gamma": DecoderOption(0.2, "credit: the top-1 token gains p^gamma each iteration", least=0.0),
    }

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.credit: torch.Tensor | None = None
        self.alpha, self.beta, self.gamma = (float(self.option(name)) for name in ("credit_alpha", "credit_beta", "credit_gamma"))

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        self.credit = None

    def block_done(self, block_index: int) -> None:
        self.credit = None

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        cfg = self.config
        raw = logits.to(torch.float32, copy=True)
        raw[..., self.mask_id] = float("-inf")
        probs = torch.softmax(raw, dim=-1)
        if self.credit is None:  # first call of the block (a Python attribute: no device read)
            self.credit = torch.zeros_like(raw)
        else:
            self.credit.mul_(self.beta)
        p1, v1 = probs.max(dim=-1)
        boost = p1.pow(self.gamma) * block.masked
        self.credit.scatter_add_(-1, v1.unsqueeze(-1), boost.unsqueeze(-1))
        fused = raw + self.alpha * torch.log1p(self.credit)
        tokens, confidence, _ = top1(fused, self.mask_id, cfg.temperature, self.generator)
        commit, forced = threshold_commit(confidence, block.masked, block.threshold)
        extras = {
            "credit": self.credit.gather(-1, tokens.unsqueeze(-1)).squeeze(-1),
            "raw_confidence": probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1),
        }
        return DecodeResult(tokens, confidence, commit, forced, extras)
