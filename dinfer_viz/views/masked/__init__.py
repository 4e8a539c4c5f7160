"""The masked-diffusion kind's view (engine/kinds/masked.py): positions start as [MASK] and a
decoder commits them, a revising decoder may edit or remask its commits. Its grid, figures and
details panel are this package's modules; this class is what the page asks."""

from __future__ import annotations

from typing import Any

from engine.cache_modes import cache_mode
from engine.trace import MASKED

from ...drawing.cache_figure import cache_rule_markdown
from ...drawing.cells import CELL_COLOURS, CELL_MARKS, PINNED, inert_markdown, legend_block
from ...drawing.constraint import constraint_marks
from ...reading.timeline import Timeline, iteration_number
from ..base import KindView, register
from . import masked_details, masked_figures, masked_grid

# the states a revising decoder adds: the legend shows them for its runs only
REVISION_STATES = ("edited", "remasked")
MARKS = ("blk", "win", "anchor", "wrong")
# the masked kind's own states, in the legend's order (cells.CELL_COLOURS holds them first)
STATES = ("prompt", PINNED, "masked", "old", "new", "forced", "fill", *REVISION_STATES)
FRAME_STATES = ("prompt", PINNED, "masked", "old", "new", "forced")

SMOOTHING = (
    "**Iteration smoothing** feeds still-masked positions the [MASK] embedding plus a weighted "
    "expectation of the last prediction's embeddings, so information carries across iterations; the "
    "threshold starts at 1 and decays to τ (the threshold line in the per-iteration chart)."
)
UNROLLING = (
    "**Loop unrolling** queues several iterations between host checks of \"any mask left?\", removing "
    "device syncs; iterations queued after a block completes are no-ops but count as forwards."
)
READING = (
    "*Reading the views:* the grid shows the canvas after the selected iteration (hover a cell for its "
    "token, confidence and commit iteration; the yellow bar is the model's current confidence); the "
    "raster is iteration × position confidence of positions still masked, with the commits marked."
)


def revises(timeline: Timeline | None) -> bool:
    """The run's decoder may revise its commits: the header's declared capability (so a live grid's
    legend is the same from its first frame to its last: a legend that changed mid-run would
    redraw the grid and drop the live renderer's cells), else what its records say (an upgraded
    old trace's header may not know)."""
    if timeline is None:
        return False
    declared = timeline.capabilities.get("revises")
    return bool(declared) if declared is not None else timeline.revises


def _states_of(timeline: Timeline | None, states: tuple[str, ...], revising: bool) -> tuple[str, ...]:
    """The `states` a legend names for `timeline`'s run: the revision states for a decoder that
    revises, the pinned state for a request that pinned text (a live run knows both from its header)."""
    pins = timeline is not None and bool(timeline.pinned)
    return tuple(k for k in states if (revising or k not in REVISION_STATES) and (pins or k != PINNED))


@register
class MaskedView(KindView):
    kind = MASKED
    label = "masked"

    def finality_notes(self, timeline: Timeline) -> list[str]:
        notes = ["a masked position outside the step's block has a prediction the trace does not hold: it counts as not final"]
        if float((timeline.trace.config or {}).get("temperature") or 0) > 0:
            notes.append("with temperature > 0 a record's top-1 is the sampled candidate, not the argmax")
        return notes

    def grid_value(self, timeline: Timeline, iteration: int, expected: list[int] | None) -> dict:
        return {"cells": masked_grid.masked_cells(timeline, iteration, expected)}

    def caption(self, timeline: Timeline, iteration: int, total: int) -> str:
        return masked_grid.masked_caption(timeline, iteration, total)

    def cell_state(self, timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
        return masked_grid.cell_state(timeline, canvas, p, iteration)

    def live_fields(self, timeline: Timeline, shown: int, since: int, expected: list[int] | None, canvas: list[list]) -> dict[str, Any]:
        return masked_grid.live_fields(timeline, shown, since, expected, canvas)

    def legend_states(self, timeline: Timeline | None) -> list[tuple[str, str]]:
        return [(k, CELL_COLOURS[k][1]) for k in _states_of(timeline, STATES, revises(timeline))]

    def legend_html(self, timeline: Timeline | None) -> str:
        return legend_block(self.legend_states(timeline), constraint_marks(timeline, MARKS), "confidence now")

    def raster(self, timeline: Timeline, upto: int | None, highlight: int | None, last_rows: int | None, expected: list[int] | None) -> Any:
        return masked_figures.confidence_raster(timeline, upto, highlight, last_rows, expected)

    def iteration_chart(self, timeline: Timeline, upto: int | None, highlight: int | None) -> Any:
        return masked_figures.iteration_chart(timeline, upto, highlight)

    def details(self, timeline: Timeline, position: int, iteration: int, expected: list[int] | None) -> str:
        return masked_details.position_details(timeline, position, iteration, expected)

    def explanation(self, decoder_text: str, cache: str, smoothing: bool, unroll: bool, options: list[str]) -> str:
        mode = cache_mode(cache)
        parts = [decoder_text, mode.explanation if mode is not None else f"**{inert_markdown(cache)} cache.** No explanation written for this cache mode yet."]  # a trace file's name
        if mode is None or not mode.exact:  # what a cache costs in forwards, and why a short canvas hides its saving
            parts.append(cache_rule_markdown(cache))
        if smoothing:
            parts.append(SMOOTHING)
        if unroll:
            parts.append(UNROLLING)
        return "\n\n".join([*parts, *options, READING])

    def settings_words(self, config: Any) -> list[str]:
        return [f"cache {config.cache}", f"block {config.block_length}"]

    def settled_tokens(self, timeline: Timeline, records: int) -> int:
        """Commits so far that are not an end-of-text id (a revision changes no count: docs/counting.md §10)."""
        return sum(
            rec.top1[timeline.row][p - rec.block_range[0]] not in timeline.trace.eos_ids
            for rec in timeline.records[:records] for p in rec.committed[timeline.row]
        )

    def frame_title(self, timeline: Timeline, index: int) -> str:
        rec = timeline.records[index]
        s, e = rec.block_range
        committed, forced = len(rec.committed[timeline.row]), len(rec.forced[timeline.row])
        return (
            f"iteration {iteration_number(index)}/{timeline.iterations} · block {rec.block} [{s}, {e}) · {rec.forward} forward · committed {committed}"
            + (f" ({forced} forced)" if forced else "") + masked_grid.revised_summary(timeline, index)
        )

    def frame_legend_states(self, timeline: Timeline) -> tuple[str, ...]:
        return _states_of(timeline, FRAME_STATES + REVISION_STATES, timeline.revises)


assert all(k in CELL_COLOURS for k in STATES) and all(k in CELL_MARKS for k in MARKS)
