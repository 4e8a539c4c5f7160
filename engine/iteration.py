"""Component 2, the diffusion iteration manager: the loop that composes model, decoder and cache.

It owns the canvas `x` `[B, N]` (prompt, then [MASK] up to `P_max + gen_length`; shorter prompts
are right-padded with [MASK] and generate from their own end, algorithms.md §5.4), walks the
blocks left to right, and per iteration: asks the cache manager which forward to run, calls the
model (on token ids, or on smoothed embeddings), hands the block's logits to the decoder, writes
the commits, updates the smoothing embeddings and records the trace. Early stop fills every
block after one that holds an EOS/EoT with EOS.

Host syncs: one per group of iterations (the "any mask left in this block?" check) and one per
block (early stop). With `unroll`, a group is `clamp(masks // expected_tpf, 1, max_unroll)`
iterations queued back to back; iterations on a finished block are no-ops but still forwards,
counted in `nfe` as dInfer counts them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .cache import FULL, REFRESH, ForwardPlan, KVCacheManager
from .config import GenerationConfig
from .decoders import DecodeResult, make_decoder
from .errors import EngineError
from .models.base import DiffusionLM
from .stats import GenerationStats, count_tokens, generated_mask
from .trace import IterationRecord, Trace, TraceRecorder


class GenerationCancelled(EngineError):
    """Raised between iterations when the caller's cancel event is set."""


@dataclass
class GenerationOutput:
    canvas: torch.Tensor
    prompt_lengths: list[int]
    token_ids: list[list[int]]
    stats: GenerationStats
    trace: Trace | None


