"""The run on display: one object (`RunState`, the Run tab's gr.State) that every part of the page
showing a run reads, whatever the run is: live, stopped, failed, finished, or loaded (a trace file,
a shipped sample, a server's trace id, a sweep's wrong answer). The slider's range, the grid, the
raster, the readouts, the output box, the prompt/model/family boxes and the header are all drawn
from it (docs/app.md §3, "The run on display").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..drawing.cells import inert_markdown
from ..panes.readouts import plural
from ..reading.timeline import Timeline

LIVE, STOPPED, FAILED, FINISHED, LOADED = "live", "stopped", "failed", "finished", "loaded"


@dataclass
class RunState:
    """The run the page shows. `timeline` is the live one while `status` is LIVE (it grows as the
    engine's records arrive; `live` is the run's consumer, runner.LiveRun, which Pause, skip and
    Stop act on), a frozen copy once the run stopped or failed. `model`: the name of the model that
    made it; `prompt`: what it was asked (the trace's own prompt tokens when loaded); `text`: the
    engine's decoded text of a finished run ("" otherwise: the view reads the canvas)."""

    timeline: Timeline
    expected: list[int] | None = None
    status: str = LOADED
    model: str = ""
    prompt: str = ""
    text: str = ""
    source: str = ""  # LOADED: "a trace file", "a sample trace", "a server trace", "a sweep"
    live: Any = field(default=None, repr=False, compare=False)

    @property
    def iterations(self) -> int:
        return self.timeline.iterations

    def status_line(self) -> str:
        """What the run is, in a few words: 'stopped at iteration 3', 'finished: 5 iterations'."""
        n = self.iterations
        if self.status == LIVE:  # the header is drawn once, at the first record: the grid's caption counts
            return "live run"
        if self.status == STOPPED:
            return f"stopped at iteration {n}"
        if self.status == FAILED:
            return f"failed at iteration {n}"
        if self.status == FINISHED:
            return f"finished: {plural(n, 'iteration')}"
        return f"loaded from {self.source or 'a trace'}: {plural(n, 'iteration')}"

    def header(self) -> str:
        """The page's header line: the model of the run shown and what the run is."""
        return f"run shown: {model_code(self.model or self.timeline.trace.model or 'an unnamed model')} · {self.status_line()}"

    def marked(self, readout: str) -> str:
        """A readout table with the run's status above it, for a run that did not finish."""
        if self.status in (STOPPED, FAILED):
            return f"**{self.status_line()}** (figures over the iterations it ran)\n\n{readout}"
        return readout


def model_code(name: str) -> str:
    """A model's name in code type for a Markdown line, as text only: a Markdown code span would
    show an escaped character as its entity, so the HTML element holds it (a trace file's name may
    carry markup)."""
    return f"<code>{inert_markdown(name)}</code>"


def frozen(timeline: Timeline) -> Timeline:
    """A copy of a live `timeline` with the records that arrived so far: the records a stopped
    run keeps, which nothing adds to any more."""
    return Timeline(dataclasses.replace(timeline.trace, iterations=list(timeline.records)), timeline.row)


def trace_prompt(timeline: Timeline) -> str:
    """The prompt a trace was made with, as its tokens spell it (the chat template's wrapping
    included when the run used it)."""
    return "".join(timeline.text_of(t) for t in timeline.initial[: timeline.prompt_length])
