"""Self-speculative decoding on a block-causal model (S2D2, arXiv 2603.25702; docs/algorithms.md §10).

A block-diffusion model whose blocks are one token long is an autoregressive model: a [MASK] query
that sees the clean text before it predicts the next token. So one checkpoint drafts and verifies.
Per step, in the current block `[s, e)`, whose open positions are always a suffix `[c, e)`:
  1. **draft**: one forward of the open positions (they see the committed text and each other, as
     in block diffusion); the request's masked decoder (`--decoder`) proposes a token at each.
  2. **verify** (`verify=always`; `auto` and `router` when they do not skip): one forward that feeds
     the drafted tokens `[c, e-1)` as text (each seeing the text before it: blocks of one) and a
     [MASK] query per open position `[c, e)`, which sees the text before it and the drafted tokens
     before it. Keep the longest drafted prefix whose verifier argmax agrees; at the first
     disagreement commit the verifier's token. Every step commits at least one token, and every
     token is the one the model's own greedy block-length-1 decode would write.
  3. **auto** (`verify=auto`): skip the verify forward when the decoder commits the first open
     position and every position of the run of its commits from there is at least
     `verify_threshold` confident; that run is committed as a plain diffusion step (no equality).
  4. **router** (`verify=router`, S2D2's cost-aware rule; docs/algorithms.md §10.4, `VerifyRouter`):
     verify when the draft's expected accepted tokens, estimated from its entropies, beat what a
     skip would commit, with hysteresis; a skip commits the run of confident drafted tokens from
     `c`. A draft of one open position is the verify's own query, so it is committed unverified,
     exactly.
  5. **draft window** (`draft_window=adaptive`; §10.5, `DraftWindow`): each step drafts a window of
     its own from `c`, its length following what the drafts before kept, instead of the block.

K/V: one store of the committed text's keys and values computed as blocks of one (causally), the
autoregressive model's cache, which the verifier's equality needs; the draft reads it too (a
bidirectional draft over the causal cache, as LinearSpec). A verify query sits at its position in
a spare slot past the canvas (`positions`), since its position also holds a drafted token.
One prompt per run (per-row cursors would break the verify forward's shape); the server's
continuous batching packs several runs' draft and verify forwards into one model call, each row
reading its own store (engine/serving/packed.py). Records: docs/trace.md §3.4.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..config import GenerationConfig
from ..decoders import Block, DecodeResult, make_decoder, top1, top_candidates
from ..errors import EngineError
from ..models.base import ModelOutput
from ..registry import DecoderOption, decoder_class
from ..run import DiffusionRun, block_ranges, masked_canvas
from ..step_state import StepState, id_lists, per_position, register_step_state
from ..trace import CANDIDATES_MAX_BLOCK, DRAFT_VERIFY, TOP_CANDIDATES, IterationRecord, candidate_lists, rounded
from .base import DiffusionKind, KindSettings, ModelTraits, register_kind

SPECULATIVE = "speculative"
DRAFT = "draft"  # a record's `forward` when its step skipped the verify (DRAFT_VERIFY: it ran both)
# why the router decided as it did (a record's `state.router.why`)
BY_SCORE, EXACT, NOTHING_CONFIDENT = "score", "one open position", "nothing confident"


@dataclass(frozen=True)
class RouterDecision:
    """One step's call of the verify router, as its record keeps it (docs/trace.md §3.4)."""

    expected: float  # E[K]: the drafted tokens a verify is expected to keep
    confident: int  # N: the run of drafted tokens from the first open position above τ_r (what a skip commits)
    score: float  # E[K] - c·N
    verify: bool
    why: str  # BY_SCORE, EXACT or NOTHING_CONFIDENT

    def state(self) -> dict[str, Any]:
        return {"expected": round(self.expected, 4), "confident": self.confident, "score": round(self.score, 4), "verify": self.verify, "why": self.why}


