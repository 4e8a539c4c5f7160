"""Chain self-speculation on full-attention masked models (docs/algorithms.md §10.3; after SSD,
arXiv 2510.04147, which verifies drafts of a full-attention model in one forward, losslessly).

The reference is the one-token-per-step decode: per block, each forward commits the block's most
confident masked position (its top-1; `--decoder fixed --steps gen_length`, LLaDA's sampler one
token a step), early stop after a block. Its step is a function of the canvas alone, so a chain of
canvases can be checked in one batched forward:

1. the draft: the next `draft_length` decisions guessed from the last forward's logits (its block's
   masked positions by confidence, each with its top-1);
2. one forward over `k + 1` rows: the canvas with the first `j` drafted tokens written, `j = 0..k`;
3. row `j`'s decision (most confident masked position and its top-1) is the reference's own
   decision on that canvas; keep the drafted tokens while each equals the decision of the row
   before it, and commit the decision of the first row that disagrees (or of the last row): every
   committed token is the reference's, and each forward commits at least one.

The next draft comes from the logits of the row whose decision was committed last, so each step
is one forward (of `k + 1` rows: it costs more than a one-row forward; benchmarks report seconds
too). Records are masked diffusion's (`top1` holds the committed tokens at their positions), with
the chain in `extras`, so the masked view draws it. One prompt per run; no constraint (the
reference decode takes none here).
"""

from __future__ import annotations

import time

import torch

from ..config import GenerationConfig
from ..decoders.base import rank_in_row, top1, top_candidates
from ..errors import EngineError
from ..registry import DecoderOption
from ..run import DiffusionRun, block_ranges, masked_canvas
from ..trace import CANDIDATES_MAX_BLOCK, TOP_CANDIDATES, IterationRecord, candidate_lists, rounded
from .base import DiffusionKind, KindSettings, ModelTraits, register_kind

CHAIN = "chain"
CHAIN_FORWARD = "chain"  # a record's `forward`: one forward over the chain of canvases
NO_CONSTRAINT = "chain self-speculation takes no answer constraint (its reference decode runs none here)"


