"""What every model family offers the engine: the output type and the diffusion-model interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Hashable, Protocol

import torch
from torch import nn

from ..errors import EngineError
from .layers import AttentionCache, QuerySlots, Segments, query_range


@dataclass
class ModelOutput:
    """`logits` `[B, q, V]`; `kv` `[n_layers, 2, B, H_kv, q, D]` of the query tokens when asked."""

    logits: torch.Tensor
    kv: torch.Tensor | None = None
    # WINO's shadow block's logits `[B, W, V]`, when the forward ran one (engine/decoders/shadow.py)
    shadow_logits: torch.Tensor | None = None


@dataclass
class ForwardCounters:
    """What a model's static-shape forwards did since it was made (engine/runtime/compiled.py; a
    generate reports the differences): zero for a plain model."""

    compiles: int = 0  # graphs torch.compile compiled: one per new bucket, or a recompilation
    captures: int = 0  # CUDA graphs captured, one per new bucket
    replays: int = 0  # forwards that replayed a captured graph
    compile_seconds: float = 0.0  # wall time of the forwards that compiled or captured

    def since(self, before: "ForwardCounters") -> "ForwardCounters":
        return ForwardCounters(
            self.compiles - before.compiles, self.captures - before.captures, self.replays - before.replays,
            self.compile_seconds - before.compile_seconds,
        )


@dataclass(frozen=True)
class DerivedTensor:
    """A model tensor that a checkpoint stores in another layout: built by `build` from the
    checkpoint tensors named in `sources` (read in that order)."""

    sources: tuple[str, ...]
    build: Callable[[list[torch.Tensor]], torch.Tensor]


class CommClock(Protocol):
    def seconds(self) -> float: ...


class DiffusionLM(nn.Module):
    """Base class of the model families.

    Subclasses set `config` (a dict-like with `mask_token_id`, `eos_token_id`) and `rope`, and
    implement `embedding_weight()`, `layer_modules()` (each layer called as `layer(x, cache) ->
    (x, k, v)` with its `AttentionCache`) and `head()`; `forward` is the one stack every family
    runs (a family with another forward, e.g. transformers' own classes, overrides it).
    """

    # "pre" for dense LLaDA (cache holds keys before RoPE), "post" for the MoE families; read by
    # layers.cached_attention. Both give the same logits; mixing them up corrupts positions.
    kv_rope: str = "pre"
    # Parameter-name endings kept in fp32 whatever the model dtype (MoE routers run in fp32).
    fp32_suffixes: tuple[str, ...] = ()
    # True for LLaDA2: attention is block-causal and the prefix cache is exact.
    block_causal: bool = False
    # "masked": a position is [MASK] until committed (the LLaDA families, engine/kinds/masked.py);
    # "uniform": every position always holds a token, re-noised until accepted (DiffusionGemma,
    # engine/kinds/uniform.py). The engine's entry point runs the loop of the model's kind.
    diffusion_kind: str = "masked"
    # Whether this family's forward takes WINO's shadow block (engine/decoders/shadow.py: a copy of the block
    # appended, at positions given by `replace`, under the caller's attention mask): the families on
    # the engine's bidirectional layer stack say True. A class with a forward of its own (a wrapper,
    # another library's model) does not inherit it: it says so itself.
    takes_shadow_block: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in vars(cls) and "takes_shadow_block" not in vars(cls):
            cls.takes_shadow_block = False

    # Methods besides `forward` that run the network (a family with calls of its own: DiffusionGemma's
    # `encode` and `denoise`): a run inside engine.run.forwards_routed hands each call of them to its
    # route, as it does its forwards, so a server may run them with other runs' (`pack_key`).
    routed_calls: tuple[str, ...] = ()

    def pack_key(self, method: str, inputs: dict[str, Any]) -> Hashable | None:
        """Calls of `method` (one of `routed_calls`, its keyword arguments `inputs`) whose keys are
        equal may run as one (`run_packed`); None: this call runs alone."""
        return None

    def run_packed(self, method: str, calls: list[dict[str, Any]]) -> list[Any]:
        """Each call's result, from one call over them all (their `pack_key`s are equal)."""
        raise NotImplementedError(f"{type(self).__name__} packs no calls of {method}")

    # the clock of this process's all-reduces, set on a sharded model (engine/runtime/parallel.py)
    comm_clock: "CommClock | None" = None
    # the K/V of prompt blocks shared across requests (engine.cache.PrefixStore), which a server
    # sets on a block-causal model (docs/serving.md §3); None: each run computes its prompt's own
    prefix_store: Any = None

    def embedding_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def forward_counters(self) -> ForwardCounters:
        """Compiles, captures and replays of this model's forwards so far (a copy): the loop meters
        each forward's cost through this, so it never needs to know the runtime that wraps it."""
        return ForwardCounters()

    def comm_seconds(self) -> float:
        """Seconds this process has spent in all-reduces so far (0 for a model on one process)."""
        return self.comm_clock.seconds() if self.comm_clock is not None else 0.0

    def layer_modules(self) -> nn.ModuleList:
        """The transformer layers, in order (the engine checks for a cancel between them)."""
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the output projection: hidden states `[B, q, d]` -> logits."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_kv: torch.Tensor | None = None,
        replace: QuerySlots | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | Segments | None = None,
        persist: bool = False,
        positions: torch.Tensor | None = None,
    ) -> ModelOutput:
        """Logits of the query tokens (token ids or embeddings); the cache arguments as the
        layers module's docstring says, handed to each layer as its `AttentionCache`. `positions`
        (a `[q]` tensor, with an index-tensor `replace` and a past): each query token's position
        where it differs from its slot (a spare slot past the canvas holding a second token at a
        position: the speculative kind's verify queries, engine/kinds/speculative.py). Rows packed
        into one sequence (engine/serving/packed.py) pass their own cache arguments in a
        `Segments` mask, and none of their own here."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        slots = self.query_slots(x.shape[1], past_kv, replace, persist, positions)
        kvs = []
        for i, layer in enumerate(self.layer_modules()):
            mask = attention_mask.layer(i) if isinstance(attention_mask, Segments) else attention_mask
            cache = AttentionCache(self.rope, self.kv_rope, None if past_kv is None else past_kv[i], slots, persist, mask, positions)
            x, k, v = layer(x, cache)
            if use_cache:
                kvs.append(torch.stack([k, v]))
        return ModelOutput(logits=self.head(x), kv=torch.stack(kvs) if use_cache else None)

    def query_slots(self, q_len: int, past_kv: torch.Tensor | None, replace: QuerySlots | None, persist: bool, positions: torch.Tensor | None) -> QuerySlots:
        """The query tokens' slots (`query_range`), EngineError in one line for cache arguments
        this family's forward cannot take."""
        slots = query_range(replace, q_len, persist, past_kv)
        if positions is not None and (self.kv_rope != "post" or not isinstance(slots, torch.Tensor)):
            raise EngineError("positions apart from slots need keys cached after RoPE (kv_rope 'post') and an index-tensor replace")
        return slots

    @property
    def max_positions(self) -> int | None:
        """The longest canvas the checkpoint was made for (its config's `max_sequence_length` or
        `max_position_embeddings`), None when the config does not say."""
        for key in ("max_sequence_length", "max_position_embeddings"):
            value = self.config.get(key) if hasattr(self.config, "get") else None
            if isinstance(value, int) and value > 0:
                return value
        return None

    def checkpoint_sources(self, names: Collection[str]) -> dict[str, DerivedTensor]:
        """Model tensors the checkpoint (whose tensor `names` are given) stores in another layout,
        e.g. one tensor per MoE expert where the model stacks them. The loader builds these and
        still checks every name and shape strictly. Default: the checkpoint matches the model."""
        return {}

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.embedding_weight())

    @property
    def mask_token_id(self) -> int:
        return int(self.config["mask_token_id"])

    @property
    def eos_token_id(self) -> int:
        return int(self.config["eos_token_id"])

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id the checkpoint says ends a row, `eos_token_id` first (a config may list several)."""
        return [self.eos_token_id]

    @property
    def special_ids(self) -> dict[str, list[int]]:
        """The config's special ids by the name it gives them (the loader checks each names a row of
        the embedding)."""
        return {"eos_token_id": list(self.eos_token_ids), "mask_token_id": [self.mask_token_id]}

    @property
    def device(self) -> torch.device:
        return self.embedding_weight().device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding_weight().dtype