class DraftWindow:
    """`draft_window=adaptive` (docs/algorithms.md §10.5): each step drafts `[c, c + length)`, the
    length chosen from what the steps before kept: it doubles after a step that kept its whole
    draft (every drafted token verified, or the router's skip committed them all), up to `most`,
    and after one that did not becomes the tokens that step kept plus one (at least 2), so a draft
    grows while the model's drafts hold and shrinks to what they held when they break. The window
    starts at the block length and ignores the block grid (the verifier is autoregressive: where
    the draft stops changes how many tokens a step commits, never which)."""

    def __init__(self, first: int, most: int) -> None:
        self.length, self.most = min(first, most), most

    def update(self, drafted: int, kept: int) -> None:
        self.length = min(2 * self.length, self.most) if kept >= drafted else max(2, min(kept + 1, self.most))


class VerifyRouter:
    """S2D2's router (arXiv 2603.25702, its `score_hysteresis` policy with the dynamic score;
    docs/algorithms.md §10.4). Per step, from the draft's distribution at the open positions
    `[c, e)`: each drafted token's acceptance `α_i = exp(-T·H_i)` (`H_i` its entropy over log of
    the vocabulary), the expected accepted tokens `E[K] = Σ_k Π_{i≤k} α_i`, and the score
    `E[K] - c·N`, `N` the run of drafted tokens from `c` more than `τ_r` confident: what a skip
    commits in one forward, where S2D2 counts every confident mask (our open positions stay a
    suffix). Verify when the score passes τ_on (off) or stays at least τ_off (on); the state
    starts off. A skip with nothing confident to commit verifies."""

    def __init__(self, config: GenerationConfig) -> None:
        option = lambda name: SpeculativeKind.option(config, name)  # noqa: E731
        self.temperature, self.cost, self.confidence = option("router_temperature"), option("router_cost"), option("router_confidence")
        self.turn_on = option("router_on")
        self.turn_off = self.turn_on - option("router_gap")
        self.on = False

    def decide(self, probs: torch.Tensor, confidence: torch.Tensor, exact: bool) -> RouterDecision:
        """`probs` `[W, V]` and `confidence` `[W]`: the draft's distribution and top-1 probability
        at the open positions, first open first; `exact`: the draft is the verify's own query."""
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1) / math.log(probs.shape[-1])
        alpha = torch.exp(-self.temperature * entropy)
        run = (confidence > self.confidence).long().cumprod(0).sum()
        expected, confident = torch.stack([alpha.cumprod(0).sum(), run.to(alpha.dtype)]).tolist()  # one host sync
        score = expected - self.cost * confident
        if exact:  # no verify can say more than the draft did: the state is left as it was
            return RouterDecision(expected, 1, score, False, EXACT)
        self.on = score >= self.turn_off if self.on else score > self.turn_on
        if not self.on and confident == 0:
            return RouterDecision(expected, 0, score, True, NOTHING_CONFIDENT)
        return RouterDecision(expected, int(confident), score, self.on, BY_SCORE)


