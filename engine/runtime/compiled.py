"""Static-shape forwards: torch.compile and CUDA graphs over bucketed shapes.

`CompiledLM` is a model with the same interface in front of the real one: every call runs at one
of a few padded sizes (`bucket`), masked so the logits are the unpadded forward's, compiled
(`compile`) and/or captured and replayed (`cuda_graphs`), its compiles, captures and replays
counted (`ForwardCounters`, read by the loop through `forward_counters`). Why shapes vary, the
buckets, the masking, the capture-safe MoE path and the costs: docs/algorithms.md §6.5.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ..errors import EngineError
from ..trace import MASKED, UNIFORM
from ..models.base import DiffusionLM, ForwardCounters, ModelOutput
from ..models.layers import QuerySlots, RotaryEmbedding, query_range
from ..models.moe import SparseMoE

# Bucket sizes: 2^k · {1, 1.25, 1.5, 1.75} from 32 on (32, 40, 48, 56, 64, 80, ...), so padding
# adds at most a quarter and every size is a multiple of 8; four sizes per octave keep the number
# of graphs a generate needs small.
SMALLEST_BUCKET = 32
QUARTERS = (4, 5, 6, 7)
# Dynamo keeps at most `recompile_limit` graphs per function before it silently falls back to
# eager; every bucket of every compiled engine in this process is one of them.
RECOMPILE_LIMIT = 512


def bucket(n: int) -> int:
    """The static size a dimension of length `n` is padded to."""
    octave = SMALLEST_BUCKET
    while True:
        for quarters in QUARTERS:
            if octave * quarters // 4 >= n:
                return octave * quarters // 4
        octave *= 2


def check_options(device: str | torch.device, compile: Any, cuda_graphs: Any, world: int = 1) -> None:
    """Refuse, before anything is loaded, static-shape options this device or layout cannot take."""
    if not isinstance(compile, bool) or not isinstance(cuda_graphs, bool):  # they may come from JSON
        raise EngineError(f"compile and cuda_graphs must be true or false, got compile={compile!r}, cuda_graphs={cuda_graphs!r}")
    if cuda_graphs and torch.device(device).type != "cuda":
        raise EngineError(f"cuda_graphs needs a CUDA device; this engine runs on {torch.device(device).type}")
    if cuda_graphs and world > 1:
        raise EngineError("cuda_graphs with tp_size or ep_size > 1 is not supported (each rank would capture its all-reduces)")


@contextlib.contextmanager
def _capture_safe(moes: list[SparseMoE]) -> Iterator[None]:
    """The MoE layers in their capture-safe form for the static forward only: whoever else runs
    the same model (an eager engine, a benchmark's reference) keeps the routed loop."""
    for moe in moes:
        moe.capture_safe = True
    try:
        yield
    finally:
        for moe in moes:
            moe.capture_safe = False


# The padded forward: (input ids or embeddings, scratch store or None, query slots, key mask, use_cache).
StaticForward = Callable[[torch.Tensor, torch.Tensor | None, QuerySlots, torch.Tensor, bool], ModelOutput]


class CapturedForward:
    """One bucket's CUDA graph: fixed input buffers, the bucket's scratch store, fixed outputs."""

    def __init__(self, run: StaticForward, inputs: torch.Tensor, past: torch.Tensor | None, slots: QuerySlots,
                 mask: torch.Tensor, use_cache: bool, pool: Any) -> None:
        self.inputs, self.mask = inputs.clone(), mask.clone()
        self.slots = slots.clone() if isinstance(slots, torch.Tensor) else slots
        args = (self.inputs, past, self.slots, self.mask, use_cache)
        # Warm up on a side stream, as capture requires: compiles, and lets cuBLAS and the
        # allocator set up outside the graph.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = run(*args)

    def replay(self, inputs: torch.Tensor, slots: QuerySlots, mask: torch.Tensor) -> ModelOutput:
        self.inputs.copy_(inputs)
        if isinstance(slots, torch.Tensor):
            self.slots.copy_(slots)
        self.mask.copy_(mask)
        self.graph.replay()
        return self.out


class CompiledLM(DiffusionLM):
    """`model` behind static-shape forwards: the same interface and, up to rounding, the same
    logits; compiled with `compile`, captured and replayed with `cuda_graphs` (module docstring)."""

    def __init__(self, model: DiffusionLM, compile: bool = True, cuda_graphs: bool = False) -> None:
        check_options(model.device, compile, cuda_graphs)
        super().__init__()
        self.inner = model
        self.config, self.block_causal = model.config, model.block_causal  # what the engine reads of a model
        self.counters = ForwardCounters()
        self._moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
        self._ropes = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
        # Positions are looked up in the rotary tables inside the graph, where growing them would
        # be a new shape: size them for the longest canvas now (others grow on first use).
        self._reserve(bucket(model.max_positions + 1) if model.max_positions else 0)
        self._run: StaticForward = self._static_forward
        if compile:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT)
            self._run = torch.compile(self._static_forward, backend=self._count_compile, dynamic=False)
        self._graphs: dict[tuple, CapturedForward] | None = {} if cuda_graphs else None
        self._pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self._scratch: dict[tuple, torch.Tensor] = {}
        # every static call signature run so far: one compiled graph (and one CUDA graph) each
        self.buckets: set[tuple] = set()

    def embedding_weight(self) -> torch.Tensor:
        return self.inner.embedding_weight()

    def forward_counters(self) -> ForwardCounters:
        return dataclasses.replace(self.counters)

    def comm_seconds(self) -> float:
        return self.inner.comm_seconds()

    def layer_modules(self) -> nn.ModuleList:
        """No layers to hook: a compiled or captured forward cannot stop between layers (nor run
        hooks there without a graph break), so a cancel is seen between iterations."""
        return nn.ModuleList()

    def _count_compile(self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        """The inductor backend, counting each graph dynamo hands it (this engine's compiles)."""
        self.counters.compiles += 1
        return torch._dynamo.lookup_backend("inductor")(graph, example_inputs)

    def _reserve(self, positions: int) -> None:
        for rope in self._ropes:
            rope.table(positions, self.device)

    def _static_forward(self, inputs: torch.Tensor, past: torch.Tensor | None, slots: QuerySlots, mask: torch.Tensor, use_cache: bool) -> ModelOutput:
        ids = inputs.dtype == torch.long
        return self.inner(
            input_ids=inputs if ids else None, inputs_embeds=None if ids else inputs, past_kv=past, replace=slots,
            use_cache=use_cache, attention_mask=mask, persist=past is not None,
        )

    def _scratch_store(self, past: torch.Tensor, slots: int) -> torch.Tensor:
        """The zeroed scratch store of this shape with `slots` slots; one per shape, so its address
        is fixed (a captured graph reads it) and everything ever written to it is finite."""
        shape = (*past.shape[:4], slots, past.shape[5])
        key = (shape, past.dtype)
        if key not in self._scratch:
            self._scratch[key] = past.new_zeros(shape)
        return self._scratch[key]

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_kv: torch.Tensor | None = None,
        replace: tuple[int, int] | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
        persist: bool = False,
    ) -> ModelOutput:
        x = input_ids if inputs_embeds is None else inputs_embeds
        q = x.shape[1]
        a, b = query_range(replace, q, persist, past_kv)
        rows = bucket(q)
        padding = x.new_full((x.shape[0], rows - q), self.mask_token_id) if inputs_embeds is None else x.new_zeros((x.shape[0], rows - q, x.shape[2]))
        inputs = torch.cat([x, padding], dim=1)
        device = x.device
        if past_kv is None:  # the rows attend among themselves
            keys, real, past, slots = rows, q, None, (a, a + rows)
        else:
            real = past_kv.shape[4]
            keys = bucket(real + 1)
            past = self._scratch_store(past_kv, keys)
            past[:, :, :, :, :real].copy_(past_kv)
            slots = torch.cat([torch.arange(a, b, device=device), torch.full((rows - q,), real, device=device)])
        self._reserve(max(keys, a + rows))
        mask = (torch.arange(keys, device=device) < real).expand(rows, keys).clone()
        if attention_mask is not None:  # the caller's `[q, T]` (or broadcastable `[..., 1, T]`) pattern
            mask[:q, :real] &= attention_mask.reshape(attention_mask.shape[-2:])
        out = self._forward_bucket(inputs, past, slots, mask, use_cache)
        if persist:
            past_kv[:, :, :, :, a:b].copy_(past[:, :, :, :, a:b])
        logits, kv = out.logits[:, :q], out.kv[..., :q, :] if use_cache else None
        if self._graphs is not None:  # the next replay overwrites a graph's outputs: hand out copies
            logits, kv = logits.clone(), None if kv is None else kv.clone()
        return ModelOutput(logits=logits, kv=kv)

    def _forward_bucket(self, inputs: torch.Tensor, past: torch.Tensor | None, slots: QuerySlots, mask: torch.Tensor, use_cache: bool) -> ModelOutput:
        """Run (or replay) the padded forward; what compiles or captures is timed and counted."""
        before = dataclasses.replace(self.counters)
        start = time.perf_counter()
        key = (inputs.dtype, tuple(inputs.shape), None if past is None else tuple(past.shape), slots if isinstance(slots, tuple) else "slots", use_cache)
        self.buckets.add(key)
        with _capture_safe(self._moes):
            if self._graphs is None:
                out = self._run(inputs, past, slots, mask, use_cache)
            else:
                graph = self._graphs.get(key)
                if graph is None:
                    graph = self._graphs[key] = CapturedForward(self._run, inputs, past, slots, mask, use_cache, self._pool)
                    self.counters.captures += 1
                out = graph.replay(inputs, slots, mask)
                self.counters.replays += 1
        done = self.counters.since(before)
        if done.compiles or done.captures:
            self.counters.compile_seconds += time.perf_counter() - start
        return out


