"""A live run's frames as the grid and readout slots the Run and Compare tabs show (runner.Frame
in, slot values out), so both tabs paint a run the same way (docs/app.md §5, Live streaming)."""

from __future__ import annotations

from typing import Any

from ..panes.grid import LiveGrid
from ..panes.readouts import live_line, message_readout
from ..live.runner import Frame

LIVE_README = "live: the engine's figures so far are on the grid's second line; this table fills when the run ends"


class LiveView:
    """One run's live grid, made at its first running frame from the header (the masked canvas,
    and the expected answer's ids the run was given: engine/trace.py, `Trace.expected`)."""

    def __init__(self) -> None:
        self.live: LiveGrid | None = None

    def running(self, frame: Frame, message: str) -> dict[str, Any]:
        """A running frame's slots: the grid's changes; with the first frame also `message`, and
        the readout and output text cleared for the run."""
        tl = frame.timeline
        assert tl is not None  # a running frame carries the growing timeline
        out: dict[str, Any] = {}
        if self.live is None:
            self.live = LiveGrid(tl, frame.run, tl.expected)
            out.update(message=message, readout=message_readout(LIVE_README), text="")
        out["grid"] = self.live.value(frame.shown, frame.number, frame.since, live_line(tl, frame.shown, frame.wall))
        return out

