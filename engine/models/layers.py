"""Building blocks shared by the model families: RMSNorm, rotary embeddings, attention with a
diffusion KV cache, SwiGLU.

The cache contract (see engine/cache.py): a model forward may be given `past_kv`, a tensor
`[n_layers, 2, B, H_kv, T, D]` holding keys and values for all `T` canvas positions, plus
`replace=(a, b)`: the query tokens are canvas positions `[a, b)` and their fresh K/V replace
that slice of the past, out of place (the stored cache is untouched), or in place with
`persist=True` (written into the store, and attention reads the store itself: no merged copy).
With a past, `replace` may instead be a `[q]` index tensor naming each query token's slot: the
form a static-shape forward takes (engine/runtime/compiled.py), whose positions change from call to call
while its shapes do not, so neither torch.compile nor a CUDA graph sees a new shape. Without a past,
an index tensor gives each query token's position, which may repeat one: a canvas with a copy of a
block appended (WINO's shadow block, engine/decoders/remasking.py), whose keys sit at the same positions.
The forward returns the fresh K/V of its query tokens when asked (`use_cache`), in the form the
cache holds them: keys before RoPE or after it, per family (`DiffusionLM.kv_rope`). Inside the
forward, each layer receives these arguments as one `AttentionCache` (its layer of the store), and
every family runs its attention through `cached_attention`, so the ordering lives in one place.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EngineError

# Where a forward's query tokens sit in the canvas: the range `(a, b)`, or (with a past) a `[q]`
# index tensor of their slots (the module docstring).
QuerySlots = tuple[int, int] | torch.Tensor


def token_embedding(vocab: int, hidden: int) -> nn.Embedding:
    """nn.Embedding(vocab, hidden) with torch's own initialisation (the same random draws), except
    on the meta device, where there is nothing to draw: torch's meta `normal_` imports torch._dynamo
    (a second of CPU), which every process building a model skeleton (loader._skeleton: the CLI, the
    app, each worker rank) would otherwise pay, and which none of them uses unless it compiles."""
    weight = torch.empty(vocab, hidden)
    if weight.device.type != "meta":
        nn.init.normal_(weight)
    return nn.Embedding.from_pretrained(weight, freeze=False)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back to the input dtype, then scaled (LLaDA/OLMo order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's rms_norm is x * rsqrt(mean(x²) + eps) in one call, bit for bit the same on the
        # CPU as those four operations, at half their dispatch cost (a small model's forward is dispatch)
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight


_TABLES_GROWING = threading.Lock()  # RotaryEmbedding.table: one growth at a time, in any model


class RotaryEmbedding(nn.Module):
    """NeoX rotate-half RoPE, tables in fp32, applied in fp32.

    `rotary_dim` may be smaller than the head dim (partial rotary): the remaining dims pass through.
    The cos/sin table is a non-persistent buffer grown on demand, so checkpoints never carry it.
    """

    def __init__(self, rotary_dim: int, theta: float) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.register_buffer("_cos", torch.empty(0), persistent=False)
        self.register_buffer("_sin", torch.empty(0), persistent=False)

    def table(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables, grown to cover positions `[0, length)` on `device` if they do not.
        Forwards may run on several threads at once (a CPU server's lanes): the pair is read once
        and checked whole, and grown under a lock, so no forward reads a pair half replaced or a
        table shrunk by another's growth."""
        cos, sin = self._cos, self._sin
        if cos.shape[0] < length or sin.shape[0] < length or not cos.device == sin.device == device:
            with _TABLES_GROWING:
                if self._cos.shape[0] < length or self._cos.device != device:
                    size = max(length, 2 * self._cos.shape[0], 256)
                    inv_freq = 1.0 / (
                        self.theta
                        ** (torch.arange(0, self.rotary_dim, 2, device=device, dtype=torch.float32) / self.rotary_dim)
                    )
                    freqs = torch.outer(torch.arange(size, device=device, dtype=torch.float32), inv_freq)
                    emb = torch.cat([freqs, freqs], dim=-1)
                    self._cos, self._sin = emb.cos(), emb.sin()
                cos, sin = self._cos, self._sin
        return cos, sin

    def forward(self, x: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """Rotate `x` `[B, H, T, D]` as if its tokens sit at positions `[start, start + T)`, or at
        the `T` positions of an index tensor `start` (which the table must already cover: growing
        it inside a compiled forward or a CUDA graph would be a new shape)."""
        length = x.shape[2]
        if isinstance(start, torch.Tensor):
            cos, sin = self._cos[start], self._sin[start]
        else:
            cos, sin = self.table(start + length, x.device)
            cos, sin = cos[start : start + length], sin[start : start + length]
        rot, rest = x[..., : self.rotary_dim].float(), x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        out = (rot * cos + rotated * sin).to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


def merge_past(past: torch.Tensor, fresh: torch.Tensor, replace: QuerySlots) -> torch.Tensor:
    """Keys (or values) `[B, H, T, D]` with positions `[a, b)` (or the slots of an index tensor)
    replaced by `fresh`, out of place."""
    if isinstance(replace, torch.Tensor):
        return past.index_copy(2, replace, fresh)
    a, b = replace
    return torch.cat([past[:, :, :a], fresh, past[:, :, b:]], dim=2)


def write_past(past: torch.Tensor, fresh: torch.Tensor, replace: QuerySlots) -> None:
    """`merge_past` in place: the store itself takes the fresh keys (or values)."""
    if isinstance(replace, torch.Tensor):
        past.index_copy_(2, replace, fresh)
    else:
        past[:, :, replace[0] : replace[1]] = fresh


@dataclass(frozen=True)
class AttentionCache:
    """One layer's share of a forward's cache arguments (the module docstring): the rotary table
    and where the cache holds keys relative to it (`kv_rope`), this layer's store `past`
    `[2, B, H_kv, T, D]` or None, the query tokens' `slots`, `persist`, the boolean
    attention `mask` (True = may attend) or None (or the `Segments` of packed rows), and the query tokens' `positions` where they
    differ from their slots (None: a token sits at its slot)."""

    rope: "RotaryEmbedding"
    kv_rope: str
    past: torch.Tensor | None
    slots: QuerySlots
    persist: bool
    mask: "torch.Tensor | Segments | None"
    positions: torch.Tensor | None = None


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of the query tokens at canvas positions `[a, b)` (or the slots of an index
    tensor `replace`, with a past; without one, their positions) over every canvas key.

    `q`, `k`, `v` `[B, H, q, D]` are the query tokens' projections, before RoPE. `cache.past`
    (one layer of the store) supplies the other positions' keys and values.
    `kv_rope="pre"` (dense LLaDA): the cache holds keys before RoPE, which is applied after the
    merge to all `T` keys at `[0, T)`, as LLaDA's own code does. `"post"` (the MoE families):
    each key is rotated once, at its absolute position, before it is cached (docs/algorithms.md §4.1).
    Returns the attention output `[B, H, q, D]` and the fresh (k, v) in the cache's form. Packed
    rows (`cache.mask` a `Segments`): `packed_attention`.
    """
    if isinstance(cache.mask, Segments):
        return packed_attention(q, k, v, cache)
    rope, past, slots = cache.rope, cache.past, cache.slots
    where = cache.positions if cache.positions is not None else slots if isinstance(slots, torch.Tensor) else slots[0]
    q = rope(q, where)
    if cache.kv_rope == "post":
        k = rope(k, where)
    elif cache.kv_rope != "pre":
        raise ValueError(f"kv_rope must be 'pre' or 'post', got {cache.kv_rope!r}")
    if past is None:
        keys, values = k, v
    elif cache.persist:
        write_past(past[0], k, slots)
        write_past(past[1], v, slots)
        keys, values = past[0], past[1]
    else:
        keys, values = merge_past(past[0], k, slots), merge_past(past[1], v, slots)
    if cache.kv_rope == "pre":
        # with a past the keys are the store's, at [0, T); positions given without one are the keys' own
        keys = rope(keys, where if past is None and isinstance(slots, torch.Tensor) else 0)
    return attend(q, keys, values, cache.mask), k, v


@dataclass(frozen=True)
class PackedRow:
    """One row of a packed forward (engine/serving/packed.py) with the cache arguments of its own
    forward: its `length` (query tokens), its store `past` (`[n_layers, 2, 1, H_kv, T, D]`, or one
    layer's `[2, 1, H_kv, T, D]` inside a layer) or None, its `slots`, `persist`, boolean `mask` and
    `positions`, as the module docstring says of a forward's."""

    length: int
    past: torch.Tensor | None
    slots: QuerySlots
    persist: bool
    mask: torch.Tensor | None
    positions: torch.Tensor | None


@dataclass(frozen=True)
class Segments:
    """The attention "mask" of rows packed into one sequence: each row's own cache arguments
    (`PackedRow`). A row's queries attend to its own keys only, through `cached_attention` with
    exactly the arguments of its solo forward, so the attention costs the rows' own (not the
    packed length squared) and each row's is its solo forward's; the projections and MLPs run once
    over every row's tokens."""

    rows: tuple[PackedRow, ...]

    def layer(self, index: int) -> "Segments":
        """The rows as layer `index` sees them: each row's store cut to that layer's."""
        return Segments(tuple(row if row.past is None else dataclasses.replace(row, past=row.past[index]) for row in self.rows))


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`cached_attention` of packed rows (`cache.mask` a `Segments`): each row's slice of `q`, `k`,
    `v` with its own cache arguments; the outputs and fresh K/V packed again."""
    outputs, keys, values, a = [], [], [], 0
    for row in cache.mask.rows:
        own = AttentionCache(cache.rope, cache.kv_rope, row.past, row.slots, row.persist, row.mask, row.positions)
        out, key, value = cached_attention(q[:, :, a : a + row.length], k[:, :, a : a + row.length], v[:, :, a : a + row.length], own)
        outputs.append(out)
        keys.append(key)
        values.append(value)
        a += row.length
    return torch.cat(outputs, dim=2), torch.cat(keys, dim=2), torch.cat(values, dim=2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Bidirectional SDPA with grouped-query heads (SDPA's own `enable_gqa`: the same result as
    repeating each K/V head, without the two copies); `attention_mask` is boolean (True = may attend)."""
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=False, enable_gqa=gqa)


def split_heads(t: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """`[B, T, heads·D]` -> `[B, heads, T, D]`."""
    b, q, _ = t.shape
    return t.view(b, q, heads, head_dim).transpose(1, 2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """`[B, heads, T, D]` -> `[B, T, heads·D]`."""
    b, _, q, _ = t.shape
    return t.transpose(1, 2).reshape(b, q, -1)


def query_range(
    replace: QuerySlots | None, q_len: int, persist: bool, past_kv: torch.Tensor | None
) -> QuerySlots:
    """The canvas range `[a, b)` of a forward's `q_len` query tokens (the whole input when no
    `replace` is given), or their slots as an index tensor, checked against the cache arguments
    every model family takes."""
    if persist and past_kv is None:
        raise EngineError("persist needs past_kv: it writes the fresh K/V into that store")
    if isinstance(replace, torch.Tensor):
        if replace.shape != (q_len,):
            raise EngineError(f"an index-tensor replace needs one slot per query token ({q_len}): its slot in past_kv, or without one its position")
        return replace
    replace = replace or (0, q_len)
    if replace[1] - replace[0] != q_len:
        raise EngineError(f"replace range {replace} does not match {q_len} query tokens")
    return replace
