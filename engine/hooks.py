"""What a run reports and obeys, as one object handed from the API to the loop (and across the
worker boundary): the trace switch, the two callbacks, the cancel flag and the caller's limits
(docs/trace.md §1 for what the callbacks receive)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Protocol

from .arguments import is_int, need, shown
from .constraints import ConstraintSpec
from .infill import Layout
from .trace import IterationRecord, TokenStrings, Trace, TraceRecorder

if TYPE_CHECKING:
    from .config import GenerationConfig


class CancelFlag(Protocol):
    """What the loop reads from `RunHooks.cancel`: a threading.Event, or a parallel rank's flag,
    which must answer each check alike on every rank (engine/runtime/workers.py: RankCancel)."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class RunHooks:
    """`trace`: keep the per-iteration trace (also on when either callback is set, or when the
    config measures staleness: the trace is where that goes). `on_start` gets the header before the
    first forward; `on_iteration` each record as it is made. `cancel`: checked between groups of
    iterations and between layers; when set the run raises GenerationCancelled. `max_tokens`: the
    caller's bound on the canvas (prompt + gen_length), besides the model's own and the Engine's
    (`Engine(max_tokens=...)`: the smaller applies). `model_name` names
    the model in the header and `token_strings` fills its `tokens` as ids appear (Engine passes
    both). `expected_ids`: an expected answer's ids, carried in the header (with their strings) for a
    viewer that marks where the run departs from it. `constraints`: per row, its answer's constraint
    when the rows of one call have their own (the server's batch of requests); None: the config's.
    `layouts`: per row, the text its request pins in its answer (engine/infill.py: a suffix, a
    template's holes), tokenised; None: plain masks (Engine.generate_ids makes them from the
    config's `suffix` or `template`)."""

    trace: bool = False
    on_start: Callable[[Trace], None] | None = None
    on_iteration: Callable[[IterationRecord], None] | None = None
    cancel: CancelFlag | None = None
    max_tokens: int | None = None
    model_name: str | None = None
    token_strings: TokenStrings | None = None
    expected_ids: list[int] | None = None
    constraints: tuple[ConstraintSpec | None, ...] | None = None
    layouts: tuple[Layout | None, ...] | None = None

    def __post_init__(self) -> None:
        """Each hook of its kind (engine/arguments.py: the API's edge): a wrong one is an
        EngineError in one line here, not an AttributeError mid-run."""
        need(isinstance(self.trace, bool), f"RunHooks.trace must be True or False, got {shown(self.trace)}")
        for name in ("on_start", "on_iteration", "token_strings"):
            value = getattr(self, name)
            need(value is None or callable(value), f"RunHooks.{name} must be a function or None, got {shown(value)}")
        need(self.cancel is None or callable(getattr(self.cancel, "is_set", None)), f"RunHooks.cancel must be a threading.Event (anything with is_set()) or None, got {shown(self.cancel)}")
        need(self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1), f"RunHooks.max_tokens must be a positive integer or None, got {shown(self.max_tokens)}")
        need(self.expected_ids is None or (isinstance(self.expected_ids, list) and all(is_int(i) or isinstance(i, list) for i in self.expected_ids)), f"RunHooks.expected_ids must be a list of token ids (one list per row), got {shown(self.expected_ids)}")
        if self.constraints is not None:
            need(isinstance(self.constraints, (tuple, list)) and all(c is None or isinstance(c, ConstraintSpec) for c in self.constraints),
                 f"RunHooks.constraints must be a tuple of ConstraintSpec or None (one per row), got {shown(self.constraints)}")
        if self.layouts is not None:
            need(isinstance(self.layouts, (tuple, list)) and all(x is None or isinstance(x, Layout) for x in self.layouts),
                 f"RunHooks.layouts must be a tuple of Layout or None (one per row), got {shown(self.layouts)}")

    def records(self, measure_staleness: bool = False) -> bool:
        """Whether the run keeps a trace."""
        return self.trace or self.on_start is not None or self.on_iteration is not None or measure_staleness

    def begin_trace(self, model: object, config: "GenerationConfig", *, kind: str, capabilities: dict[str, bool], mask_id: int, stop_ids: list[int],
                    prompt_lengths: list[int], canvas_length: int, block_length: int, initial: list[list[int]],
                    pinned: list[list[int]] | None = None) -> TraceRecorder | None:
        """The run's trace header, the one place a loop builds it (docs/trace.md §2), and its
        recorder; None when the run keeps no trace."""
        if not self.records(config.measure_staleness):
            return None
        trace = Trace(
            model=self.model_name or getattr(model, "name_or_path", type(model).__name__), kind=kind, capabilities=dict(capabilities),
            mask_id=mask_id, eos_ids=list(stop_ids), prompt_lengths=prompt_lengths, canvas_length=canvas_length,
            block_length=block_length, config=config.to_dict(), initial=initial, expected=self.expected_ids, pinned=pinned,
        )
        return TraceRecorder(trace, self.token_strings)

    def but(self, **changes: object) -> "RunHooks":
        """A copy with some hooks replaced (a layer adding its own name, limit or callbacks)."""
        return replace(self, **changes)


NO_HOOKS = RunHooks()