def decisions(confidence: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """`[R]`: per row, the block position the one-token-per-step decode commits (the most confident
    masked one, ties to the lower position, as the fixed decoder ranks them)."""
    return (rank_in_row(confidence, masked) == 0).float().argmax(dim=1)


class ChainRun(DiffusionRun):
    """One chain self-speculative run; `run_blocks` is the loop, `step` one batched forward."""

    kind = CHAIN

    def setup(self, prompts: list[list[int]]) -> None:
        if len(prompts) != 1:
            raise EngineError(f"chain self-speculation runs one prompt at a time, got {len(prompts)}")
        if self.hooks.constraints is not None:  # a request's own (the server's rows); a config's is refused by `check`
            raise EngineError(NO_CONSTRAINT)
        mask = self.model.mask_token_id
        self.begin([len(prompts[0])], masked_canvas(prompts, self.cfg.gen_length, mask), mask, {})
        self.draft_length = int(ChainKind.option(self.cfg, "draft_length"))
        self.guess: tuple[torch.Tensor, torch.Tensor] | None = None  # (confidence, tokens) from the block's start, of the row committed last
        # the kind's own counters (GenerationStats.counts), named as the speculative kind's: every step verifies
        self.stats_extra = {"verified_steps": 0, "drafted_tokens": 0, "accepted_draft_tokens": 0}

    def run_blocks(self) -> None:
        length = self.x.shape[1]
        for index, (s, e) in enumerate(block_ranges(self.prompt_lengths, length, self.cfg.block_length, self.cfg.align_blocks)):
            while bool((self.x[0, s:e] == self.mask_id).any()):  # the host sync
                self.host_syncs += 1
                self.check_cancel()
                self.step(index, s, e)
            if e == length or (self.cfg.early_stop and self.stop_rows(s, e)):
                break

    def _draft(self, s: int, e: int) -> tuple[list[int], list[int]]:
        """Block positions and tokens of the next decisions guessed from the last committed row's
        logits: its masked positions by confidence (at most `draft_length`, one fewer than the
        block's masks: the chain's last row decides one more)."""
        masked = self.x[0, s:e] == self.mask_id
        k = min(self.draft_length, int(masked.sum()) - 1)
        if self.guess is None or k <= 0:
            return [], []
        confidence, tokens = (t[: e - s] for t in self.guess)
        order = rank_in_row(confidence.unsqueeze(0), masked.unsqueeze(0))[0]
        chosen = order.argsort()[:k]
        return chosen.tolist(), tokens[chosen].tolist()

    def step(self, index: int, s: int, e: int) -> None:
        t0 = time.perf_counter()
        where, drafted = self._draft(s, e)
        rows = self.x.repeat(len(where) + 1, 1)
        for j in range(1, len(where) + 1):  # row j: the first j drafted tokens written
            rows[j:, s + where[j - 1]] = drafted[j - 1]
        out = self.metered(lambda: self.model(input_ids=rows))
        logits = out.logits[:, s:]  # this block and the later ones (the next block's draft reads them)
        tokens, confidence, _ = top1(logits, self.mask_id)
        masked = rows[:, s:e] == self.mask_id
        chosen = decisions(confidence[:, : e - s], masked)  # each row's reference decision
        accepted = 0  # row j's decision is drafted token j's position and token
        while accepted < len(where) and int(chosen[accepted]) == where[accepted] and int(tokens[accepted, where[accepted]]) == drafted[accepted]:
            accepted += 1
        last = accepted  # the row whose decision is committed after the accepted drafts
        committed = [s + w for w in where[:accepted]] + [s + int(chosen[last])]
        written = drafted[:accepted] + [int(tokens[last, committed[-1] - s])]
        self.x[0, committed] = torch.tensor(written, device=self.device)
        self.guess = (confidence[last], tokens[last])
        self.stats_extra["verified_steps"] += 1
        self.stats_extra["drafted_tokens"] += len(where)
        self.stats_extra["accepted_draft_tokens"] += accepted
        if self.records:
            self.emit(self._record(index, s, e, logits[:1, : e - s], committed, written, len(where), accepted, t0), time.perf_counter())
        self.iteration += 1

    def _record(self, index: int, s: int, e: int, logits: torch.Tensor, committed: list[int], written: list[int], drafted: int, accepted: int, t0: float) -> IterationRecord:
        """Masked diffusion's record of the step from the current canvas's (row 0's) block
        `logits`: its top-1 and confidence, with the committed tokens at their positions; the
        chain's length and what it kept in `extras`."""
        tokens, confidence, _ = top1(logits, self.mask_id)
        top = tokens[0].clone()
        top[[p - s for p in committed]] = torch.tensor(written, device=self.device)
        masked = torch.ones_like(top, dtype=torch.bool).unsqueeze(0)
        masked[0, [p - s for p in committed]] = True
        candidates = top_candidates(logits, self.mask_id, TOP_CANDIDATES) if e - s <= CANDIDATES_MAX_BLOCK else None
        return IterationRecord(
            iteration=self.iteration, block=index, block_range=[s, e], forward=CHAIN_FORWARD, recomputed=[[0, self.x.shape[1]]], threshold=None,
            committed=[committed], forced=[[]], top1=[top.tolist()], confidence=rounded(confidence), seconds=time.perf_counter() - t0,
            candidates=candidate_lists(candidates, masked) if candidates is not None else None,
            extras={"chain_rows": drafted + 1, "drafted": drafted, "accepted": accepted}, active=[True], final_until=self.first_open(),
        )


@register_kind
class ChainKind(DiffusionKind):
    """Chain self-speculation: the one-token-per-step decode's tokens from batched chains of canvases."""

    name = CHAIN
    run = ChainRun
    summary = "guesses the next tokens of the one-token-per-step decode and checks them as a chain of canvases in one batched forward: its tokens, in fewer forwards"
    settings = KindSettings(
        reads=frozenset({"align_blocks"}), decoders=None, shares_batches=False,
        options={"draft_length": DecoderOption(4, "chain kind: drafted tokens checked per forward (the forward runs one canvas more)", least=1, most=64)},
    )

    @classmethod
    def refuses(cls, model: ModelTraits) -> str | None:
        if model.diffusion_kind != "masked" or model.block_causal:
            return "it needs a full-attention masked-diffusion model (LLaDA), whose decode step is a function of the whole canvas"
        return None

    @classmethod
    def check(cls, config: GenerationConfig) -> None:
        if any(getattr(config, name) for name in ("regex", "json_schema", "choice")):
            raise EngineError(NO_CONSTRAINT)
