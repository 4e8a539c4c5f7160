"""The details panel: everything the trace knows about one canvas position at one iteration, as
HTML large enough for a projector (what it shows: docs/app.md §2, "Details panel"). The panel is
drawn by the run's kind view (dinfer_viz/views/: a masked run's commit rules, a uniform-state run's
entropy bound); this module checks the request is inside the run first.

`iteration` is a record index as everywhere in Timeline (-1: before the first forward); the page's
numbers are `iteration_number`'s (1..N, 0 before the first forward).
"""

from __future__ import annotations

from ..drawing.panel import message_line
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for


def position_details(timeline: Timeline, position: int, iteration: int, expected: list[int] | None = None) -> str:
    """HTML panel for canvas `position` after record `iteration` (-1: before the first forward) of
    `timeline`; `expected`: token ids the generation should produce, from the prompt's end. A
    position or iteration the run does not have gives a one-line message."""
    if not isinstance(position, int) or not 0 <= position < timeline.canvas_length:
        return message_line(f"position {position} is outside the canvas (0 to {timeline.canvas_length - 1})")
    if not isinstance(iteration, int) or not -1 <= iteration < timeline.iterations:
        return message_line(f"iteration {iteration_number(iteration) if isinstance(iteration, int) else iteration} is outside this run (0 to {timeline.iterations})")
    return view_for(timeline).details(timeline, position, iteration, expected)