class SpeculativeRun(DiffusionRun):
    """One self-speculative run; `run_blocks` is the loop, `speculate` one step."""

    kind = SPECULATIVE

    def setup(self, prompts: list[list[int]]) -> None:
        model, config = self.model, self.cfg
        if len(prompts) != 1:
            raise EngineError(f"speculative decoding runs one prompt at a time, got {len(prompts)}")
        self.decoder = make_decoder(config, model.mask_token_id, self.generator)
        self.begin([len(prompts[0])], masked_canvas(prompts, config.gen_length, model.mask_token_id), model.mask_token_id, self.decoder.capabilities())
        self.length = self.x.shape[1]
        adaptive = SpeculativeKind.option(config, "draft_window") == "adaptive"
        self.window = DraftWindow(config.block_length, SpeculativeKind.option(config, "draft_most")) if adaptive else None
        # the verify queries' spare slots past the canvas: one per drafted position at most
        self.spare = max(config.block_length, self.window.most) if self.window is not None else config.block_length
        self.store: torch.Tensor | None = None  # [layers, 2, 1, H_kv, length + spare, D]
        self.stored = 0  # the committed text [0, stored) has its K/V in the store
        self.kept = 0  # the drafted tokens the last step kept
        # the kind's own counters (GenerationStats.counts): steps verified, drafted tokens kept, verifies skipped
        self.stats_extra = {"verified_steps": 0, "accepted_draft_tokens": 0, "skipped_verifies": 0}
        self.ended = False  # early stop: an end-of-text was committed and the rest of the canvas filled
        self.verify_mode = SpeculativeKind.option(config, "verify")
        self.router = VerifyRouter(config) if self.verify_mode == "router" else None
        model.rope.table(self.length, self.device)  # positions given as tensors read the table as it is

    def run_blocks(self) -> None:
        if self.window is not None:
            self._run_windows()
            return
        blocks = block_ranges(self.prompt_lengths, self.length, self.cfg.block_length, True)
        for index, (s, e) in enumerate(blocks):
            self.decoder.block_init(self.x[:, s:e] == self.mask_id, index)
            c = max(s, self.prompt_lengths[0])
            while c < e and not self.ended:
                self.check_cancel()
                c = self.speculate(index, s, e, c)
            self.decoder.block_done(index)
            if self.ended:
                break

    def _run_windows(self) -> None:
        """draft_window=adaptive: each step's draft is a window of its own (`DraftWindow`), the
        decoder's block."""
        c, index = self.prompt_lengths[0], 0
        while c < self.length and not self.ended:
            self.check_cancel()
            e = min(c + self.window.length, self.length)
            self.decoder.block_init(self.x[:, c:e] == self.mask_id, index)
            after = self.speculate(index, c, e, c)
            self.decoder.block_done(index)
            self.window.update(e - c, self.kept)
            c, index = after, index + 1

    # ---- one step ------------------------------------------------------------------------------
    def speculate(self, index: int, s: int, e: int, c: int) -> int:
        """Draft `[c, e)`, verify it (unless the router skips), commit; returns the new first open
        position. Under an answer constraint the draft is completable as a whole and the verifier
        reads its logits as the model's own constrained decode would (`restrict_causal`), so the
        tokens stay those of that decode and inside the constraint."""
        t0 = time.perf_counter()
        masked = self.x[:, s:e] == self.mask_id
        draft_out = self.metered(lambda: self._draft_forward(c, e))
        logits = torch.zeros(1, e - s, draft_out.logits.shape[-1], dtype=draft_out.logits.dtype, device=self.device)
        logits[:, c - s :] = draft_out.logits[:, -(e - c) :]
        model_logits, restriction = logits, None
        if self.constraint is not None:
            logits, restriction = self.constraint.restrict(logits, self.x, self.x == self.mask_id, s, masked)
        result = self.decoder.step(logits, Block(masked, self.x[:, s:e], torch.zeros_like(masked), self.cfg.threshold))
        if self.constraint is None:
            draft = torch.where(masked, result.tokens, self.x[:, s:e])
        else:  # left to right, the order the verifier reads it in
            order = -torch.arange(e - s, device=self.device).expand_as(masked)
            draft = torch.where(masked, self.constraint.draft(logits, self.x, self.x == self.mask_id, s, order), self.x[:, s:e])
        skip, decision = self._skip(logits[0, c - s :], result, draft[0, c - s :], c - s, e - c)
        verifier = verify_probability = None
        if skip:
            n, written, corrected = len(skip), skip, None
            self.stats_extra["skipped_verifies"] += 1
        else:
            verify_out = self.metered(lambda: self._verify_forward(draft, s, c, e))
            verify_logits = verify_out.logits[:, -(e - c) :]
            if self.constraint is not None:
                verify_logits = self.constraint.restrict_causal(verify_logits, self.x, self.x == self.mask_id, c, draft[:, c - s :])
            verifier, verify_probability, _ = top1(verify_logits, self.mask_id)
            agree = (draft[0, c - s :] == verifier[0]).long().cumprod(0)
            n = int(agree.sum())  # the host sync: the accepted length
            self._store_verified(verify_out, c, min(n, e - c - 1))
            written = draft[0, c - s : c - s + n].tolist() + ([int(verifier[0, n])] if n < e - c else [])
            corrected = c + n if n < e - c else None
            self.stats_extra["verified_steps"] += 1
            self.stats_extra["accepted_draft_tokens"] += n
        self.kept = n  # the drafted tokens this step kept (DraftWindow reads it)
        self.x[0, c : c + len(written)] = torch.tensor(written, device=self.device)
        self._stop_at_end_of_text(c, written)
        if self.records:
            record = self._record(index, s, e, c, logits, result, draft, written, corrected, verifier, verify_probability, t0)
            record.state["router"] = [decision.state() if decision is not None else None]
            record.constraint = restriction.record(model_logits, self.mask_id, None, s) if restriction is not None else None
            self.emit(record, time.perf_counter())
        self.iteration += 1
        return c + len(written)

    def _skip(self, logits: torch.Tensor, result: DecodeResult, draft: torch.Tensor, first: int, width: int) -> tuple[list[int], RouterDecision | None]:
        """The tokens a step commits without its verify (none: it verifies), and the router's
        decision. `logits` `[W, V]` and `draft` `[W]` at the open positions. verify=auto: the
        decoder's run of commits from the first open position when each is at least
        `verify_threshold` confident. verify=router: `VerifyRouter`; a draft of one open position
        (no constraint: the verifier would read its logits unrestricted by the draft) is the
        verify's own query, so its argmax is written."""
        if self.verify_mode == "auto":
            confident = result.commit[0, first:] & (result.confidence[0, first:] >= SpeculativeKind.option(self.cfg, "verify_threshold"))
            return draft[: int(confident.long().cumprod(0).sum())].tolist(), None
        if self.router is None:
            return [], None
        tokens, confidence, probs = top1(logits, self.mask_id)
        decision = self.router.decide(probs, confidence, width == 1 and self.constraint is None)
        if decision.why == EXACT:
            return tokens[:1].tolist(), decision
        return ([] if decision.verify else draft[: decision.confident].tolist()), decision

    # ---- the two forwards --------------------------------------------------------------------
    def _draft_forward(self, c: int, e: int) -> ModelOutput:
        """The committed text not yet stored `[stored, c)` (as blocks of one, so its K/V are the
        store's kind, kept) and the open positions `[c, e)` (one bidirectional block)."""
        a = self.stored
        queries = torch.arange(a, e, device=self.device)
        keys = torch.arange(self.length + self.spare, device=self.device)
        sees = (keys.unsqueeze(0) <= queries.unsqueeze(1)) | ((queries.unsqueeze(1) >= c) & (keys.unsqueeze(0) < e))
        out = self._forward(self.x[:, a:e], queries, queries, sees)
        if c > a:
            self._write(out.kv[..., : c - a, :], a)
        return out

    def _verify_forward(self, draft: torch.Tensor, s: int, c: int, e: int) -> ModelOutput:
        """The drafted tokens `[c, e-1)` as text (causal) and a [MASK] query per open position
        `[c, e)` in the spare slots, each seeing the text before its position and itself."""
        k = e - c
        text = torch.arange(c, e - 1, device=self.device)
        at = torch.arange(c, e, device=self.device)
        spare = self.length + torch.arange(k, device=self.device)  # the spare slots past the canvas
        keys = torch.arange(self.length + self.spare, device=self.device)
        text_sees = keys.unsqueeze(0) <= text.unsqueeze(1)
        query_sees = (keys.unsqueeze(0) < at.unsqueeze(1)) | (keys.unsqueeze(0) == spare.unsqueeze(1))
        ids = torch.cat([draft[:, c - s : e - 1 - s], torch.full((1, k), self.mask_id, device=self.device)], dim=1)
        return self._forward(ids, torch.cat([text, spare]), torch.cat([text, at]), torch.cat([text_sees, query_sees]))

    def _forward(self, ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, sees: torch.Tensor) -> ModelOutput:
        """Queries `ids` at `slots` (rotated at `positions`) over the store, `sees` `[q, slots]`."""
        if self.store is None:  # the first forward: its own queries are every key there is
            return self.model(input_ids=ids, replace=positions, attention_mask=sees[:, slots], use_cache=True)
        return self.model(input_ids=ids, past_kv=self.store, replace=slots, positions=positions, attention_mask=sees, use_cache=True)

    def _write(self, kv: torch.Tensor, a: int) -> None:
        if self.store is None:
            self.store = kv.new_zeros(*kv.shape[:4], self.length + self.spare, kv.shape[5])
        self.store[..., a : a + kv.shape[4], :] = kv
        self.stored = max(self.stored, a + kv.shape[4])

    def _store_verified(self, out: ModelOutput, c: int, n: int) -> None:
        """The K/V of the `n` accepted drafted tokens, computed as text by the verify forward."""
        if n > 0:
            self._write(out.kv[..., :n, :], c)

    def _stop_at_end_of_text(self, c: int, written: list[int]) -> None:
        """Early stop: the written tokens are final, so the skeleton's rule applies to them up to
        the first end-of-text (the rest of the canvas becomes end-of-text, as the block-length-1
        decode fills it after that token's block)."""
        ends = [i for i, token in enumerate(written) if token in self.stop_ids]
        if self.cfg.early_stop and ends:
            self.ended = self.stop_rows(c, c + ends[0] + 1)

    # ---- the record ----------------------------------------------------------------------------
    def _record(
        self, index: int, s: int, e: int, c: int, logits: torch.Tensor, result: DecodeResult, draft: torch.Tensor, written: list[int],
        corrected: int | None, verifier: torch.Tensor | None, verify_probability: torch.Tensor | None, t0: float,
    ) -> IterationRecord:
        width, open_ = e - s, c - s
        masked = torch.zeros(1, width, dtype=torch.bool, device=self.device)
        masked[:, open_:] = True
        top = self.x[0, s:e].tolist()
        top[open_ + len(written) :] = draft[0, open_ + len(written) :].tolist()
        candidates = top_candidates(logits, self.mask_id, TOP_CANDIDATES) if width <= CANDIDATES_MAX_BLOCK else None

        def open_only(values: list) -> list:
            return [None] * open_ + values

        state: dict[str, Any] = {
            "open_from": [c],
            "draft": [open_only(draft[0, open_:].tolist())],
            "draft_probability": [open_only(rounded(result.confidence[0, open_:]))],
            "draft_commits": [[s + w for w in result.commit[0].nonzero().flatten().tolist()]],
            "verified": [verifier is not None],
            "verify": [open_only(verifier[0].tolist()) if verifier is not None else [None] * width],
            "verify_probability": [open_only(rounded(verify_probability[0])) if verify_probability is not None else [None] * width],
            "accepted": [len(written) - (corrected is not None)],
            "corrected": [corrected],
            "verify_threshold": SpeculativeKind.option(self.cfg, "verify_threshold") if SpeculativeKind.option(self.cfg, "verify") == "auto" else None,
        }
        return IterationRecord(
            iteration=self.iteration, block=index, block_range=[s, e], forward=DRAFT if verifier is None else DRAFT_VERIFY,
            recomputed=[[min(self.stored, c), e]], threshold=self.cfg.threshold if self.decoder.uses_threshold else None,
            committed=[list(range(c, c + len(written)))], forced=[[]], top1=[top], confidence=[[0.0] * open_ + rounded(result.confidence[0, open_:])],
            seconds=time.perf_counter() - t0, candidates=candidate_lists(candidates, masked) if candidates is not None else None,
            active=[True], final_until=self.first_open(), state=state,
        )


