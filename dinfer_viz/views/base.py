"""The contract of a diffusion kind's view, and the registry that picks a run's view once, from
its trace header's `kind` (docs/trace.md §2).

Every view the page draws of a run (grid, caption, cell states, the live canvas, raster,
per-iteration chart, cost panel, details panel, legend, explanation, exported frames, readout notes,
the settled-token count) is a method of its kind's `KindView`. The page-facing functions
(dinfer_viz/panes/grid.py, figures.py, details.py, export.py, readouts.py, explain.py, cost_figure.py)
ask `view_for(timeline)` and never test the kind themselves. A new kind is one more module under
dinfer_viz/views/ with a `@register` class, imported by dinfer_viz/views/__init__.py.

Views are stateless: one instance per kind, every method takes the timeline it draws.
"""

from __future__ import annotations

from typing import Any

from engine import EngineError
from engine.kinds import KINDS
from engine.step_state import has_step_state
from engine.trace import MASKED

from ..reading.timeline import Timeline

VIEWS: dict[str, "KindView"] = {}


def register(cls: type["KindView"]) -> type["KindView"]:
    """Class decorator: `cls` draws the runs whose header names `cls.kind`."""
    VIEWS[cls.kind] = cls()
    return cls


def view_of_kind(kind: str) -> "KindView":
    """The view of a diffusion kind by its name (engine.trace.MASKED, UNIFORM, ...). A kind this
    engine runs with no view of its own whose records keep no step state of their own
    (engine/step_state.py: a kind that fills a masked canvas, as engine/fill.py's) writes masked
    diffusion's records, so masked diffusion's view draws it; a kind the engine does not know is refused."""
    if kind in VIEWS:
        return VIEWS[kind]
    if kind in KINDS and not has_step_state(kind):
        return VIEWS[MASKED]
    raise EngineError(f"this app has no view for the diffusion kind {kind!r} (it has {', '.join(sorted(VIEWS))})")


def view_for(timeline: Timeline | None) -> "KindView":
    """The view of `timeline`'s run, from its trace header's kind (None, before any run: masked's,
    the page's default)."""
    return view_of_kind(MASKED if timeline is None else timeline.kind)


class KindView:
    """What a kind's views draw. Iterations are record indices (-1: before the first forward), as
    everywhere in Timeline; `expected` is the answer's ids from the prompt's end."""

    kind: str = ""
    label = ""  # the kind in a few words, as labels name it ("masked", "uniform-state")
    # the header's `mask_id` in words: the masked kind's [MASK], a uniform-state run's pad
    mask_word = "[MASK]"
    # the run's records carry `cost` (docs/trace.md §3); a kind whose records do not draws its
    # forwards' times in the cost panel instead (`forward_costs`)
    records_cost = True
    # the model runs its kind's own sampler whatever decoder the page's controls name, so the
    # explanation panel shows what ran (the Run tab asks)
    runs_own_sampler = False

    def finality_notes(self, timeline: Timeline) -> list[str]:
        """What the analyses' finality (docs/analysis.md §3.1) approximates for a run of this kind."""
        return []

    # ---- grid ---------------------------------------------------------------------------------
    def grid_value(self, timeline: Timeline, iteration: int, expected: list[int] | None) -> dict:
        """Cells and caption after record `iteration` (clamped), as grid.GRID_TEMPLATE renders them."""
        raise NotImplementedError

    def caption(self, timeline: Timeline, iteration: int, total: int) -> str:
        """What record `iteration` (>= 0) did, of `total` iterations."""
        raise NotImplementedError

    def cell_state(self, timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
        """Position `p`'s state (a cells.CELL_COLOURS key) after record `iteration`."""
        raise NotImplementedError

    def live_fields(self, timeline: Timeline, shown: int, since: int, expected: list[int] | None, canvas: list[list]) -> dict[str, Any]:
        """A live frame's kind-specific fields (grid.LiveGrid: `commits`, `revisions`, `canvas`
        when the page needs it, `block`, `top1`, `conf`, `win`) for the first `shown` records to a
        page holding the first `since` (-1: nothing); `canvas`: the cells before the first forward."""
        raise NotImplementedError

    def legend_states(self, timeline: Timeline | None) -> list[tuple[str, str]]:
        """(state, label) the grid's legend shows for this kind's run (None: before any run)."""
        raise NotImplementedError

    def legend_html(self, timeline: Timeline | None) -> str:
        raise NotImplementedError

    # ---- figures --------------------------------------------------------------------------------
    def raster(self, timeline: Timeline, upto: int | None, highlight: int | None, last_rows: int | None, expected: list[int] | None) -> Any:
        """Iteration x position heatmap of what the kind's rule read, its decisions marked."""
        raise NotImplementedError

    def iteration_chart(self, timeline: Timeline, upto: int | None, highlight: int | None) -> Any:
        """Per iteration: what the step did (counts), the rule's parameters, the step times."""
        raise NotImplementedError

    def forward_costs(self, timeline: Timeline) -> tuple[str, dict[str, str]]:
        """For a kind whose records carry no `cost`: the cost panel's title (its forwards counted)
        and the name of each record `forward` in its legend."""
        raise NotImplementedError

    def cost_note(self, timeline: Timeline) -> str:
        """For a kind whose records carry `cost`: a line the cost panel adds under its title (the
        forwards a step's cost sums, when a step runs several), or "" for none."""
        return ""

    # ---- text -----------------------------------------------------------------------------------
    def details(self, timeline: Timeline, position: int, iteration: int, expected: list[int] | None) -> str:
        """The details panel's HTML for `position` after record `iteration` (both within the run)."""
        raise NotImplementedError

    def explanation(self, decoder_text: str, cache: str, smoothing: bool, unroll: bool, options: list[str]) -> str:
        """The explanation panel's markdown: `decoder_text` (the decoder's own paragraph), what the
        kind makes of the cache mode and iteration features, the system options' `options`."""
        raise NotImplementedError

    def settings_words(self, config: Any) -> list[str]:
        """A run's canvas settings in a few words, for labels (a GenerationConfig: "cache prefix", "block 32")."""
        raise NotImplementedError

    def readout_notes(self, timeline: Timeline) -> list[str]:
        """Markdown lines under the speed readout that this kind's figures need."""
        return []

    def settled_tokens(self, timeline: Timeline, records: int) -> int:
        """The tokens (end-of-text excluded) a reader would see settled after the first `records`
        records, from the records' own commits and `final_until`."""
        raise NotImplementedError

    # ---- exported frames ------------------------------------------------------------------------
    def frame_title(self, timeline: Timeline, index: int) -> str:
        """An exported frame's first line for record `index` (>= 0)."""
        raise NotImplementedError

    def frame_legend_states(self, timeline: Timeline) -> tuple[str, ...]:
        """The states an exported frame's legend names."""
        raise NotImplementedError
