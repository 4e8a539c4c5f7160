"""Component 3, the decoders: which masked positions of the current block to commit, and to what.

A decoder sees the block's logits `[B, W, V]` and its mask `[B, W]` and returns a DecodeResult;
it never writes the canvas (the iteration manager does) and never reads a device value on the
host (no `.item()`, no Python branch on a tensor), so iterations can be queued back to back.

Every decoder sets the [MASK] logit to -inf before the softmax and the argmax, so a predicted
[MASK] is never committed and confidences are over real tokens.

Plug-in API: subclass `Decoder`, set `name`, and decorate with `@register_decoder`. The class is
built once per generate call with the GenerationConfig and the mask id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .config import GenerationConfig


@dataclass
class DecodeResult:
    """What one decode decided, for the manager to apply and the trace to record.

    `tokens` `[B, W]`: the candidate token of every block position; `confidence` `[B, W]`: its
    probability (for every position, masked or not, so a viewer sees the model's belief);
    `commit` `[B, W]`: positions to write now (always a subset of the masked ones);
    `forced` `[B, W]`: commits made only by the at-least-one rule; `extras`: decoder-specific
    per-position tensors (credit, runs, anchors) for the trace.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    commit: torch.Tensor
    forced: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """LLaDA's sampler: `argmax(exp(l) / (-log u)^T)` in float64, which samples softmax(l / T).

    Computed in log space (`l - T * log(-log u)`), the same argmax without overflow.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return (logits.double() - temperature * torch.log(-torch.log(u))).argmax(dim=-1)


def top1(
    logits: torch.Tensor, mask_id: int, temperature: float = 0.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, confidence, probs): the candidate per position, its probability, the fp32 softmax.

    The [MASK] logit is -inf first; the confidence uses the unnoised logits (LLaDA's rule).
    """
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    tokens = gumbel_argmax(logits, temperature, generator)
    probs = torch.softmax(logits, dim=-1)
    confidence = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, confidence, probs


def best_per_row(score: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """One-hot `[B, W]` of each row's highest-scoring masked position (empty for a row with no mask)."""
    scored = torch.where(masked, score, torch.full_like(score, float("-inf")))
    best = torch.zeros_like(masked)
    best.scatter_(1, scored.argmax(dim=1, keepdim=True), True)
    return best & masked


def threshold_commit(confidence: torch.Tensor, masked: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM's rule: every masked position with confidence >= threshold, plus each row's best.

    Returns (commit, forced) where forced marks the best-of-row commits below the threshold.
    """
    above = masked & (confidence >= threshold)
    commit = above | best_per_row(confidence, masked)
    return commit, commit & ~above


class Decoder:
    """Base class. Subclasses implement `decode`; `block_init`/`block_done` are optional hooks."""

    name: ClassVar[str] = ""

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        self.config = config
        self.mask_id = mask_id
        self.generator = generator

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        """Called once when a block starts, with its mask `[B, W]`."""

    def block_done(self, block_index: int) -> None:
        """Called when a block has no masks left; release per-block state here."""

    def decode(self, logits: torch.Tensor, masked: torch.Tensor, threshold: float) -> DecodeResult:
        """`threshold` is the one in force this iteration (smoothing may raise it above the config's)."""
        raise NotImplementedError

    def predict(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return top1(logits, self.mask_id, self.config.temperature, self.generator)


_REGISTRY: dict[str, type[Decoder]] = {}


def register_decoder(cls: type[Decoder]) -> type[Decoder]:
    """Class decorator: make a decoder selectable by its `name` (CLI, app, benchmarks)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def decoder_names() -> list[str]:
    return list(_REGISTRY)


def make_decoder(config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> Decoder:
    return _REGISTRY[config.decoder](config, mask_id, generator)


@register_decoder
class FixedStepDecoder(Decoder):
    """LLaDA's reference sampler: a fixed number of steps per block, top-k_i commits per step.

    With `n` masks at block start and `s = steps / num_blocks` steps, step `i` commits
    `n // s + (1 if i < n % s else 0)` positions, chosen by confidence (`low_confidence`) or at
    random (`random`). Per-row counts are tensors, so a batch needs no host sync.
    """

    name = "fixed"

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.steps_per_block = config.total_steps() // config.num_blocks()
        self.step = 0
        self.quota = torch.zeros(0)
        self.remainder = torch.zeros(0)

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        n = masked.sum(dim=1)
        self.quota = n // self.steps_per_block
        self.remainder = n % self.steps_per_block
        self.step = 0

    def decode(self, logits: torch.Tensor, masked: torch.Tensor, threshold: float) -> DecodeResult:
        tokens, confidence, _ = self.predict(logits)
        k = self.quota + (self.step < self.remainder).long() if self.step < self.steps_per_block else torch.zeros_like(self.quota)
        self.step += 1
        if self.config.remasking == "random":
            score = torch.rand(masked.shape, device=masked.device, generator=self.generator)
        else:
            score = confidence
        score = torch.where(masked, score, torch.full_like(score, float("-inf")))
        # rank of each position within its row, best first; commit the k best masked ones
        order = score.argsort(dim=1, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
        commit = masked & (rank < k.unsqueeze(1))
        return DecodeResult(tokens, confidence, commit, torch.zeros_like(commit))


@register_decoder
class ThresholdDecoder(Decoder):
    """Fast-dLLM / dInfer threshold decoding: commit every masked position with confidence >= tau,
    and at least the row's most confident one."""

    name = "threshold"

    def decode(self, logits: torch.Tensor, masked: torch.Tensor, threshold: float) -> DecodeResult:
        tokens, confidence, _ = self.predict(logits)
        commit, forced = threshold_commit(confidence, masked, threshold)
        return DecodeResult(tokens, confidence, commit, forced)

