"""What every decoder of engine/decoders/ shares: the `Decoder` base class, what one step sees
(`Block`) and decides (`DecodeResult`), how the loop writes that decision (`apply_decode`), and
the sampling and ranking helpers the rules build on (`top1`, `top_candidates`, `rank_in_row`...).

A decoder's one call per iteration, `step(logits, block)`, sees the block's logits `[B, W, V]` and
the block (`Block`: its mask `[B, W]`, tokens, editable positions, threshold) and returns a DecodeResult;
it never writes the canvas (the iteration manager does) and never reads a device value on the
host (no `.item()`, no Python branch on a tensor), so iterations can be queued back to back.

Every decoder sets the [MASK] logit to -inf before the softmax and the argmax, so a predicted
[MASK] is never committed and confidences are over real tokens.

Plug-in API (engine/registry.py): subclass `Decoder`, set `name`, implement `step`, decorate with
`@register_decoder`; a setting the config lacks is declared in `options` and read with
`self.option(name)`. The class is built once per generate call with the GenerationConfig and the
mask id; see examples/entropy_decoder.py. Its file goes in engine/decoders/ (imported with the
package) or is named in $DINFER_VIZ_DECODERS.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..config import GenerationConfig
from ..errors import EngineError
from ..registry import DecoderOption, decoder_class


@dataclass
class DecodeResult:
    """What one decode decided, for the manager to apply and the trace to record.

    `tokens` `[B, W]`: the candidate token of every block position; `confidence` `[B, W]`: its
    probability (for every position, masked or not, so a viewer sees the model's belief);
    `commit` `[B, W]`: masked positions to write now; `forced` `[B, W]`: commits made only by the
    at-least-one rule; `extras`: decoder-specific per-position tensors (credit, runs, anchors)
    for the trace.

    A revising decoder (`Decoder.revises`) may also change committed positions: `edit` `[B, W]`
    the committed positions whose token becomes `tokens`, `remask` those that return to [MASK]
    (never both at one position, never a masked one); `revision_score` `[B, W]` the number each
    was judged by, and `revision_rules` kind ("edit"/"remask") -> (the rule, its bound), as the
    trace records them (docs/trace.md §3.1).
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    commit: torch.Tensor
    forced: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    edit: torch.Tensor | None = None
    remask: torch.Tensor | None = None
    revision_score: torch.Tensor | None = None
    revision_rules: dict[str, tuple[str, float]] = field(default_factory=dict)
    # `[B]`: the rows that took part in this step (None: those with a mask in the block), for a
    # decoder whose rows finish on their own (the edit decoder's post-edit steps)
    active: torch.Tensor | None = None


def apply_decode(result: DecodeResult, current: torch.Tensor, mask_id: int) -> torch.Tensor:
    """The block's tokens after `result`: commits and edits write `tokens`, remasks write [MASK]."""
    written = result.commit if result.edit is None else result.commit | result.edit
    new = torch.where(written, result.tokens, current)
    return new if result.remask is None else torch.where(result.remask, torch.full_like(new, mask_id), new)


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """LLaDA's sampler: `argmax(exp(l) / (-log u)^T)` in float64, which samples softmax(l / T).

    Computed in log space (`l - T * log(-log u)`), the same argmax without overflow.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return (logits.double() - temperature * torch.log(-torch.log(u))).argmax(dim=-1)


def real_token_logits(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """fp32 logits with [MASK]'s at -inf: a decoder never proposes [MASK]."""
    logits = logits.to(torch.float32, copy=True)  # a copy: `.float()` of fp32 logits would alias the model's output
    logits[..., mask_id] = float("-inf")
    return logits


def top1(
    logits: torch.Tensor, mask_id: int, temperature: float = 0.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, confidence, probs): the candidate per position, its probability, the fp32 softmax.

    The [MASK] logit is -inf first; the confidence uses the unnoised logits (LLaDA's rule).
    """
    logits = real_token_logits(logits, mask_id)
    tokens = gumbel_argmax(logits, temperature, generator)
    probs = torch.softmax(logits, dim=-1)
    confidence = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, confidence, probs


def top_candidates(logits: torch.Tensor, mask_id: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, probs), each `[B, W, k]`: every position's k most probable tokens by `top1`'s softmax
    (unnoised, [MASK] excluded), most probable first: the alternatives the decoder weighed."""
    probs, ids = torch.softmax(real_token_logits(logits, mask_id), dim=-1).topk(k, dim=-1)
    return ids, probs


def best_per_row(score: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """One-hot `[B, W]` of each row's highest-scoring masked position (empty for a row with no mask)."""
    scored = torch.where(masked, score, torch.full_like(score, float("-inf")))
    best = torch.zeros_like(masked)
    best.scatter_(1, scored.argmax(dim=1, keepdim=True), True)
    return best & masked


def rank_in_row(score: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """`[B, W]` 0-based rank of each masked position by descending score within its row (ties: lower
    position first); unmasked positions rank after every masked one."""
    scored = torch.where(masked, score, torch.full_like(score, float("-inf")))
    order = scored.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return rank


def committed_after(n: torch.Tensor, step: int, steps: int) -> torch.Tensor:
    """`[B]` positions the block has committed after step `step` of `steps` on the `fixed` decoder's
    schedule (`n // steps` per step, one more in the first `n % steps`): all `n` after the last."""
    done = min(step + 1, steps)
    return done * (n // steps) + torch.clamp(n % steps, max=done)


@dataclass
class Block:
    """What a decoder sees of the block it decodes, one step: `masked` `[B, W]` its [MASK]
    positions, `tokens` `[B, W]` its tokens now, `editable` `[B, W]` the committed positions a
    revising decoder may change (generated ones of rows still running: never the prompt),
    `threshold` the one in force this step (smoothing may raise it above the config's), and the
    shadow block's logits `[B, W, V]` when the decoder asked for them (`Decoder.shadow_block`)."""

    masked: torch.Tensor
    tokens: torch.Tensor
    editable: torch.Tensor
    threshold: float
    shadow_logits: torch.Tensor | None = None


class Decoder:
    """Base class. Subclasses implement `step(logits, block)`: a rule that only fills masks reads
    `block.masked` and `block.threshold`, one that revises also `block.tokens` and `block.editable`;
    `block_init`/`block_done`/`block_continues` are optional hooks."""

    name: ClassVar[str] = ""
    # Where a decoder of the engine's stands in every list of decoders (`decoder_names()`: the CLI's
    # choices, the page's menu), ascending, ties by name, so the list never follows which file
    # happened to import first. The built-ins are spaced by 10 so a new one can stand between two;
    # the default puts a file that says nothing after them. Plug-ins follow, in the order
    # $DINFER_VIZ_DECODERS names them.
    order: ClassVar[int] = 1000
    # The diffusion kind whose models it decodes (engine/kinds/): "masked" unless it says.
    kind: ClassVar[str] = "masked"
    # False for decoders whose rule has no confidence threshold (the trace then records None).
    uses_threshold: ClassVar[bool] = True
    # The GenerationConfig settings this decoder reads (besides temperature and seed, which every
    # decoder's sampling reads): the app shows only these, the CLI's help names the decoder.
    settings: ClassVar[tuple[str, ...]] = ("threshold",)
    # The setting a sweep of this decoder varies (the speed/accuracy knob).
    sweep_setting: ClassVar[str] = "threshold"
    # The paragraph the app shows beside the views (Markdown); a plug-in without one still runs.
    explanation: ClassVar[str] = ""
    # Settings of this decoder's own, with their ranges (GenerationConfig keeps what every run
    # shares): given per run in `config.decoder_options`, checked with the config, read with
    # `self.option(name)`; the CLI and the app list them.
    options: ClassVar[dict[str, DecoderOption]] = {}
    # Published default sets of its settings, by name (engine/decoders/revising.py: apply_preset).
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    # True when a row's commits depend on that row alone (its logits, mask and state): rows of one
    # batch then each get their solo tokens, so requests may share a batch (engine/serving/batcher.py).
    row_wise: ClassVar[bool] = False
    # True for a decoder that edits or remasks committed tokens (docs/algorithms.md §2.8): its
    # `step` may return edits and remasks, and it decides in `block_continues` when a block ends,
    # so the loop queues no groups of iterations for it. The trace header records it.
    revises: ClassVar[bool] = False
    # True for a decoder that needs WINO's shadow block (engine/decoders/shadow.py): the cache manager
    # runs that forward and `Block.shadow_logits` carries the shadow's logits.
    shadow_block: ClassVar[bool] = False
    # The reference implementations whose own loop runs this rule (engine/reference.py records
    # their runs into a trace): "transformers", "diffusers".
    references: ClassVar[tuple[str, ...]] = ()
    # Forwards a block may take beyond one per position (the loop's guard against no progress).
    extra_forwards: int = 0
    # Pairs (a, b) of its own options that a run needs strictly increasing, a < b (a rule between
    # two settings, which each option's own range cannot state): `refuses` checks them and the
    # tuner searches b above a (engine/tuning/space.py).
    increasing: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "row_wise" not in vars(cls):  # a subclass may change the rule: it says so itself, never inherits it
            cls.row_wise = False
        if "options" in vars(cls):  # a subclass still reads its base's options (FixedStepDecoder's remasking): it keeps their declarations
            cls.options = {**super(cls, cls).options, **cls.options}
        clash = set(cls.options) & {f.name for f in dataclasses.fields(GenerationConfig)}
        if clash:  # one flag and one control per name: an option may not shadow a config field
            raise ValueError(f"decoder {cls.__name__}: options {sorted(clash)} are GenerationConfig fields; read those from self.config")
        if "decode" in vars(cls) and "step" not in vars(cls):  # the former call shape: the loop would never call it
            raise TypeError(
                f"decoder {cls.__name__} defines decode(logits, masked, threshold), which the engine no longer calls; "
                "implement step(logits, block) instead (block.masked, block.threshold)"
            )

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        why = type(self).refuses(config)
        if why is not None:  # `fit` refuses it first; a decoder built without `fit` still never runs it
            raise EngineError(why)
        self.config = config
        self.mask_id = mask_id
        self.generator = generator

    def block_init(self, masked: torch.Tensor, block_index: int) -> None:
        """Called once when a block starts, with its mask `[B, W]`."""

    def block_done(self, block_index: int) -> None:
        """Called when a block has no masks left; release per-block state here."""

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        """The decoder's one call per iteration: what to commit (and, revising, to edit or remask)
        given the block's logits `[B, W, V]` and the `block` they are for."""
        raise NotImplementedError(f"decoder {type(self).__name__} does not implement step(logits, block)")

    def commit_order(self, result: DecodeResult) -> torch.Tensor:
        """`[B, W]`: the order the rule ranks its writes in, highest first (a constraint keeps them
        in this order while the canvas stays completable: engine/constraints/canvas.py)."""
        return result.confidence

    def applied(self, result: DecodeResult) -> None:
        """What the loop wrote of `step`'s result (a constraint may drop writes, never add one): a
        rule whose state follows its own writes updates it here."""

    def block_continues(self, masks_left: bool) -> bool:
        """Before each iteration of a block (`masks_left`: any row still has a mask there): whether
        to run it. A non-revising decoder's block ends when its masks do."""
        return masks_left

    @classmethod
    def refuses(cls, config: GenerationConfig) -> str | None:
        """Why this decoder cannot run `config` beyond each setting's own range, in one line (None:
        it can): two of its `increasing` options out of order; a decoder adds its own rules (a
        cache mode it cannot run with). `fit` (engine/kinds/base.py) asks it before any forward, so
        the server answers it as the request's error and the tuner never suggests it."""
        for low, high in cls.increasing:
            a, b = cls.option_in(config, low), cls.option_in(config, high)
            if not a < b:
                return f"decoder '{cls.name}' needs {low} < {high}, got {low} {a}, {high} {b}"
        return None

    @classmethod
    def row_wise_for(cls, config: GenerationConfig) -> bool:
        """`row_wise` with these settings (a rule may draw from the run's one random stream)."""
        return cls.row_wise

    @classmethod
    def capabilities(cls) -> dict[str, bool]:
        """What the trace header records of the decoder (docs/trace.md §2)."""
        return {"revises": cls.revises, "shadow_block": cls.shadow_block}

    def option(self, name: str) -> Any:
        """This run's value of one of `options`: the config's, else the declared default."""
        return self.option_in(self.config, name)

    @classmethod
    def option_in(cls, config: GenerationConfig, name: str) -> Any:
        """`config`'s value of one of `options` (the declared default when it gives none)."""
        return config.decoder_options.get(name, cls.options[name].default)

    def predict(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return top1(logits, self.mask_id, self.config.temperature, self.generator)


def make_decoder(config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> Decoder:
    return decoder_class(config.decoder)(config, mask_id, generator)
