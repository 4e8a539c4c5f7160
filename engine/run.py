"""The run skeleton every diffusion kind shares (docs/algorithms.md §1): the canvas (a masked one,
`masked_canvas`) and its generator, the trace header and recorder, `on_start` before the clock,
cancel, each forward counted and metered (`metered`: its cost in the record, so every kind's cost
panel fills), the finality every kind that fills masks left to right shares (`first_open`), and the
output and stats. A kind (engine/kinds/) subclasses `DiffusionRun` and implements `run_blocks`, the
loop over its blocks; each of its steps ends in `emit`, which hands the step's record to the trace
and the caller. What the stats count: docs/counting.md.

A thread inside `forwards_routed(route)` runs solo runs whose every model call (the model's own
call, and the methods its family names in `DiffusionLM.routed_calls`) goes to `route` instead (the
server's continuous batching, engine/serving/scheduler.py, which runs several such runs' calls as
one packed call): the run itself, its decisions and its records, are the solo run's; only who
calls the model changes.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, TypeVar

import torch

from .config import CANVAS_BOUNDED, GenerationConfig, relative_bound
from .constraints import CanvasConstraint, Compiler, ConstraintSpec, spec_of
from .errors import EngineError
from .hooks import CancelFlag, RunHooks
from .infill import Layouts, answer_length, decoded_end, last_hole_starts, pinned_mask, row_layouts
from .models.base import DiffusionLM, ForwardCounters, ModelOutput
from .stats import GenerationStats, generated_mask
from .trace import IterationRecord, Trace

T = TypeVar("T")


class GenerationCancelled(EngineError):
    """Raised between steps, or between layers inside a forward, when the caller's cancel event is set."""


@dataclass
class GenerationOutput:
    canvas: torch.Tensor
    prompt_lengths: list[int]
    token_ids: list[list[int]]
    stats: GenerationStats
    trace: Trace | None


# Set once the process is shutting down (the app's SIGINT/SIGTERM): every run in it stops at its
# next step as a cancelled one does, so the caller can wait for no thread to be inside a forward
# when the interpreter exits (a torch thread pool torn down under one aborts the process:
# "terminate called without an active exception"). Checked between steps only: a hook between
# layers on every run would cost every forward, and change what a compiled forward traces.
_STOPPING = threading.Event()

# A model call handed elsewhere: route(model, the method called, its keyword arguments) -> its
# result. FORWARD: the model's own call (`model(**inputs)`); any other: one of the family's
# `DiffusionLM.routed_calls` (DiffusionGemma's encoder and denoising forwards).
FORWARD = "forward"
Route = Callable[[DiffusionLM, str, dict[str, Any]], Any]
_ROUTED = threading.local()  # `.route`: this thread's Route while inside forwards_routed


@contextlib.contextmanager
def forwards_routed(route: Route) -> Iterator[None]:
    """While inside, the runs this thread makes call `route` for each model forward (module
    docstring). The route runs the forward elsewhere and checks the run's cancel while the run
    waits for it: no hook between layers is set (a forward the route shares with other runs must
    not stop for this run's cancel)."""
    _ROUTED.route = route
    try:
        yield
    finally:
        _ROUTED.route = None


class RoutedModel:
    """`model` as a run inside `forwards_routed` sees it: its forwards (its call, and the methods
    it names in `routed_calls`) go to the route, everything else is the model's."""

    def __init__(self, model: DiffusionLM, route: Route) -> None:
        self._model, self._route = model, route

    def __call__(self, **inputs: Any) -> ModelOutput:
        return self._route(self._model, FORWARD, inputs)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._model, name)
        if name not in self._model.routed_calls:
            return found

        def routed_call(*args: Any, **kwargs: Any) -> Any:
            return self._route(self._model, name, dict(inspect.signature(found).bind(*args, **kwargs).arguments))

        return routed_call


def routed(model: DiffusionLM) -> DiffusionLM:
    """`model`, or its `RoutedModel` inside `forwards_routed`."""
    route = getattr(_ROUTED, "route", None)
    return model if route is None else RoutedModel(model, route)  # type: ignore[return-value]


@contextlib.contextmanager
def every_run_stopped() -> Iterator[None]:
    """While inside: every run of this process stops at its next step, and none starts (the
    process is shutting down; the caller waits here for its engine to be free). Cleared on the
    way out, so a process that goes on (a test calling the app's main) runs again."""
    _STOPPING.set()
    try:
        yield
    finally:
        _STOPPING.clear()