def block_ranges(prompt_lengths: list[int], canvas_length: int, block_length: int, align: bool) -> list[tuple[int, int]]:
    """Blocks `[s, e)` from the shortest prompt's end (floored to a multiple of the block length
    when aligned) to the canvas end; the last may be shorter."""
    first = min(prompt_lengths)
    if align:
        first = first // block_length * block_length
    return [(s, min(s + block_length, canvas_length)) for s in range(first, canvas_length, block_length)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Request:
    """State of one generate call; `run` is the loop."""

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
        self.model, self.cfg, self.stop_ids = model, config, stop_ids
        self.device = model.device
        self.mask_id = model.mask_token_id
        self.prompt_lengths = [len(p) for p in prompts]
        self.length = max(self.prompt_lengths) + config.gen_length
        x = torch.full((len(prompts), self.length), self.mask_id, dtype=torch.long)
        for row, p in enumerate(prompts):
            x[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        self.x = x.to(self.device)
        self.generator = torch.Generator(self.device).manual_seed(config.seed)
        self.decoder = make_decoder(config, self.mask_id, self.generator)
        self.cache = KVCacheManager(config, self.length)
        self.embeds = model.embed(self.x) if config.smoothing else None
        self.nfe = 0
        self.iteration = 0
        self.excluded_seconds = 0.0  # trace recording, staleness probes, callbacks
        self.on_iteration, self.cancel = on_iteration, cancel
        self.trace: Trace | None = None
        self.recorder: TraceRecorder | None = None
        if record:
            self.trace = Trace(
                model=getattr(model, "name_or_path", type(model).__name__),
                mask_id=self.mask_id,
                eos_ids=list(stop_ids),
                prompt_lengths=self.prompt_lengths,
                canvas_length=self.length,
                block_length=config.block_length,
                config=config.to_dict(),
                initial=self.x.cpu().tolist(),
            )
            self.recorder = TraceRecorder(self.trace)

    # ---- one iteration: one forward, one decode -------------------------------------------
    def step(self, block_index: int, s: int, e: int) -> None:
        cfg = self.cfg
        plan = self.cache.plan(self.iteration, block_index, s, e)
        threshold, weight = cfg.threshold, 0.0
        if cfg.smoothing:  # dInfer's ramps, on the per-request iteration counter
            weight = min(cfg.cont_weight_init + cfg.cont_weight_growth * self.iteration, cfg.cont_weight)
            threshold = max(1.0 - self.iteration * cfg.threshold_decay, cfg.threshold)
        t0 = time.perf_counter()
        a, b = plan.start, plan.end
        inputs = {"inputs_embeds": self.embeds[:, a:b]} if self.embeds is not None else {"input_ids": self.x[:, a:b]}
        out = self.model(
            **inputs,
            past_kv=self.cache.past(plan),
            replace=(a, b) if plan.uses_cache else None,
            use_cache=self.cache.wants_kv(plan),
        )
        self.nfe += 1
        logits = out.logits[:, s - a : e - a]
        staleness = self._staleness(plan, s, e, logits) if cfg.measure_staleness else {}
        masked = self.x[:, s:e] == self.mask_id
        result = self.decoder.decode(logits, masked, threshold)
        self.x[:, s:e] = torch.where(result.commit, result.tokens, self.x[:, s:e])
        self.cache.update(plan, block_index, out.kv)
        if self.embeds is not None:
            self._smooth(a, b, out.logits, weight)
        if self.recorder is not None:
            _sync(self.device)
            seconds = time.perf_counter() - t0
            self._record(block_index, s, e, plan, threshold, result, seconds, staleness)
        self.iteration += 1

    def _smooth(self, a: int, b: int, logits: torch.Tensor, weight: float) -> None:
        """Still-masked positions in `[a, b)` get `E[M] + w * softmax(logits) @ W_e` (additive, as
        dInfer's h2e); everything else its plain embedding."""
        w_e = self.model.embedding_weight()
        ids = self.x[:, a:b]
        soft = w_e[self.mask_id] + weight * (torch.softmax(logits.float(), dim=-1).to(w_e.dtype) @ w_e)
        self.embeds[:, a:b] = torch.where((ids == self.mask_id).unsqueeze(-1), soft, self.model.embed(ids))

    def _record(
        self,
        block_index: int,
        s: int,
        e: int,
        plan: ForwardPlan,
        threshold: float,
        result: DecodeResult,
        seconds: float,
        staleness: dict[str, torch.Tensor],
    ) -> None:
        t0 = time.perf_counter()
        extras = {**result.extras, **staleness}
        rec = self.recorder.record(
            iteration=self.iteration,
            block=block_index,
            block_range=(s, e),
            forward=plan.kind,
            recomputed=[(plan.start, plan.end)],
            threshold=None if self.cfg.decoder == "fixed" else threshold,
            commit=result.commit,
            forced=result.forced,
            tokens=result.tokens,
            confidence=result.confidence,
            seconds=seconds,
            extras=extras,
        )
        if self.on_iteration is not None:
            self.on_iteration(rec)
        self.excluded_seconds += time.perf_counter() - t0

    def _staleness(self, plan: ForwardPlan, s: int, e: int, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """KL(exact || cached) and top-1 agreement per block position, against an exact (uncached)
        forward on the same input; zero on forwards that were exact. Not counted in nfe or seconds."""
        t0 = time.perf_counter()
        if plan.kind in (FULL, REFRESH):
            kl = torch.zeros(logits.shape[:2], device=logits.device)
            agree = torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device)
        else:
            inputs = {"inputs_embeds": self.embeds} if self.embeds is not None else {"input_ids": self.x}
            exact = self.model(**inputs).logits[:, s:e].float()
            exact[..., self.mask_id] = float("-inf")
            cached = logits.float().clone()
            cached[..., self.mask_id] = float("-inf")
            log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(cached, -1)
            kl = (log_p.exp() * (log_p - log_q)).nan_to_num(0.0).sum(-1).clamp_min(0.0)
            agree = exact.argmax(-1) == cached.argmax(-1)
        self.excluded_seconds += time.perf_counter() - t0
        return {"staleness_kl": kl, "staleness_agree": agree}

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> GenerationOutput:
        cfg = self.cfg
        start = time.perf_counter()
        blocks = block_ranges(self.prompt_lengths, self.length, cfg.block_length, cfg.align_blocks)
        prompt_len = torch.tensor(self.prompt_lengths, device=self.device).unsqueeze(1)
        stop = torch.tensor(self.stop_ids, device=self.device)
        finished = torch.zeros(self.x.shape[0], dtype=torch.bool, device=self.device)
        steps_per_block = cfg.total_steps() // cfg.num_blocks()
        for block_index, (s, e) in enumerate(blocks):
            self.decoder.block_init(self.x[:, s:e] == self.mask_id, block_index)
            guard = (e - s) + steps_per_block + cfg.warmup + cfg.max_unroll + 2
            forwards = 0
            while True:
                remaining = int((self.x[:, s:e] == self.mask_id).sum(dim=1).max())  # the host sync
                if remaining == 0:
                    break
                if self.cancel is not None and self.cancel.is_set():
                    raise GenerationCancelled("generation cancelled")
                group = min(max(remaining // cfg.expected_tpf, 1), cfg.max_unroll) if cfg.unroll else 1
                for _ in range(group):
                    self.step(block_index, s, e)
                forwards += group
                if forwards > guard:
                    raise EngineError(
                        f"block {block_index} still has masks after {forwards} forwards: decoder '{cfg.decoder}' made no progress"
                    )
            self.decoder.block_done(block_index)
            if cfg.early_stop and e < self.length:
                positions = torch.arange(s, e, device=self.device).unsqueeze(0)
                generated = positions >= prompt_len
                finished |= (torch.isin(self.x[:, s:e], stop) & generated).any(dim=1)
                self.x[:, e:] = torch.where(finished.unsqueeze(1), torch.full_like(self.x[:, e:], self.stop_ids[0]), self.x[:, e:])
                if bool(finished.all()):
                    break
        keep = generated_mask(self.x, self.prompt_lengths, self.stop_ids, self.mask_id)
        token_ids = [row[k].tolist() for row, k in zip(self.x.cpu(), keep.cpu())]
        _sync(self.device)
        elapsed = time.perf_counter() - start - self.excluded_seconds
        stats = GenerationStats(
            nfe=self.nfe,
            tokens=sum(count_tokens(self.x, self.prompt_lengths, self.stop_ids, self.mask_id)),
            seconds=elapsed,
            batch=self.x.shape[0],
            trace_seconds=self.excluded_seconds,
        )
        if self.trace is not None:
            self.trace.final = self.x.cpu().tolist()
            self.trace.stats = stats.to_dict()
            self.trace.trace_seconds = self.excluded_seconds
        return GenerationOutput(self.x, self.prompt_lengths, token_ids, stats, self.trace)


@torch.inference_mode()
def generate(
    model: DiffusionLM,
    prompts: list[list[int]],
    config: GenerationConfig,
    *,
    stop_ids: list[int] | None = None,
    trace: bool = False,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    cancel: threading.Event | None = None,
) -> GenerationOutput:
    """Generate for a batch of tokenised prompts.

    `stop_ids`: the ids that end a row (EOS first, then EoT); defaults to the model's EOS.
    `trace`: record one IterationRecord per iteration (`on_iteration` is called with each).
    `cancel`: checked between groups of iterations; when set, GenerationCancelled is raised.
    """
    config.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise EngineError("empty prompt")
    stop_ids = stop_ids or [model.eos_token_id]
    request = _Request(model, prompts, config, stop_ids, trace or on_iteration is not None, on_iteration, cancel)
    return request.run()