class CompiledDenoiser(nn.Module):
    """A uniform-state model (engine/kinds/uniform.py) with its denoising forward, the one the loop
    runs every step, through torch.compile; the kind and every other call the loop makes are the
    wrapped model's. Its canvas is one fixed width, so the shapes are static without buckets; the
    prompt's encoder forward runs once per canvas, eagerly."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.counters = ForwardCounters()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._denoise = torch.compile(model.denoise, backend=self._count_compile, dynamic=False)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules (`inner`)
        except AttributeError:
            return getattr(self.inner, name)  # the kind, its special ids, its loop calls

    def _count_compile(self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        self.counters.compiles += 1
        return torch._dynamo.lookup_backend("inductor")(graph, example_inputs)

    def forward_counters(self) -> ForwardCounters:
        return dataclasses.replace(self.counters)

    def layer_modules(self) -> nn.ModuleList:
        """No layers to hook (a compiled forward cannot stop between layers): a cancel is seen between steps."""
        return nn.ModuleList()

    def pack_key(self, method: str, inputs: dict[str, Any]) -> None:
        """Its calls run alone on a server (engine/serving/packed.py), as a static-shape masked
        forward does: a packed call would run the eager network, not this compiled one."""
        return None

    def denoise(self, canvas: torch.Tensor, cache: Any, masks: dict, position_ids: torch.Tensor, self_conditioning: torch.Tensor | None) -> torch.Tensor:
        """The wrapped model's `denoise` (the same arguments, which a server's route passes by name), compiled."""
        before = self.counters.compiles
        start = time.perf_counter()
        logits = self._denoise(canvas, cache, masks, position_ids, self_conditioning)
        if self.counters.compiles > before:
            self.counters.compile_seconds += time.perf_counter() - start
        return logits


# The static-shape wrapper of each diffusion kind (the runtime wraps the loop's model; the loop, one
# floor below, knows no wrapper). A kind without one lists no compile or CUDA-graph option in its
# KindSettings, so it is refused before any load.
_WRAPPERS: dict[str, Callable[[DiffusionLM, bool, bool], nn.Module]] = {
    MASKED: CompiledLM,
    UNIFORM: lambda model, compile, cuda_graphs: CompiledDenoiser(model),  # compile only (its declaration)
}


def static_shape_model(model: DiffusionLM, compile: bool, cuda_graphs: bool) -> nn.Module:
    """`model` behind its kind's wrapper: a masked model's bucketed forwards (`CompiledLM`), a
    uniform-state model's compiled denoiser (`CompiledDenoiser`)."""
    return _WRAPPERS[model.diffusion_kind](model, compile, cuda_graphs)
