"""Masked diffusion (LLaDA, LLaDA-MoE, LLaDA2): component 2 of dInfer, the iteration manager that
composes model, decoder and KV-cache manager (docs/algorithms.md §1).

The run walks the blocks left to right and, per iteration, asks the cache manager for a forward,
hands the block's logits to the decoder (`Decoder.step`), applies its commits (and a revising
decoder's edits and remasks, §2.8), updates the smoothing embeddings (§3.1) and emits the step's
record (docs/trace.md §3). Host syncs, unrolling and early stop: §1.3-1.4, §3.2. Runtime costs
(compiles, all-reduces) are read through the model interface, so the loop knows nothing of the
runtime that wraps it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..cache import FULL, REFRESH, ForwardPlan, KVCacheManager, staleness
from ..config import GenerationConfig
from ..constraints import Restriction
from ..decoders import Block, DecodeResult, apply_decode, make_decoder, top_candidates
from ..errors import EngineError
from ..run import DiffusionRun, block_ranges, masked_canvas, sync
from ..system_options import SYSTEM_OPTIONS
from ..trace import CANDIDATES_MAX_BLOCK, EDIT, MASKED, REMASK, TOP_CANDIDATES, IterationRecord, Revision, candidate_lists, jsonable, positions, rounded
from .base import DiffusionKind, KindSettings, SHARED_SETTINGS, register_kind


@dataclass
class _Iteration:
    """What one iteration decided, for its record."""

    block_index: int
    span: tuple[int, int]
    plan: ForwardPlan
    threshold: float
    masked: torch.Tensor
    logits: torch.Tensor
    result: DecodeResult
    active: torch.Tensor
    before: torch.Tensor
    staleness: dict[str, torch.Tensor]
    seconds: float = 0.0
    # the constraint's part (engine/constraints/): what it removed from the model's logits, and
    # the writes it dropped
    restriction: Restriction | None = None
    model_logits: torch.Tensor | None = None
    dropped: torch.Tensor | None = None


class MaskedRun(DiffusionRun):
    """One masked-diffusion run; `run_blocks` is the loop."""

    kind = MASKED

    def setup(self, prompts: list[list[int]]) -> None:
        model, config = self.model, self.cfg
        lengths = [len(p) for p in prompts]
        x = masked_canvas(prompts, config.gen_length, model.mask_token_id, self.hooks.layouts, self.stop_ids[0])
        self.length = x.shape[1]
        self.decoder = make_decoder(config, model.mask_token_id, self.generator)
        self.begin(lengths, x, model.mask_token_id, self.decoder.capabilities())
        self.cache = KVCacheManager.for_model(model, config, self.length, model.prefix_store)
        self.embeds = model.embed(self.x) if config.smoothing else None
        self.revision_counts = torch.zeros(2, dtype=torch.long, device=self.device)  # edits, remasks
        self.refresh_active: torch.Tensor | None = None  # rows of a refresh whose step's next forward follows

    def _inputs(self, a: int, b: int) -> dict[str, torch.Tensor]:
        """The model's input for canvas range `[a, b)`: smoothed embeddings, or token ids."""
        return {"inputs_embeds": self.embeds[:, a:b]} if self.embeds is not None else {"input_ids": self.x[:, a:b]}

    # ---- the loop -----------------------------------------------------------------------------
    def run_blocks(self) -> None:
        cfg = self.cfg
        blocks = block_ranges(self.prompt_lengths, self.decoded_end, cfg.block_length, cfg.align_blocks)
        self.nfe += self.cache.prefill(self.model, blocks[0][0], self._inputs)
        for block_index, (s, e) in enumerate(blocks):
            self.decode_block(block_index, s, e)
            if e == self.decoded_end or (cfg.early_stop and self.stop_rows(s, e)):
                break
            forwards, syncs = self.cache.block_done(self.model, s, e, self._inputs)  # another block follows
            self.nfe, self.host_syncs = self.nfe + forwards, self.host_syncs + syncs
        self.stats_extra = dict(zip(("edits", "remasks"), self.revision_counts.tolist()))

    def decode_block(self, block_index: int, s: int, e: int) -> None:
        """Iterate until block `[s, e)` is done: one host sync per group of iterations.

        A guard on forwards (the block width plus the fixed decoder's steps plus the extra forwards
        the cache's schedule may add) turns a decoder that stops making progress into an error.
        """
        cfg = self.cfg
        self.decoder.block_init(self.x[:, s:e] == self.mask_id, block_index)
        guard = (e - s) + cfg.steps_per_block() + self.cache.extra_forwards + self.decoder.extra_forwards + cfg.max_unroll + 2
        forwards = 0
        while True:
            remaining = int((self.x[:, s:e] == self.mask_id).sum(dim=1).max())  # the host sync
            self.host_syncs += 1
            if not self.decoder.block_continues(remaining > 0):
                break
            self.check_cancel()
            group = self._group(remaining)
            for _ in range(group):
                self.iteration_call(block_index, s, e)
            forwards += group
            if forwards > guard:
                raise EngineError(f"block {block_index} still has masks after {forwards} forwards: decoder '{cfg.decoder}' made no progress")
        self.decoder.block_done(block_index)

    def _group(self, remaining: int) -> int:
        """Iterations queued per host check: unrolled, masks left / expected TPF; one for a
        revising decoder, which decides after each iteration whether its block goes on."""
        cfg = self.cfg
        if not cfg.unroll or self.decoder.revises:
            return 1
        return min(max(remaining // cfg.expected_tpf, 1), cfg.max_unroll)

    def iteration_call(self, block_index: int, s: int, e: int) -> None:
        """One call of dInfer's iteration (docs/algorithms.md §1.3): a refresh and its decode are
        followed, in the same call, by the next forward and its decode, so the block's mask check
        never falls between them and a block entry costs two forwards even when the refresh's decode
        completes it."""
        if self.iterate(block_index, s, e) == REFRESH:
            self.iterate(block_index, s, e)

    def iterate(self, block_index: int, s: int, e: int) -> str:
        """One iteration: one forward, one decode. Returns the forward's kind."""
        t0 = time.perf_counter()
        plan = self.cache.plan(self.iteration, block_index, s, e)
        threshold, weight = self._schedule()
        masked = self.x[:, s:e] == self.mask_id
        shadow = (s, e) if self.decoder.shadow_block else None
        out = self.metered(lambda: self.cache.forward(self.model, plan, block_index, masked=masked, shadow=shadow, **self._inputs(plan.start, plan.end)))
        logits = out.logits[:, s - plan.start : e - plan.start]
        probe_start = time.perf_counter()
        measured = self._staleness(plan, s, e, logits) if self.cfg.measure_staleness else {}
        probe_seconds = time.perf_counter() - probe_start
        self.excluded_seconds += probe_seconds
        current = self.x[:, s:e]
        editable = ~masked & (self.positions[:, s:e] >= self.prompt_end) & ~self.pinned[:, s:e] & ~self.finished.unsqueeze(1)
        model_logits, restriction, dropped = logits, None, None
        if self.constraint is not None:  # the decoder sees only tokens that keep the canvas completable
            logits, restriction = self.constraint.restrict(logits, self.x, self.x == self.mask_id, s, masked | editable if self.decoder.revises else masked)
        result = self.decoder.step(logits, Block(masked, current, editable, threshold, out.shadow_logits))
        if self.constraint is not None:
            dropped = self._admit(result, s)
        self.decoder.applied(result)
        if self.cfg.smoothing:
            result.extras["cont_weight"] = weight  # the w_t a viewer plots next to the threshold
        active = self._active(result, masked, plan)
        before = current.clone() if self.records and result.edit is not None else current
        self.x[:, s:e] = apply_decode(result, current, self.mask_id)
        if result.edit is not None:
            self.cache.revised(result.edit | result.remask)
            self.revision_counts += torch.stack([result.edit.sum(), result.remask.sum()])
        if self.embeds is not None:
            self._smooth(plan.start, plan.end, out.logits, weight)
        if self.records:
            step = _Iteration(block_index, (s, e), plan, threshold, masked, logits, result, active, before, measured, 0.0, restriction, model_logits, dropped)
            step.seconds = time.perf_counter() - t0 - probe_seconds
            self.emit(self._record(step), time.perf_counter())
        self.iteration += 1
        return plan.kind

    def _admit(self, result: DecodeResult, s: int) -> torch.Tensor:
        """Keep the decoder's fills, then its edits, each in the decoder's own order
        (`Decoder.commit_order`), while the canvas stays completable (its remasks only open
        positions, so they all stay); returns the writes dropped. A row's best fill is allowed by
        itself (the decoder chose it from restricted logits), so every row with a mask still fills."""
        writes = result.commit if result.edit is None else result.commit | result.edit
        order = self.decoder.commit_order(result).double()
        order = torch.where(result.commit, order + 1e6, order)  # fills first (orders are probabilities or entropies: far below 1e6)
        kept = self.constraint.admit(self.x, self.x == self.mask_id, s, writes, result.tokens, order, result.remask)
        result.commit, result.forced = result.commit & kept, result.forced & kept
        if result.edit is not None:
            result.edit = result.edit & kept
        return writes & ~kept

    def _schedule(self) -> tuple[float, float]:
        """(threshold, smoothing weight) for this iteration: dInfer's ramps on the request's iteration counter."""
        cfg, threshold, weight = self.cfg, self.cfg.threshold, 0.0
        if cfg.smoothing:
            weight = min(cfg.cont_weight_init + cfg.cont_weight_growth * self.iteration, cfg.cont_weight)
        if cfg.smoothing and cfg.cont_weight > 0:
            # The decay from 1.0 belongs to the soft iteration, which dInfer selects only when
            # cont_weight > 0 (docs/algorithms.md §3.1); at weight 0 the soft inputs are plain [MASK] embeddings.
            threshold = max(1.0 - self.iteration * cfg.threshold_decay, cfg.threshold)
        return threshold, weight

    def _active(self, result: DecodeResult, masked: torch.Tensor, plan: ForwardPlan) -> torch.Tensor:
        """`[B]`: the rows that took part in this iteration, as their solo runs would: those with a
        mask in the block (or those the decoder names), and those of the refresh this forward
        follows in the same step; never a row early stop has ended."""
        active = result.active if result.active is not None else masked.any(dim=1)
        if self.refresh_active is not None:
            active = active | self.refresh_active
        active = active & ~self.finished
        self.refresh_active = active if plan.kind == REFRESH else None
        return active

    def _smooth(self, a: int, b: int, logits: torch.Tensor, weight: float) -> None:
        """Still-masked positions in `[a, b)` get `E[M] + w * softmax(logits) @ W_e` (additive, as
        dInfer's h2e); everything else its plain embedding."""
        w_e = self.model.embedding_weight()
        ids = self.x[:, a:b]
        soft = w_e[self.mask_id] + weight * (torch.softmax(logits.float(), dim=-1).to(w_e.dtype) @ w_e)
        self.embeds[:, a:b] = torch.where((ids == self.mask_id).unsqueeze(-1), soft, self.model.embed(ids))

    def _final_until(self, s: int) -> list[int]:
        """Per row, the position before which its tokens are final: a revising decoder's commits
        are final when the loop leaves their block; any other's at once (the prefix up to the
        first mask after the prompt)."""
        if self.decoder.revises:
            return [s] * self.x.shape[0]
        return self.first_open()

    def _record(self, it: _Iteration) -> IterationRecord:
        s, e = it.span
        result = it.result
        candidates = top_candidates(it.logits, self.mask_id, TOP_CANDIDATES) if e - s <= CANDIDATES_MAX_BLOCK else None
        return IterationRecord(
            iteration=self.iteration,
            block=it.block_index,
            block_range=[s, e],
            forward=it.plan.kind,
            recomputed=[[it.plan.start, it.plan.end]],
            threshold=it.threshold if self.decoder.uses_threshold else None,
            committed=positions(result.commit, s),
            forced=positions(result.forced, s),
            top1=result.tokens.cpu().tolist(),
            confidence=rounded(result.confidence),
            seconds=it.seconds,
            extras={k: jsonable(v) for k, v in {**result.extras, **it.staleness}.items()},
            candidates=candidate_lists(candidates, it.masked) if candidates is not None else None,
            revisions=[[r.to_dict() for r in row] for row in self._revisions(result, it.before, s)] if self.decoder.revises else None,
            active=it.active.cpu().tolist(),
            final_until=self._final_until(s),
            constraint=it.restriction.record(it.model_logits, self.mask_id, it.dropped, s) if it.restriction is not None else None,
        )

    def _revisions(self, result: DecodeResult, current: torch.Tensor, s: int) -> list[list[Revision]]:
        """Per row, what `result` changes among committed positions, with the rule's numbers."""
        rows: list[list[Revision]] = [[] for _ in range(current.shape[0])]
        for kind, changed, new in ((EDIT, result.edit, result.tokens), (REMASK, result.remask, None)):
            if changed is None or kind not in result.revision_rules:
                continue
            rule, bound = result.revision_rules[kind]
            for row, w in changed.nonzero().tolist():
                rows[row].append(Revision(
                    position=s + w, old=int(current[row, w]), new=self.mask_id if new is None else int(new[row, w]),
                    kind=kind, rule=rule, score=float(result.revision_score[row, w]), bound=bound,
                ))
        return rows

    def _staleness(self, plan: ForwardPlan, s: int, e: int, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """KL(exact || this forward) and top-1 agreement per block position, against an uncached
        forward on the same input, for every forward that touches the cache (a refresh included,
        so its zero is measured too); a FULL forward is the exact one. Not counted in nfe."""
        if plan.kind == FULL:
            return {
                "staleness_kl": torch.zeros(logits.shape[:2], device=logits.device),
                "staleness_agree": torch.ones(logits.shape[:2], dtype=torch.bool, device=logits.device),
            }
        kl, agree = staleness(logits, self.cache.exact_logits(self.model, s, e, self._inputs), self.mask_id)
        sync(self.device)  # so the caller's timer, which excludes this probe, sees all of it
        return {"staleness_kl": kl, "staleness_agree": agree}

    def stop_rows(self, s: int, e: int) -> bool:
        """The skeleton's early stop; the end-of-text it filled feeds its plain embedding from now on."""
        done = super().stop_rows(s, e)
        if self.embeds is not None:
            self.embeds[:, e:] = torch.where(self.finished[:, None, None], self.model.embed(self.x[:, e:]), self.embeds[:, e:])
        return done


@register_kind
class MaskedKind(DiffusionKind):
    """Masked diffusion reads every generation setting (another kind's own are that kind's
    `options`), and runs with every system option."""

    name = MASKED
    run = MaskedRun
    summary = "a block's masks are committed over several forwards, as the decoder's rule says"
    settings = KindSettings(
        reads=frozenset(f for f in GenerationConfig.__dataclass_fields__ if f not in SHARED_SETTINGS),
        default_decoder=GenerationConfig.decoder,
        system_options=frozenset(SYSTEM_OPTIONS),
    )
