"""Component 2, the diffusion iteration manager: the masked-diffusion loop that composes model,
decoder and KV-cache manager (docs/algorithms.md §1).

`_MaskedRun` owns the canvas, walks the blocks left to right and, per iteration, asks the cache
manager for a forward, runs the model, hands the block's logits to the decoder, applies its
commits (and a revising decoder's edits and remasks, §2.8), updates the smoothing embeddings (§3.1)
and records the trace (docs/trace.md). Host syncs, unrolling and early stop: §1.3-1.4, §3.2;
what the stats count: docs/counting.md. Runtime costs (compiles, all-reduces) are read through the
model interface, so the loop knows nothing of the runtime that wraps it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .cache import FULL, REFRESH, ForwardPlan, KVCacheManager, staleness
from .config import GenerationConfig
from .decoders import DecodeResult, apply_decode, make_decoder, top_candidates
from .errors import EngineError
from .hooks import CancelFlag, RunHooks
from .models.base import DiffusionLM, ForwardCounters
from .stats import GenerationStats, count_tokens, generated_mask
from .trace import CANDIDATES_MAX_BLOCK, EDIT, REMASK, TOP_CANDIDATES, Revision, Trace


class GenerationCancelled(EngineError):
    """Raised between iterations, or between layers inside a forward, when the caller's cancel event is set."""