class SpeculativeStepState(StepState):
    """A speculative step's `state` (docs/trace.md §3.4). Its writes are the masked kind's (the
    committed tokens are `top1` at `committed`), so only the check and the ids are its own."""

    def check(self, state: dict[str, Any], rows: int, s: int, e: int, need: Any) -> None:
        def is_id(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_p(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for name, ok in (("draft", is_id), ("verify", is_id), ("draft_probability", is_p), ("verify_probability", is_p)):
            per_position(state, name, rows, e - s, ok, need, nullable=True)
        for name in ("open_from", "verified", "accepted", "corrected", "draft_commits"):
            need(isinstance(state.get(name), list) and len(state[name]) == rows, f"state.{name} needs one entry per row")
        for row in range(rows):
            need(is_id(state["open_from"][row]) and s <= state["open_from"][row] <= e, "state.open_from must be a position in the block")
            need(isinstance(state["verified"][row], bool) and is_id(state["accepted"][row]) and state["accepted"][row] >= 0, "state: verified must be true/false and accepted a count")
            corrected = state["corrected"][row]
            need(corrected is None or (is_id(corrected) and s <= corrected < e), "state.corrected must be null or a position in the block")
        routed = state.get("router", [None] * rows)  # absent from traces written before the router
        need(isinstance(routed, list) and len(routed) == rows, "state.router needs one entry per row")
        for decision in routed:
            need(decision is None or (
                isinstance(decision, dict) and all(is_p(decision.get(k)) for k in ("expected", "score")) and is_id(decision.get("confident"))
                and isinstance(decision.get("verify"), bool) and decision.get("why") in (BY_SCORE, EXACT, NOTHING_CONFIDENT)
            ), "state.router must be null or a decision: expected, confident, score, verify, why")

    def ids(self, state: dict[str, Any]) -> set[int]:
        return id_lists(state, "draft", "verify")


register_step_state(SPECULATIVE, SpeculativeStepState())


@register_kind
class SpeculativeKind(DiffusionKind):
    """Self-speculative decoding: drafts with a masked decoder, on block-causal models only, in one
    process, eagerly (its verify forward's shape changes with the open positions)."""

    name = SPECULATIVE
    run = SpeculativeRun
    summary = "the model drafts a block in parallel, then checks its draft autoregressively in one forward"
    settings = KindSettings(
        reads=frozenset({"threshold", "steps"}),
        default_decoder=GenerationConfig.decoder,
        system_options=frozenset(),
        shares_batches=False,
        decoders="masked",
        options={
            "verify": DecoderOption(
                "always", "verify every draft (always: the tokens of the model's own block-1 decode), only unconfident ones (auto), or when S2D2's router expects it to pay (router)",
                choices=("always", "auto", "router"),
            ),
            "verify_threshold": DecoderOption(0.9, "verify auto: skip the verify forward when every drafted token the decoder commits is at least this confident", least=0.0, most=1.0),
            "draft_window": DecoderOption(
                "block", "the draft: the current block's open positions (block), or a window whose length follows what the drafts before kept (adaptive)",
                choices=("block", "adaptive"),
            ),
            "draft_most": DecoderOption(32, "draft window adaptive: the longest draft (the largest block size tiny-llada2 was trained at)", least=1, most=512),
            # the router's defaults: measured on training-side prompts (docs/algorithms.md §10.4)
            "router_temperature": DecoderOption(1.0, "verify router: T in a drafted token's acceptance exp(-T·normalised entropy)", least=0.0),
            "router_cost": DecoderOption(2.0, "verify router: c, the weight of each confident drafted token a skip would commit, in the score E[K] - c·N", least=0.0),
            "router_confidence": DecoderOption(0.99, "verify router: τ_r, a drafted token above it is confident (a skip commits the run of them)", least=0.0, most=1.0),
            "router_on": DecoderOption(-1.0, "verify router: τ_on, verify once the score passes it (S2D2's hysteresis: 1)", least=-100.0, most=100.0),
            # τ_off as its distance below τ_on: any two values are a valid pair, so the tuner searches them freely
            "router_gap": DecoderOption(0.0, "verify router: τ_on - τ_off; once verifying, keep verifying while the score is at least τ_off (S2D2's hysteresis: 6, τ_off -5)", least=0.0, most=200.0),
        },
    )

    @classmethod
    def refuses(cls, model: ModelTraits) -> str | None:
        if model.diffusion_kind != "masked" or not model.block_causal:
            return "it needs a block-causal masked-diffusion model (LLaDA2), whose blocks of one token decode autoregressively"
        return None

    @classmethod
    def check(cls, config: GenerationConfig) -> None:
        decoder = decoder_class(config.decoder)
        if decoder.revises or decoder.shadow_block:
            raise EngineError(f"decoder '{config.decoder}' revises or needs a shadow block: speculative decoding drafts with a decoder that only fills masks")
