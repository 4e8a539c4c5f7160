"""GenerationConfig: every generation setting, validated in one place."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from .errors import EngineError

CACHE_MODES = ("none", "prefix", "dual", "vicinity")
REMASKING = ("low_confidence", "random")
ANCHORS = ("confidence", "centre")


_TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}


@dataclass
class GenerationConfig:
    """Settings of one generate call. Defaults follow dInfer's scripts where they apply.

    `steps` is LLaDA's total step count over the generation (fixed decoder only); None means one
    token per step (`steps = gen_length`).
    """

    gen_length: int = 64
    block_length: int = 32
    decoder: str = "threshold"
    threshold: float = 0.9
    steps: int | None = None
    remasking: str = "low_confidence"
    temperature: float = 0.0
    seed: int = 0
    # hierarchical decoder
    low_threshold: float = 0.6
    anchor: str = "confidence"
    # credit decoder (CreditDecoding defaults)
    credit_alpha: float = 0.7
    credit_beta: float = 0.8
    credit_gamma: float = 0.2
    # factor decoder (Fast-dLLM)
    factor: float = 1.0
    # KV cache
    cache: str = "none"
    prefix_look: int = 16
    after_look: int = 16
    warmup: int = 4
    refresh_every: int | None = None
    persist_window: bool = False
    measure_staleness: bool = False
    # iteration smoothing
    smoothing: bool = False
    cont_weight: float = 0.3
    cont_weight_init: float = 0.15
    cont_weight_growth: float = 0.02
    threshold_decay: float = 0.02
    # loop unrolling: queue clamp(masks // expected_tpf, 1, max_unroll) iterations per host check
    unroll: bool = False
    expected_tpf: int = 4
    max_unroll: int = 8
    # schedule
    align_blocks: bool = True
    early_stop: bool = True
    use_chat_template: bool = True

    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.gen_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GenerationConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineError(f"unknown generation setting(s): {', '.join(unknown)}")
        return cls(**data).validate()

    def replace(self, **changes: Any) -> "GenerationConfig":
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> "GenerationConfig":
        """Check every rule; raise EngineError with a message naming the setting."""
        from .decoders import decoder_names  # the registry lives with the decoders

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise EngineError(message)

        self._check_types()
        need(0 <= self.seed <= 2**63 - 1, f"seed must be in 0..2**63-1, got {self.seed}")
        need(self.gen_length >= 1, f"gen_length must be positive, got {self.gen_length}")
        need(self.block_length >= 1, f"block_length must be positive, got {self.block_length}")
        need(
            self.gen_length % self.block_length == 0,
            f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})",
        )
        need(self.decoder in decoder_names(), f"unknown decoder '{self.decoder}'; choose from {', '.join(decoder_names())}")
        need(0.0 < self.threshold <= 1.0, f"threshold must be in (0, 1], got {self.threshold}")
        need(0.0 <= self.low_threshold <= 1.0, f"low_threshold must be in [0, 1], got {self.low_threshold}")
        need(self.anchor in ANCHORS, f"unknown anchor '{self.anchor}'; choose from {', '.join(ANCHORS)}")
        need(self.remasking in REMASKING, f"unknown remasking '{self.remasking}'; choose from {', '.join(REMASKING)}")
        need(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        steps = self.total_steps()
        need(
            steps >= self.num_blocks() and steps % self.num_blocks() == 0,
            f"steps ({steps}) must be a positive multiple of the number of blocks ({self.num_blocks()})",
        )
        need(self.cache in CACHE_MODES, f"unknown cache mode '{self.cache}'; choose from {', '.join(CACHE_MODES)}")
        need(min(self.prefix_look, self.after_look, self.warmup) >= 0, "prefix_look, after_look and warmup must be >= 0")
        need(self.refresh_every is None or self.refresh_every >= 1, "refresh_every must be >= 1")
        need(0.0 <= self.cont_weight <= 1.0, f"cont_weight must be in [0, 1], got {self.cont_weight}")
        need(self.expected_tpf >= 1 and self.max_unroll >= 1, "expected_tpf and max_unroll must be >= 1")
        need(
            0.0 < self.credit_beta <= 1.0 and self.credit_alpha >= 0.0 and self.credit_gamma >= 0.0,
            "credit_beta must be in (0, 1], credit_alpha and credit_gamma >= 0",
        )
        need(self.factor > 0.0, f"factor must be positive, got {self.factor}")
        need(
            0.0 <= self.cont_weight_init <= 1.0 and 0.0 <= self.cont_weight_growth <= 1.0,
            "cont_weight_init and cont_weight_growth must be in [0, 1]",
        )
        need(0.0 <= self.threshold_decay <= 1.0, f"threshold_decay must be in [0, 1], got {self.threshold_decay}")
        return self

    def _check_types(self) -> None:
        """Every field of its declared type (int for float is fine), floats finite: a JSON or
        Python caller gets an EngineError naming the field, never a TypeError from deep inside."""
        hints = typing.get_type_hints(GenerationConfig)
        for f in dataclasses.fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            allowed = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
            if value is None and type(None) in typing.get_args(hint):
                continue
            base = allowed[0]
            ok = (
                isinstance(value, bool) if base is bool
                else isinstance(value, int) and not isinstance(value, bool) if base is int
                else isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) if base is float
                else isinstance(value, base)
            )
            if not ok:
                raise EngineError(f"{f.name} must be {_TYPE_NAMES.get(base, base.__name__)}, got {str(value)[:40]!r}")