@contextlib.contextmanager
def cancel_between_layers(model: DiffusionLM, cancel: CancelFlag | None) -> Iterator[None]:
    """Check `cancel` before every layer of every forward, so that Stop ends even one long forward
    (a long canvas on a CPU) within one layer's time rather than at the next iteration."""
    if cancel is None:
        yield
        return

    def check(module: torch.nn.Module, args: object) -> None:
        if cancel.is_set():
            raise GenerationCancelled("generation cancelled")

    handles = [layer.register_forward_pre_hook(check) for layer in model.layer_modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def check_request(model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, max_tokens: int | None = None) -> None:
    """Everything generate refuses before any forward: an invalid config, an empty prompt, a canvas
    too long. Reads only the model's config, so a model skeleton (no weights) can answer it."""
    config.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise EngineError("empty prompt")
    check_canvas(model, prompts, config, max_tokens)


def check_canvas(model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, max_tokens: int | None = None) -> None:
    """Refuse, before any forward, a canvas longer than the model's positions or the caller's limit."""
    canvas = max(len(p) for p in prompts) + config.gen_length
    limits = [(limit, why) for limit, why in ((model.max_positions, "the model's max_sequence_length"), (max_tokens, "this server's --max-tokens")) if limit]
    for limit, why in limits:
        if canvas > limit:
            raise EngineError(
                f"the canvas (prompt {max(len(p) for p in prompts)} + gen_length {config.gen_length} = {canvas} tokens) "
                f"exceeds {why} ({limit}); shorten the prompt or the generation length"
            )


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


@dataclass(frozen=True)
class _Meter:
    """The model's running totals at one moment: its compile/graph counters and this process's
    time in all-reduces, read through the model interface (zero for a plain model)."""

    counters: ForwardCounters
    comm_seconds: float

    @classmethod
    def read(cls, model: DiffusionLM) -> "_Meter":
        return cls(model.forward_counters(), model.comm_seconds())


def forward_cost(forward_seconds: float, since: ForwardCounters, comm_seconds: float) -> dict[str, Any]:
    """An IterationRecord's `cost` (docs/trace.md §3): one process's entry in the per-rank lists
    (engine/runtime/workers.py appends the other ranks'), and what its forward compiled or replayed. Compute
    is the forward's wall time less its all-reduces and its compiling (floored at 0: a forward that
    compiled also counted its all-reduces)."""
    compute = max(0.0, forward_seconds - comm_seconds - since.compile_seconds)
    return {
        "compute_seconds": [compute],
        "comm_seconds": [comm_seconds],
        "compile_seconds": since.compile_seconds,
        "compiles": since.compiles,
        "captures": since.captures,
        "graph_replay": since.replays > 0,
    }


class _MaskedRun:
    """State of one masked-diffusion run; `run` is the loop."""

    def __init__(self, model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks) -> None:
        self.model, self.cfg, self.stop_ids, self.hooks = model, config, stop_ids, hooks
        self.device = model.device
        self.mask_id = model.mask_token_id
        self.prompt_lengths = [len(p) for p in prompts]
        self.length = max(self.prompt_lengths) + config.gen_length
        self.cache = KVCacheManager.for_model(model, config, self.length)
        x = torch.full((len(prompts), self.length), self.mask_id, dtype=torch.long)
        for row, p in enumerate(prompts):
            x[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        self.x = x.to(self.device)
        self.generator = torch.Generator(self.device).manual_seed(config.seed)
        self.decoder = make_decoder(config, self.mask_id, self.generator)
        self.embeds = model.embed(self.x) if config.smoothing else None
        self.nfe = 0
        self.revision_counts = torch.zeros(2, dtype=torch.long, device=self.device)  # edits, remasks
        self.iteration = 0
        self.host_syncs = 0
        self.excluded_seconds = 0.0  # trace recording, staleness probes, callbacks
        self.recorder = hooks.begin_trace(
            model, config, mask_id=self.mask_id, stop_ids=stop_ids, prompt_lengths=self.prompt_lengths,
            canvas_length=self.length, block_length=config.block_length, initial=self.x.cpu().tolist(),
        )
        self.trace: Trace | None = self.recorder.trace if self.recorder is not None else None

    def _inputs(self, a: int, b: int) -> dict[str, torch.Tensor]:
        """The model's input for canvas range `[a, b)`: smoothed embeddings, or token ids."""
        return {"inputs_embeds": self.embeds[:, a:b]} if self.embeds is not None else {"input_ids": self.x[:, a:b]}

    # ---- one step: one iteration, or a refresh and the iteration after it ---------------------
    def step(self, block_index: int, s: int, e: int) -> None:
        """One call of dInfer's iteration (docs/algorithms.md §1.3): a refresh and its decode are followed, in the same
        call, by the next forward and its decode, so the block's mask check never falls between
        them and a block entry costs two forwards even when the refresh's decode completes it."""
        if self._iterate(block_index, s, e) == REFRESH:
            self._iterate(block_index, s, e)

    def _iterate(self, block_index: int, s: int, e: int) -> str:
        """One iteration: one forward, one decode. Returns the forward's kind."""
        cfg = self.cfg
        plan = self.cache.plan(self.iteration, block_index, s, e)
        threshold, weight = cfg.threshold, 0.0
        if cfg.smoothing:  # dInfer's ramps, on the per-request iteration counter
            weight = min(cfg.cont_weight_init + cfg.cont_weight_growth * self.iteration, cfg.cont_weight)
        if cfg.smoothing and cfg.cont_weight > 0:
            # The decay from 1.0 belongs to the soft iteration, which dInfer selects only when
            # cont_weight > 0 (docs/algorithms.md §3.1); at weight 0 the soft inputs are plain [MASK] embeddings.
            threshold = max(1.0 - self.iteration * cfg.threshold_decay, cfg.threshold)
        t0 = time.perf_counter()
        a, b = plan.start, plan.end
        masked = self.x[:, s:e] == self.mask_id
        meter = _Meter.read(self.model) if self.recorder is not None else None
        forward_start = time.perf_counter()
        if self.decoder.own_forward:
            out = self.decoder.forward(self.model, self._inputs(a, b), s, e)
        else:
            out = self.cache.forward(self.model, plan, block_index, masked=masked, **self._inputs(a, b))
        cost = self._cost(meter, forward_start) if meter is not None else None
        self.nfe += 1
        logits = out.logits[:, s - a : e - a]
        probe_start = time.perf_counter()
        measured = self._staleness(plan, s, e, logits) if cfg.measure_staleness else {}
        probe_seconds = time.perf_counter() - probe_start
        self.excluded_seconds += probe_seconds
        current = self.x[:, s:e]
        if self.decoder.revises:
            result = self.decoder.revise(logits, masked, threshold, current, ~masked & self._generated(s, e))
        else:
            result = self.decoder.decode(logits, masked, threshold)
        if cfg.smoothing:
            result.extras["cont_weight"] = weight  # the w_t a viewer plots next to the threshold
        revisions = self._revisions(result, current, s) if self.recorder is not None and self.decoder.revises else None
        self.x[:, s:e] = apply_decode(result, current, self.mask_id)
        if self.decoder.revises:
            self.cache.revised(result.edit | result.remask)
            self.revision_counts += torch.stack([result.edit.sum(), result.remask.sum()])
        if self.embeds is not None:
            self._smooth(a, b, out.logits, weight)
        if self.recorder is not None:
            _sync(self.device)
            seconds = time.perf_counter() - t0 - probe_seconds
            self._record(block_index, (s, e), plan, threshold, result, seconds, measured, cost, logits, masked, revisions)
        self.iteration += 1
        return plan.kind

    def _cost(self, before: _Meter, start: float) -> dict[str, Any]:
        """The cost of the forward begun at `start` (a device sync, so only when recording)."""
        _sync(self.device)
        seconds = time.perf_counter() - start
        after = _Meter.read(self.model)
        return forward_cost(seconds, after.counters.since(before.counters), after.comm_seconds - before.comm_seconds)

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
        block_range: tuple[int, int],
        plan: ForwardPlan,
        threshold: float,
        result: DecodeResult,
        seconds: float,
        staleness: dict[str, torch.Tensor],
        cost: dict[str, Any] | None,
        logits: torch.Tensor,
        masked: torch.Tensor,
        revisions: list[list[Revision]] | None,
    ) -> None:
        t0 = time.perf_counter()
        s, e = block_range
        candidates = top_candidates(logits, self.mask_id, TOP_CANDIDATES) if e - s <= CANDIDATES_MAX_BLOCK else None
        rec = self.recorder.record(
            self.iteration, block_index, block_range, plan, result,
            threshold=threshold if self.decoder.uses_threshold else None,
            seconds=seconds, staleness=staleness, cost=cost, candidates=candidates, masked=masked, revisions=revisions,
        )
        if self.hooks.on_iteration is not None:
            self.hooks.on_iteration(rec)
        self.excluded_seconds += time.perf_counter() - t0

    def _generated(self, s: int, e: int) -> torch.Tensor:
        """`[B, e - s]`: the block positions each row generates (after its prompt)."""
        positions = torch.arange(s, e, device=self.device).unsqueeze(0)
        return positions >= torch.tensor(self.prompt_lengths, device=self.device).unsqueeze(1)

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
        _sync(self.device)  # so the caller's timer, which excludes this probe, sees all of it
        return {"staleness_kl": kl, "staleness_agree": agree}

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> GenerationOutput:
        cfg = self.cfg
        if self.hooks.on_start is not None and self.recorder is not None:  # before the clock starts
            self.hooks.on_start(self.recorder.header())
        meter = _Meter.read(self.model)
        start = time.perf_counter()
        blocks = block_ranges(self.prompt_lengths, self.length, cfg.block_length, cfg.align_blocks)
        self.nfe += self.cache.prefill(self.model, blocks[0][0], self._inputs)
        finished = torch.zeros(self.x.shape[0], dtype=torch.bool, device=self.device)
        for block_index, (s, e) in enumerate(blocks):
            self.decode_block(block_index, s, e)
            if e == self.length or (cfg.early_stop and self.stop_rows(s, e, finished)):
                break
            forwards, syncs = self.cache.block_done(self.model, s, e, self._inputs)  # another block follows
            self.nfe, self.host_syncs = self.nfe + forwards, self.host_syncs + syncs
        return self.output(start, meter)

    def decode_block(self, block_index: int, s: int, e: int) -> None:
        """Iterate until block `[s, e)` has no masks: one host sync per group of iterations.

        A guard on forwards (the block width plus the fixed decoder's steps plus the extra forwards
        the cache's schedule may add) turns a decoder that stops making progress into an error.
        """
        cfg = self.cfg
        self.decoder.block_init(self.x[:, s:e] == self.mask_id, block_index)
        guard = (e - s) + cfg.total_steps() // cfg.num_blocks() + self.cache.extra_forwards + self.decoder.extra_forwards + cfg.max_unroll + 2
        forwards = 0
        while True:
            remaining = int((self.x[:, s:e] == self.mask_id).sum(dim=1).max())  # the host sync
            self.host_syncs += 1
            if not self.decoder.block_continues(remaining > 0):
                break
            if self.hooks.cancel is not None and self.hooks.cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            # a revising decoder decides after each iteration whether the block goes on: no groups
            group = min(max(remaining // cfg.expected_tpf, 1), cfg.max_unroll) if cfg.unroll and not self.decoder.revises else 1
            for _ in range(group):
                self.step(block_index, s, e)
            forwards += group
            if forwards > guard:
                raise EngineError(
                    f"block {block_index} still has masks after {forwards} forwards: decoder '{cfg.decoder}' made no progress"
                )
        self.decoder.block_done(block_index)

    def stop_rows(self, s: int, e: int, finished: torch.Tensor) -> bool:
        """Early stop: rows that generated an EOS/EoT in `[s, e)` get EOS everywhere after `e`.

        Updates `finished` in place; returns whether every row has finished (one host sync).
        """
        positions = torch.arange(s, e, device=self.device).unsqueeze(0)
        generated = positions >= torch.tensor(self.prompt_lengths, device=self.device).unsqueeze(1)
        stop = torch.tensor(self.stop_ids, device=self.device)
        finished |= (torch.isin(self.x[:, s:e], stop) & generated).any(dim=1)
        self.x[:, e:] = torch.where(finished.unsqueeze(1), torch.full_like(self.x[:, e:], self.stop_ids[0]), self.x[:, e:])
        if self.embeds is not None:  # the filled EOS feed their plain embedding from now on
            self.embeds[:, e:] = torch.where(finished[:, None, None], self.model.embed(self.x[:, e:]), self.embeds[:, e:])
        self.host_syncs += 1
        return bool(finished.all())

    def output(self, start: float, meter: _Meter) -> GenerationOutput:
        """Token ids, stats (timed from `start`, minus excluded time; counted from `meter`) and the
        trace's footer."""
        keep = generated_mask(self.x, self.prompt_lengths, self.stop_ids, self.mask_id)
        token_ids = [row[k].tolist() for row, k in zip(self.x.cpu(), keep.cpu())]
        _sync(self.device)
        seconds = time.perf_counter() - start - self.excluded_seconds
        end = _Meter.read(self.model)
        done = end.counters.since(meter.counters)
        stats = GenerationStats(
            nfe=self.nfe,
            tokens=sum(count_tokens(self.x, self.prompt_lengths, self.stop_ids, self.mask_id)),
            seconds=seconds,
            batch=self.x.shape[0],
            trace_seconds=self.excluded_seconds,
            host_syncs=self.host_syncs,
            comm_seconds=end.comm_seconds - meter.comm_seconds,
            compiles=done.compiles,
            captures=done.captures,
            graph_replays=done.replays,
            compile_seconds=done.compile_seconds,
            **dict(zip(("edits", "remasks"), self.revision_counts.tolist())),
        )
        if self.recorder is not None:
            self.recorder.finish(self.x.cpu().tolist(), stats.to_dict(), self.excluded_seconds)
        return GenerationOutput(self.x, self.prompt_lengths, token_ids, stats, self.trace)


def run_masked_diffusion(model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks) -> GenerationOutput:
    """The masked-diffusion loop on a checked request (engine/generation.py: `run_diffusion` checks,
    then calls the loop of the model's kind)."""
    return _MaskedRun(model, prompts, config, stop_ids, hooks).run()
