"""The run of a kind that fills a masked canvas with a rule of its own and no decoder
(docs/algorithms.md §10.2): the skeleton's duties and the step such a kind shares, so its file
holds only its rule.

Blocks left to right (`block_ranges`); per step one uncached forward over the canvas, the block's
logits restricted by the answer's constraint, the kind's `choose` (which masked positions of the
block to fill with their top-1), the fills admitted in the kind's `order` while the canvas stays
completable, written, recorded (`final_until`: the prefix up to the first mask), and after each
block the skeleton's early stop. A rule that fills nothing in a row with masks is an EngineError,
not a hang. An example kind: examples/margin_kind.py.
"""

from __future__ import annotations

import time

import torch

from .decoders.base import top1, top_candidates
from .errors import EngineError
from .run import DiffusionRun, block_ranges, masked_canvas
from .trace import CANDIDATES_MAX_BLOCK, TOP_CANDIDATES, IterationRecord, candidate_lists, positions, rounded

FULL = "full"  # a record's `forward`: an uncached forward over the whole canvas (engine/cache.py's name)


class FillRun(DiffusionRun):
    """A run whose kind implements `choose` (and may implement `order`); everything else is here."""

    def choose(self, probs: torch.Tensor, tokens: torch.Tensor, confidence: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """`[B, W]` bool: the masked positions of the block to fill this step with their top-1
        `tokens`, from the softmax `probs` `[B, W, V]` (the constraint's restriction applied) and the
        top-1's `confidence` `[B, W]`; at least one per row with a mask."""
        raise NotImplementedError

    def order(self, probs: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        """`[B, W]`: the order the chosen fills are kept in under a constraint (highest first)."""
        return confidence

    def setup(self, prompts: list[list[int]]) -> None:
        mask = self.model.mask_token_id
        canvas = masked_canvas(prompts, self.cfg.gen_length, mask, self.hooks.layouts, self.stop_ids[0])
        self.begin([len(p) for p in prompts], canvas, mask, {"revises": False, "shadow_block": False})

    def run_blocks(self) -> None:
        length = self.decoded_end
        for index, (s, e) in enumerate(block_ranges(self.prompt_lengths, length, self.cfg.block_length, self.cfg.align_blocks)):
            while bool((self.x[:, s:e] == self.mask_id).any()):  # the host sync
                self.host_syncs += 1
                self.check_cancel()
                self.fill(index, s, e)
            if e == length or (self.cfg.early_stop and self.stop_rows(s, e)):
                break

    def fill(self, index: int, s: int, e: int) -> None:
        """One step: forward, restrict, choose, admit, write, record."""
        t0 = time.perf_counter()
        masked = (self.x[:, s:e] == self.mask_id) & ~self.finished.unsqueeze(1)
        out = self.metered(lambda: self.model(input_ids=self.x))
        model_logits = out.logits[:, s:e]
        logits, restriction = model_logits, None
        if self.constraint is not None:
            logits, restriction = self.constraint.restrict(model_logits, self.x, self.x == self.mask_id, s, masked)
        tokens, confidence, probs = top1(logits, self.mask_id)
        chosen = self.choose(probs, tokens, confidence, masked) & masked
        if not bool((chosen.any(dim=1) | ~masked.any(dim=1)).all()):
            raise EngineError(f"kind '{self.kind}' chose no masked position to fill in block {index}: its rule made no progress")
        dropped = None
        if self.constraint is not None:
            kept = self.constraint.admit(self.x, self.x == self.mask_id, s, chosen, tokens, self.order(probs, confidence))
            chosen, dropped = kept, chosen & ~kept
        self.x[:, s:e] = torch.where(chosen, tokens, self.x[:, s:e])
        if self.records:
            candidates = top_candidates(logits, self.mask_id, TOP_CANDIDATES) if e - s <= CANDIDATES_MAX_BLOCK else None
            record = IterationRecord(
                iteration=self.iteration, block=index, block_range=[s, e], forward=FULL, recomputed=[[0, self.x.shape[1]]], threshold=None,
                committed=positions(chosen, s), forced=[[] for _ in range(self.x.shape[0])], top1=tokens.cpu().tolist(),
                confidence=rounded(confidence), seconds=time.perf_counter() - t0,
                candidates=candidate_lists(candidates, masked) if candidates is not None else None,
                active=masked.any(dim=1).cpu().tolist(), final_until=self.first_open(),
                constraint=restriction.record(model_logits, self.mask_id, dropped, s) if restriction is not None else None,
            )
            self.emit(record, time.perf_counter())
        self.iteration += 1