@contextlib.contextmanager
def cancel_between_layers(model: DiffusionLM, cancel: CancelFlag | None) -> Iterator[None]:
    """Check `cancel` before every layer of every forward, so that Stop ends even one long forward
    (a long canvas on a CPU) within one layer's time rather than at the next step."""
    if cancel is None or getattr(_ROUTED, "route", None) is not None:  # a routed run: the route checks it
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


def check_canvas(model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, max_tokens: int | None = None, layouts: Layouts | None = None) -> None:
    """Refuse, before any forward, an empty prompt or a canvas longer than the model's positions or
    the caller's limit (`layouts`: each row's pinned text counts too). Reads only the model's
    config, so a model skeleton (no weights) can answer it."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise EngineError("empty prompt")
    answer = max(answer_length(layout, config.gen_length) for layout in row_layouts(layouts, len(prompts)))
    canvas = max(len(p) for p in prompts) + answer
    pinned = f" + pinned text {answer - config.gen_length}" if answer > config.gen_length else ""
    limits = [(limit, why) for limit, why in ((model.max_positions, "the model's max_sequence_length"), (max_tokens, "this server's --max-tokens")) if limit]
    for limit, why in limits:
        if canvas > limit:
            raise EngineError(
                f"the canvas (prompt {max(len(p) for p in prompts)} + gen_length {config.gen_length}{pinned} = {canvas} tokens) "
                f"exceeds {why} ({limit}); shorten the prompt or the generation length"
            )
    for name in CANVAS_BOUNDED:  # a window past the canvas can change nothing (engine/config.py: `_setting`)
        bound, value = relative_bound(name, canvas), getattr(config, name)
        if value > bound:
            raise EngineError(f"{name} must be at most {bound} (the canvas, prompt + gen_length): more can change nothing, got {value}")


def row_constraints(config: GenerationConfig, hooks: RunHooks, rows: int) -> list[ConstraintSpec | None]:
    """Per row, its answer's constraint: the hooks' (a batch of requests with their own), else the config's."""
    if hooks.constraints is None:
        return [spec_of(config)] * rows
    if len(hooks.constraints) != rows:
        raise EngineError(f"{len(hooks.constraints)} constraints for {rows} rows")
    return list(hooks.constraints)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def masked_canvas(prompts: list[list[int]], gen_length: int, mask_id: int, layouts: Layouts | None = None, pad_id: int = 0) -> torch.Tensor:
    """`[B, longest prompt + answer]`: each prompt at the start of its row, [MASK] after it; a row
    with a layout (engine/infill.py) gets its area (holes of [MASK], pinned ids), then `pad_id`
    (end-of-text) to the canvas's width."""
    layouts = row_layouts(layouts, len(prompts))
    width = max(len(p) + answer_length(layout, gen_length) for p, layout in zip(prompts, layouts))
    x = torch.full((len(prompts), width), mask_id, dtype=torch.long)
    for row, (p, layout) in enumerate(zip(prompts, layouts)):
        x[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        if layout is not None:
            area = layout.area(mask_id)
            x[row, len(p) : len(p) + len(area)] = torch.tensor(area, dtype=torch.long)
            x[row, len(p) + len(area) :] = pad_id
    return x


def block_ranges(prompt_lengths: list[int], canvas_length: int, block_length: int, align: bool) -> list[tuple[int, int]]:
    """Blocks `[s, e)` from the shortest prompt's end (floored to a multiple of the block length
    when aligned) to the canvas end; the last may be shorter."""
    first = min(prompt_lengths)
    if align:
        first = first // block_length * block_length
    return [(s, min(s + block_length, canvas_length)) for s in range(first, canvas_length, block_length)]


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


def added_costs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cost of a step that ran forwards `a` and `b` (either may be None: not recorded)."""
    if a is None or b is None:
        return a or b
    summed = {k: [x + y for x, y in zip(a[k], b[k])] for k in ("compute_seconds", "comm_seconds")}
    return {**summed, "compile_seconds": a["compile_seconds"] + b["compile_seconds"], "compiles": a["compiles"] + b["compiles"],
            "captures": a["captures"] + b["captures"], "graph_replay": a["graph_replay"] or b["graph_replay"]}


@dataclass(frozen=True)
class Meter:
    """The model's running totals at one moment: its compile/graph counters and this process's
    time in all-reduces, read through the model interface (zero for a plain model)."""

    counters: ForwardCounters
    comm_seconds: float

    @classmethod
    def read(cls, model: DiffusionLM) -> "Meter":
        return cls(model.forward_counters(), model.comm_seconds())


class DiffusionRun:
    """One run of a kind: the state every kind keeps, and the parts of the loop they share.

    A subclass sets `kind` and implements `setup` (its state and canvas: `begin`) and `run_blocks`
    (the blocks, left to right, each step ending in `emit`); `prompt_lengths`, `canvas` and
    `mask_id` are what its header records."""

    kind: ClassVar[str] = ""

    def __init__(
        self, model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks, compiler: Compiler | None = None
    ) -> None:
        self.model, self.cfg, self.stop_ids, self.hooks, self.compiler = routed(model), config, stop_ids, hooks, compiler
        self.device = model.device
        self.generator = torch.Generator(self.device).manual_seed(config.seed)
        self.nfe = self.iteration = self.host_syncs = 0
        # the forwards (and their cost) since the last record: the next record's (`emit`)
        self.unrecorded_forwards, self.unrecorded_cost = 0, None
        self.excluded_seconds = 0.0  # trace recording, staleness probes, callbacks
        self.stats_extra: dict[str, Any] = {}  # a kind's own counters (a revising decoder's edits)
        self.setup(prompts)

    def setup(self, prompts: list[list[int]]) -> None:
        """The kind's own state for these prompts; it calls `begin` with its canvas before any forward."""
        raise NotImplementedError

    def begin(self, prompt_lengths: list[int], canvas: torch.Tensor, mask_id: int, capabilities: dict[str, bool]) -> None:
        """The run's canvas, its constraint and its trace header (a kind calls it once, from its
        `setup`, before any forward); each row's answer starts at its `prompt_lengths` entry, and
        the positions its layout pins (`pinned`, engine/infill.py) are no decoder's to change."""
        self.prompt_lengths, self.x, self.mask_id = prompt_lengths, canvas.to(self.device), mask_id
        self.pinned = pinned_mask(canvas, prompt_lengths, self.hooks.layouts).to(self.device)
        self.decoded_end = decoded_end(prompt_lengths, self.hooks.layouts, canvas.shape[1])
        self.last_hole = torch.tensor(last_hole_starts(prompt_lengths, self.hooks.layouts), device=self.device)
        self.constraint = CanvasConstraint.build(row_constraints(self.cfg, self.hooks, len(prompt_lengths)), self.compiler, prompt_lengths, canvas.shape[1])
        self.recorder = self.hooks.begin_trace(
            self.model, self.cfg, kind=self.kind, capabilities=capabilities, mask_id=mask_id, stop_ids=self.stop_ids,
            prompt_lengths=prompt_lengths, canvas_length=canvas.shape[1], block_length=self.cfg.block_length, initial=canvas.tolist(),
            pinned=[row.nonzero().flatten().tolist() for row in self.pinned.cpu()] if self.hooks.layouts is not None else None,
        )
        self.trace: Trace | None = self.recorder.trace if self.recorder is not None else None
        self.finished = torch.zeros(canvas.shape[0], dtype=torch.bool, device=self.device)  # rows ended by early stop (`stop_rows`)
        self.positions = torch.arange(canvas.shape[1], device=self.device).unsqueeze(0)
        self.prompt_end = torch.tensor(prompt_lengths, device=self.device).unsqueeze(1)

    def run_blocks(self) -> None:
        """The kind's loop over its blocks."""
        raise NotImplementedError

    def run(self) -> GenerationOutput:
        if self.hooks.on_start is not None and self.recorder is not None:  # before the clock starts
            self.hooks.on_start(self.recorder.header())
        meter = Meter.read(self.model)
        start = time.perf_counter()
        self.run_blocks()
        return self.output(start, meter)

    def metered(self, forward: Callable[[], T]) -> T:
        """Run one model forward (any: an encoder's, a draft's, a verify's, a denoise, a shadow
        block's): counted in `nfe` and in the next record's `forwards`, its cost added to that
        record's (docs/trace.md §3; measured only when recording: it syncs the device). Every
        model call of a run goes through here, so every reader of a run's forwards reads one count."""
        before = Meter.read(self.model) if self.records else None
        start = time.perf_counter()
        out = forward()
        self.nfe += 1
        self.unrecorded_forwards += 1
        if before is not None:
            sync(self.device)
            after = Meter.read(self.model)
            cost = forward_cost(time.perf_counter() - start, after.counters.since(before.counters), after.comm_seconds - before.comm_seconds)
            self.unrecorded_cost = added_costs(self.unrecorded_cost, cost)
        return out

    def first_open(self) -> list[int]:
        """Per row, the position before which its tokens are final when commits are: the first
        [MASK] after its prompt (the canvas's end when none is left)."""
        open_ = (self.x == self.mask_id) & (self.positions >= self.prompt_end)
        return torch.where(open_, self.positions, torch.full_like(self.positions, self.x.shape[1])).min(dim=1).values.tolist()

    def stop_rows(self, s: int, e: int) -> bool:
        """Early stop (docs/algorithms.md §1.4), the rule of every kind that writes text left to
        right: rows whose final tokens `[s, e)` hold a generated end-of-text id get it everywhere
        from `e` on, and take part in no later step (`finished`). Returns whether every row has
        finished (one host sync). The kind calls it when `early_stop` is on and `[s, e)` became final."""
        generated = (self.positions[:, s:e] >= self.prompt_end) & ~self.pinned[:, s:e]
        stop = torch.tensor(self.stop_ids, device=self.device)
        # a row with a hole after this block goes on (its later holes are not filled with end-of-text)
        self.finished |= (torch.isin(self.x[:, s:e], stop) & generated).any(dim=1) & (self.last_hole < e)
        fill = self.finished.unsqueeze(1) & ~self.pinned[:, e:]
        self.x[:, e:] = torch.where(fill, torch.full_like(self.x[:, e:], self.stop_ids[0]), self.x[:, e:])
        self.host_syncs += 1
        return bool(self.finished.all())

    def check_cancel(self) -> None:
        if _STOPPING.is_set() or (self.hooks.cancel is not None and self.hooks.cancel.is_set()):
            raise GenerationCancelled("generation cancelled")

    @property
    def records(self) -> bool:
        return self.recorder is not None

    def emit(self, record: IterationRecord, started: float) -> None:
        """Hand a step's record to the trace and to `on_iteration`, with the forwards the run made
        since the previous record and their cost; the time from `started` on counts as the
        trace's, not the run's."""
        record.forwards, record.cost = self.unrecorded_forwards, self.unrecorded_cost
        self.unrecorded_forwards, self.unrecorded_cost = 0, None
        self.recorder.append(record)
        if self.hooks.on_iteration is not None:
            self.hooks.on_iteration(record)
        self.excluded_seconds += time.perf_counter() - started

    def output(self, start: float, meter: Meter) -> GenerationOutput:
        """Token ids, stats (timed from `start`, minus excluded time; counted from `meter`) and the
        trace's footer."""
        keep = generated_mask(self.x, self.prompt_lengths, self.stop_ids, self.mask_id) & ~self.pinned
        token_ids = [row[k].tolist() for row, k in zip(self.x.cpu(), keep.cpu())]
        sync(self.device)
        seconds = time.perf_counter() - start - self.excluded_seconds
        end = Meter.read(self.model)
        done = end.counters.since(meter.counters)
        stats = GenerationStats(
            nfe=self.nfe,
            tokens=int(keep.sum()),
            seconds=seconds,
            batch=self.x.shape[0],
            trace_seconds=self.excluded_seconds,
            host_syncs=self.host_syncs,
            comm_seconds=end.comm_seconds - meter.comm_seconds,
            compiles=done.compiles,
            captures=done.captures,
            graph_replays=done.replays,
            compile_seconds=done.compile_seconds,
            **{k: v for k, v in self.stats_extra.items() if k in GenerationStats.__dataclass_fields__},
            counts={k: v for k, v in self.stats_extra.items() if k not in GenerationStats.__dataclass_fields__},
        )
        if self.recorder is not None:
            self.recorder.finish(self.x.cpu().tolist(), stats.to_dict(), self.excluded_seconds)
        return GenerationOutput(self.x, self.prompt_lengths, token_ids, stats, self.trace)
