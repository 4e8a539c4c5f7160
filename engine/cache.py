"""Component 4, the KV-cache manager: which forward each iteration runs, and the stored K/V.

`KVCacheManager.plan` is each cache mode's rule (the modes declare their settings and prose in
engine/cache_modes.py); `forward` runs the plan against the request's store; `BlockCausalCache`
is LLaDA2's exact prefix store, and `PrefixStore` the prompt blocks' K/V it shares across
requests (a server's: docs/serving.md §3). Modes, refresh schedule, exactness and the staleness
probe: docs/algorithms.md §4; block diffusion: §5; revised positions: §2.8.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from .cache_modes import cache_modes
from .config import GenerationConfig
from .decoders.shadow import check_shadow_support, shadow_forward
from .errors import EngineError
from .models.base import DiffusionLM, ModelOutput
from .registry import decoder_class
from .trace import REFRESH_FORWARD

# The request's model inputs for canvas range [a, b): {"input_ids": ...} or {"inputs_embeds": ...}.
Inputs = Callable[[int, int], dict[str, torch.Tensor]]

# Forward kinds, as the trace records them.
FULL = "full"  # no cache involved (mode none, or vicinity warm-up)
REFRESH = REFRESH_FORWARD  # full forward whose K/V become the new store (named in the trace module: its upgrade reads it)
PREFIX = "prefix"
DUAL = "dual"
WINDOW = "window"


@dataclass(frozen=True)
class ForwardPlan:
    """One forward: its kind and the canvas range `[start, end)` fed to the model as queries
    (also the range whose K/V it computes fresh)."""

    kind: str
    start: int
    end: int

    @property
    def uses_cache(self) -> bool:
        return self.kind in (PREFIX, DUAL, WINDOW)


class KVCacheManager:
    """Plans each iteration's forward, runs it against the request's K/V store, keeps the store."""

    def __init__(self, config: GenerationConfig, canvas_length: int) -> None:
        self.mode = config.cache
        self.config = config
        self.length = canvas_length
        self.store: torch.Tensor | None = None
        self.refreshed_block: int | None = None
        self.since_refresh = 0  # forwards since the last refresh, the refresh included
        self.extra_forwards = config.warmup  # forwards a block may take beyond its decodes (the loop's guard)

    @staticmethod
    def for_model(model: DiffusionLM, config: GenerationConfig, canvas_length: int, prefixes: PrefixStore | None = None) -> "KVCacheManager":
        """The manager for `model`: the block-causal store for a block-causal model (with the
        requests' shared `prefixes`, if any), else this one."""
        if model.block_causal:
            return BlockCausalCache(config, canvas_length, model.device, prefixes)
        return KVCacheManager(config, canvas_length)

    def plan(self, iteration: int, block_index: int, start: int, end: int) -> ForwardPlan:
        """Decide the next forward from host-side counters only (no device read)."""
        cfg, n = self.config, self.length
        if self.mode == "none" or (self.mode == "vicinity" and iteration < cfg.warmup):
            return ForwardPlan(FULL, 0, n)
        due = cfg.refresh_every is not None and self.since_refresh >= cfg.refresh_every
        if self.store is None or self.refreshed_block != block_index or due:
            return ForwardPlan(REFRESH, 0, n)
        if self.mode == "prefix":
            return ForwardPlan(PREFIX, start, n)
        if self.mode == "dual":
            return ForwardPlan(DUAL, start, end)
        return ForwardPlan(WINDOW, max(0, start - cfg.prefix_look), min(n, end + cfg.after_look))

    def forward(
        self, model: DiffusionLM, plan: ForwardPlan, block_index: int, *, masked: torch.Tensor | None = None,
        shadow: tuple[int, int] | None = None, **inputs: torch.Tensor,
    ) -> ModelOutput:
        """Run `plan` on `inputs` (token ids or embeddings of the canvas range `[start, end)`);
        `masked`: the block's [MASK] positions in that input (None: unknown), for a store that
        keeps only final K/V; `shadow`: the block `[s, e)` whose shadow copy the forward also runs
        (WINO, engine/decoders/shadow.py; on a full forward only: the decoder admits cache none alone)."""
        if shadow is not None:
            if plan.kind != FULL:
                raise EngineError(f"a shadow block runs on full forwards only, not {plan.kind}")
            check_shadow_support(model)
            return shadow_forward(model, inputs, *shadow)
        if plan.kind == FULL:
            return model(**inputs)
        if plan.kind == REFRESH:
            out = model(**inputs, use_cache=True)
            if self.store is None:
                self.store = out.kv
            else:
                self.store.copy_(out.kv)
            self.refreshed_block = block_index
            self.since_refresh = 1
            return out
        self.since_refresh += 1
        return model(
            **inputs, past_kv=self.store, replace=(plan.start, plan.end), persist=self.config.persist_window
        )

    def revised(self, changed: torch.Tensor) -> None:
        """A revising decoder changed committed positions of the current block (`[B, W]`, a device
        tensor) after this iteration's forward read them: any K/V kept from that forward is stale
        there. Here nothing is kept past the block (every forward computes the block fresh, and the
        next block starts with a refresh), so nothing to do."""

    def exact_logits(self, model: DiffusionLM, s: int, e: int, inputs: Inputs) -> torch.Tensor:
        """The uncached logits of block `[s, e)` on the current input (the staleness probe's reference)."""
        return model(**inputs(0, self.length)).logits[:, s:e]

    def prefill(self, model: DiffusionLM, first: int, inputs: Inputs) -> int:
        """Before the first block `[first, ...)`: nothing to store here. Returns the forwards run."""
        return 0

    def block_done(self, model: DiffusionLM, s: int, e: int, inputs: Inputs) -> tuple[int, int]:
        """Block `[s, e)` is final and another follows: nothing to store here. Returns (forwards, host syncs)."""
        return 0, 0


class PrefixStore:
    """The K/V of prompt blocks, shared by the requests of one block-causal model (a server's:
    docs/serving.md §3). Under block-causal attention a block's K/V depend only on its tokens and
    those of the blocks before it (and on the block length, which draws the blocks), so a prompt
    whose first k whole blocks equal another's takes their K/V instead of computing them. Each
    block is keyed by a SHA-256 chain over the block length and the tokens up to its end; the least
    recently used blocks are dropped past `max_bytes`. `on_hit(tokens)`: told of each reuse and how
    many prompt tokens it supplied."""

    def __init__(self, max_bytes: int, on_hit: Callable[[int], None] | None = None) -> None:
        if max_bytes < 1:
            raise EngineError(f"the prefix store needs room: max_bytes {max_bytes}")
        self.max_bytes, self.on_hit = max_bytes, on_hit
        self.bytes = 0
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()  # a server's rows run in threads of their own

    @staticmethod
    def _keys(block_length: int, ids: list[int]) -> list[bytes]:
        """One key per whole block of `ids`, each naming every token up to the block's end."""
        chain, keys = hashlib.sha256(str(block_length).encode()), []
        for k in range(len(ids) // block_length):
            chain.update(b"".join(t.to_bytes(4, "little") for t in ids[k * block_length : (k + 1) * block_length]))
            keys.append(chain.copy().digest())
        return keys

    def lookup(self, block_length: int, ids: list[int]) -> torch.Tensor | None:
        """The stored K/V `[n_layers, 2, 1, H_kv, k·L, D]` of the longest run of `ids`' first whole
        blocks (None: not even the first)."""
        found = []
        with self._lock:
            for key in self._keys(block_length, ids):
                kv = self._blocks.get(key)
                if kv is None:
                    break
                self._blocks.move_to_end(key)
                found.append(kv)
        if not found:
            return None
        if self.on_hit is not None:
            self.on_hit(len(found) * block_length)
        return torch.cat(found, dim=4)

    def insert(self, block_length: int, ids: list[int], kv: torch.Tensor) -> None:
        """Keep the K/V `[..., len(ids), D]` of `ids`' whole blocks (a copy: the caller's store goes on changing)."""
        with self._lock:
            for k, key in enumerate(self._keys(block_length, ids)):
                if key in self._blocks:
                    self._blocks.move_to_end(key)
                    continue
                block = kv[..., k * block_length : (k + 1) * block_length, :].clone()
                self._blocks[key] = block
                self.bytes += block.numel() * block.element_size()
            while self.bytes > self.max_bytes and self._blocks:
                _, dropped = self._blocks.popitem(last=False)
                self.bytes -= dropped.numel() * dropped.element_size()

    def __len__(self) -> int:
        return len(self._blocks)


def block_causal_mask(length: int, block_length: int, device: torch.device) -> torch.Tensor:
    """`[length, length]` boolean, True where query `i` may attend to key `j` (block(j) <= block(i))."""
    block = torch.arange(length, device=device) // block_length
    return block.unsqueeze(1) >= block.unsqueeze(0)


def check_attention(model: DiffusionLM, config: GenerationConfig) -> None:
    """Refuse, before any forward, a config `model`'s attention cannot run: the refusals the
    block-causal store and the shadow forward make when they meet one, made while the request is
    still being checked, so that its caller answers them as the request's own error (the server: a
    400, not a failed run's 500). `model` may be a skeleton: only its family is read."""
    if model.block_causal:
        BlockCausalCache.check(config)
        if config.pins_after_a_hole():
            raise EngineError("this model's attention is block-causal: a block sees only the text before it, never text pinned after a hole "
                              "(suffix, or a template's text after its first hole); fill holes with a full-attention model (tiny-llada), or put the text in the prompt")
    if decoder_class(config.decoder).shadow_block:
        check_shadow_support(model)


class BlockCausalCache(KVCacheManager):
    """Block diffusion for block-causal models (LLaDA2; docs/algorithms.md §5, §4.4).

    The model was trained with block-causal attention: a token in block `i` sees every token of
    blocks `<= i` (bidirectionally inside its own block) and nothing after. Blocks are the absolute
    ones, `[k·L_b, (k+1)·L_b)` (hence `align_blocks`), so the pattern matches training whatever the
    prompt length. Every forward feeds block `[s, e)` only:
    - `"prefix"`, the exact prefix cache: the store `[n_layers, 2, B, H_kv, N, D]` holds the
      post-RoPE K/V of the committed positions `[0, s)`; the block attends to them and to itself,
      the store's unused slots `[e, N)` masked out (dInfer's SGLang path zero-pads them, and zero
      keys still take softmax mass). Committed positions whose K/V are not stored yet (the
      prompt's `[0, first)`; a finished block, unless its last forward's K/V can serve) are
      *pending*: the next forward feeds them ahead of the block, under the block-causal mask, and
      stores their K/V, so storing them costs no forward of its own. A finished block's last
      forward's K/V serve when its input had no mask left (an unrolled no-op) and no revising
      decoder changed a token after it (`revised`). Earlier blocks never attend to later ones, so
      every cached logit is exact.
    - `"none"`, the attention-mask reference (dInfer's `BlockDiffusionLLMAttnmask`): `[0, e)` under
      the block-causal mask, every iteration. Slow and exact; the oracle of the cached path.
    """

    MODES = tuple(mode.name for mode in cache_modes() if mode.block_causal)  # as the modes declare

    def __init__(self, config: GenerationConfig, canvas_length: int, device: torch.device, prefixes: PrefixStore | None = None) -> None:
        self.check(config)
        super().__init__(config, canvas_length)
        self.extra_forwards = 0
        self.mask = block_causal_mask(canvas_length, config.block_length, device)
        # the K/V of the last cached forward, and whether its input still held a mask (device tensor)
        self.last_kv: torch.Tensor | None = None
        self.last_input_masked: torch.Tensor | bool | None = None
        # committed positions [pending, s) whose K/V the next forward computes and stores (None: all
        # stored), and the start s of the block the last plan was for
        self.pending: int | None = None
        self.block_start = 0
        self.prefixes = prefixes if config.cache == "prefix" else None
        self.prompt_blocks: list[int] | None = None  # the prompt's whole blocks, for `prefixes` once their K/V are stored

    @classmethod
    def check(cls, config: GenerationConfig) -> None:
        """Refuse, in one line, a config a block-causal model cannot decode."""
        if config.cache not in cls.MODES:
            raise EngineError(
                f"cache '{config.cache}' does not apply to a block-causal model; use 'prefix' (exact) or 'none'"
            )
        if not config.align_blocks:
            raise EngineError("a block-causal model decodes whole aligned blocks: align_blocks must stay on")

    def plan(self, iteration: int, block_index: int, start: int, end: int) -> ForwardPlan:
        if self.mode != "prefix":
            return ForwardPlan(FULL, 0, end)
        self.block_start = start
        return ForwardPlan(PREFIX, start if self.pending is None else self.pending, end)

    def forward(
        self, model: DiffusionLM, plan: ForwardPlan, block_index: int, *, masked: torch.Tensor | None = None,
        shadow: tuple[int, int] | None = None, **inputs: torch.Tensor,
    ) -> ModelOutput:
        if shadow is not None:
            check_shadow_support(model)  # refuses: no shadow block under a block-causal mask
        if plan.kind == FULL:
            return model(**inputs, attention_mask=self.mask[: plan.end, : plan.end])
        out = self._cached(model, plan.start, plan.end, inputs)
        block = self.block_start
        if self.pending is not None:  # the committed positions fed ahead of the block: store their K/V
            self._write(out.kv[..., : block - plan.start, :], plan.start, block)
            self.pending = None
            if self.prompt_blocks is not None and self.prefixes is not None:
                self.prefixes.insert(self.config.block_length, self.prompt_blocks, self.store[..., : len(self.prompt_blocks), :])
                self.prompt_blocks = None
        self.last_kv, self.last_input_masked = out.kv[..., block - plan.start :, :], (True if masked is None else masked.any())
        return out

    def revised(self, changed: torch.Tensor) -> None:
        """The last forward's K/V no longer match the block's tokens: `block_done` recomputes them."""
        if self.last_input_masked is not None:
            self.last_input_masked = self.last_input_masked | changed.any()

    def _cached(self, model: DiffusionLM, a: int, e: int, inputs: dict[str, torch.Tensor]) -> ModelOutput:
        """Queries `[a, e)` (the pending positions, then the block) against the store's `[0, a)`
        under the block-causal mask; keys from `e` on are masked out."""
        if self.store is None:  # nothing stored yet: the queries are the only keys
            return model(**inputs, replace=(a, e), attention_mask=self.mask[a:e, a:e], use_cache=True)
        return model(**inputs, past_kv=self.store, replace=(a, e), attention_mask=self.mask[a:e], use_cache=True)

    def _write(self, kv: torch.Tensor, s: int, e: int) -> None:
        if self.store is None:
            self.store = kv.new_zeros(*kv.shape[:4], self.length, kv.shape[5])
        self.store[:, :, :, :, s:e] = kv

    def exact_logits(self, model: DiffusionLM, s: int, e: int, inputs: Inputs) -> torch.Tensor:
        return model(**inputs(0, e), attention_mask=self.mask[:e, :e]).logits[:, s:e]

    def prefill(self, model: DiffusionLM, first: int, inputs: Inputs) -> int:
        """The prompt's `[0, first)` is pending: the first block's first forward stores it. With
        the requests' `prefixes` (one row), its longest stored run of whole blocks is copied in
        and only the rest is pending; the forward that stores the rest hands the blocks back."""
        if self.mode != "prefix" or first == 0:
            return 0
        self.pending = 0
        ids = inputs(0, first).get("input_ids")
        if self.prefixes is None or ids is None or ids.shape[0] != 1:
            return 0
        self.prompt_blocks = ids[0].tolist()
        kv = self.prefixes.lookup(self.config.block_length, self.prompt_blocks)
        if kv is not None:
            reused = kv.shape[4]
            self._write(kv, 0, reused)
            self.pending = reused if reused < first else None
            if self.pending is None:
                self.prompt_blocks = None  # all of it came from the store
        return 0

    def block_done(self, model: DiffusionLM, s: int, e: int, inputs: Inputs) -> tuple[int, int]:
        """Store the block's last K/V if they are its final tokens', else leave it pending."""
        if self.mode != "prefix":
            return 0, 0
        if self.last_kv is None or bool(self.last_input_masked):  # the host sync
            self.pending = s if self.pending is None else self.pending
        else:
            self._write(self.last_kv, s, e)
        self.last_kv = self.last_input_masked = None
        return 0, 1


def staleness(cached: torch.Tensor, exact: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position `[B, W]`: KL(exact || cached) of the next-token distributions, and whether the
    two top-1 tokens agree. Logits `[B, W, V]`; [MASK] is excluded as every decoder excludes it."""
    # fp64 copies: the caller's logits stay untouched, and rounding stays far below any real gap
    exact, cached = exact.to(torch.float64, copy=True), cached.to(torch.float64, copy=True)
    exact[..., mask_id] = float("-inf")
    cached[..., mask_id] = float("-inf")
    log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(cached, -1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)  # 0 * log 0 = 0 at [MASK]
    return kl.float(), exact.argmax(-1) == cached.argmax(-1)
