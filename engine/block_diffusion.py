"""Block diffusion for block-causal models (LLaDA2; docs/algorithms.md §5, §4.4, §8 items 9-10).

The model was trained with block-causal attention: a token in block `i` sees every token of
blocks `<= i` (bidirectionally inside its own block) and nothing after. Blocks are the absolute
ones, `[k·L_b, (k+1)·L_b)` from position 0, so the attention pattern matches training whatever
the prompt length; decoding starts at the block holding the shortest prompt's end.

Two paths, chosen by `config.cache`:
- `"prefix"`: the exact prefix cache. A store `[n_layers, 2, B, H_kv, N, D]` holds the post-RoPE
  K/V of every finished position `[0, s)`; each iteration feeds only the block `[s, e)`, which
  attends to the store's `[0, s)` and to itself. The store's unused slots `[e, N)` are masked
  out of the attention (dInfer's SGLang path zero-pads them instead, which skews the softmax).
  A prefill forward fills `[0, s)` of the first block; after a block finishes, one more forward
  on its final tokens writes that block's K/V, unless the last forward already saw them
  (an unrolled no-op on the finished block). Since earlier blocks never attend to later ones,
  every cached logit is exact.
- `"none"`: the attention-mask reference (dInfer's `BlockDiffusionLLMAttnmask`): each iteration
  runs the model on `[0, e)` under the block-causal mask. Slow, exact, and the oracle the cached
  path is tested against, token for token.

The canvas, decoders, smoothing, trace, early stop and counting are the iteration manager's; this
module changes only which forwards run. Unlike dInfer, the canvas is not rounded up to whole
blocks: it ends at `P_max + gen_length` and the last block may be shorter, as in engine.iteration.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import torch

from .cache import FULL, PREFIX, ForwardPlan, staleness
from .config import GenerationConfig
from .errors import EngineError
from .iteration import GenerationOutput, _Request, _sync
from .models.base import DiffusionLM
from .trace import IterationRecord

CACHE_MODES = ("none", "prefix")


def block_causal_mask(length: int, block_length: int, device: torch.device) -> torch.Tensor:
    """`[length, length]` boolean, True where query `i` may attend to key `j` (block(j) <= block(i))."""
    block = torch.arange(length, device=device) // block_length
    return block.unsqueeze(1) >= block.unsqueeze(0)


class BlockDiffusionRequest(_Request):
    """One generate call on a block-causal model: the iteration manager's request with its own
    loop and forwards (see the module docstring)."""

    def __init__(
        self,
        model: DiffusionLM,
        prompts: list[list[int]],
        config: GenerationConfig,
        stop_ids: list[int],
        record: bool,
        on_iteration: Callable[[IterationRecord], None] | None,
        cancel: threading.Event | None,
    ) -> None:
        if config.cache not in CACHE_MODES:
            raise EngineError(
                f"cache '{config.cache}' does not apply to a block-causal model; use 'prefix' (exact) or 'none'"
            )
        if not config.align_blocks:
            raise EngineError("a block-causal model decodes whole aligned blocks: align_blocks must stay on")
        super().__init__(model, prompts, config, stop_ids, record, on_iteration, cancel)
        self.cached = config.cache == "prefix"
        self.mask = block_causal_mask(self.length, config.block_length, self.device)
        self.positions = torch.arange(self.length, device=self.device)
        self.store: torch.Tensor | None = None
        # the K/V of the last cached forward and whether its input still held a mask (docs/algorithms.md §8 item 10)
        self.last_kv: torch.Tensor | None = None
        self.last_input_masked: torch.Tensor | None = None

    def _inputs(self, a: int, b: int) -> dict[str, torch.Tensor]:
        if self.embeds is not None:
            return {"inputs_embeds": self.embeds[:, a:b]}
        return {"input_ids": self.x[:, a:b]}

    def _exact_forward(self, e: int, use_cache: bool = False):
        """The reference forward: canvas `[0, e)` under the block-causal mask."""
        return self.model(**self._inputs(0, e), attention_mask=self.mask[:e, :e], use_cache=use_cache)

    def _cached_forward(self, s: int, e: int):
        """Block `[s, e)` against the store's `[0, s)`; keys from `e` on are masked out."""
        if self.store is None:  # the first block starts at 0: no prefix, nothing to mask
            return self.model(**self._inputs(s, e), replace=(s, e), use_cache=True)
        keys = (self.positions < e).view(1, 1, 1, -1)
        return self.model(**self._inputs(s, e), past_kv=self.store, replace=(s, e), attention_mask=keys, use_cache=True)

    def _write(self, kv: torch.Tensor, s: int, e: int) -> None:
        if self.store is None:
            self.store = kv.new_zeros(*kv.shape[:4], self.length, kv.shape[5])
        self.store[:, :, :, :, s:e] = kv

    # ---- one iteration: one forward, one decode -------------------------------------------
    def step(self, block_index: int, s: int, e: int) -> None:
        cfg = self.cfg
        threshold, weight = cfg.threshold, 0.0
        if cfg.smoothing:  # the same ramps as engine.iteration
            weight = min(cfg.cont_weight_init + cfg.cont_weight_growth * self.iteration, cfg.cont_weight)
        if cfg.smoothing and cfg.cont_weight > 0:
            threshold = max(1.0 - self.iteration * cfg.threshold_decay, cfg.threshold)
        t0 = time.perf_counter()
        masked = self.x[:, s:e] == self.mask_id
        if self.cached:
            plan = ForwardPlan(PREFIX, s, e)
            out = self._cached_forward(s, e)
            self.last_kv, self.last_input_masked = out.kv, masked.any()
            logits = out.logits
        else:
            plan = ForwardPlan(FULL, 0, e)
            out = self._exact_forward(e)
            logits = out.logits[:, s:e]
        self.nfe += 1
        probe_start = time.perf_counter()
        measured = self._staleness(plan, s, e, logits) if cfg.measure_staleness else {}
        probe_seconds = time.perf_counter() - probe_start
        self.excluded_seconds += probe_seconds
        result = self.decoder.decode(logits, masked, threshold)
        if cfg.smoothing:
            result.extras["cont_weight"] = weight
        self.x[:, s:e] = torch.where(result.commit, result.tokens, self.x[:, s:e])
        if self.embeds is not None:
            self._smooth(plan.start, plan.end, out.logits, weight)
        if self.recorder is not None:
            _sync(self.device)
            self._record(block_index, s, e, plan, threshold, result, time.perf_counter() - t0 - probe_seconds, measured)
        self.iteration += 1

    def _staleness(self, plan: ForwardPlan, s: int, e: int, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The cached forward against the masked reference: KL zero up to rounding, by design."""
        if plan.kind == FULL:
            return super()._staleness(plan, s, e, logits)
        kl, agree = staleness(logits, self._exact_forward(e).logits[:, s:e], self.mask_id)
        _sync(self.device)
        return {"staleness_kl": kl, "staleness_agree": agree}

    def _finish_block(self, s: int, e: int) -> None:
        """Write the finished block's K/V, computed from its final tokens, into the store."""
        stale = self.last_kv is None or bool(self.last_input_masked)
        self.host_syncs += 1
        if stale:
            self.last_kv = self._cached_forward(s, e).kv
            self.nfe += 1
        self._write(self.last_kv, s, e)
        self.last_kv = self.last_input_masked = None

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> GenerationOutput:
        cfg = self.cfg
        start = time.perf_counter()
        first = min(self.prompt_lengths) // cfg.block_length * cfg.block_length
        blocks = [(s, min(s + cfg.block_length, self.length)) for s in range(first, self.length, cfg.block_length)]
        if self.cached and first > 0:  # prefill: the K/V of every block before the first decoded one
            self._write(self._exact_forward(first, use_cache=True).kv, 0, first)
            self.nfe += 1
        finished = torch.zeros(self.x.shape[0], dtype=torch.bool, device=self.device)
        for block_index, (s, e) in enumerate(blocks):
            self.decode_block(block_index, s, e)
            if e == self.length:
                break
            if cfg.early_stop and self.stop_rows(s, e, finished):
                break
            if self.cached:  # only when another block follows: the last block's K/V are never read
                self._finish_block(s, e)
        return self.output(start)
