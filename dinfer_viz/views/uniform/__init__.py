"""The uniform-state kind's view (DiffusionGemma, engine/kinds/uniform.py; docs/trace.md §3.2):
every canvas position holds a token at every step, the sampler accepts the lowest-entropy proposals
within a bound and re-noises the rest, and a canvas writes its output (its last draft) when it
ends. Its grid, figures and details panel are this package's modules; this class is what the page
asks, and the only place in the app that knows the kind."""

from __future__ import annotations

from typing import Any

from engine.trace import UNIFORM

from ...drawing.cells import CELL_COLOURS, Mark, add_states, cell_text, collapse_fill, expected_at, first_shown, inert, legend_block, summary_tip
from ...drawing.constraint import constraint_marks
from ...reading.timeline import Timeline
from ..base import KindView, register
from . import uniform_details, uniform_figures, uniform_grid

# its own states (after the masked kind's in cells.CELL_COLOURS) and the masked states it has too, with its labels
add_states(
    {
        "noise": ("#e7e5e4", "noise (a random token: not accepted)"),
        "accepted": ("#4ade80", "accepted this step (entropy sum within the bound)"),
        "output": ("#bfdbfe", "a finished canvas's output"),
    },
    {"chg": Mark("outline: 2px solid #f59e0b; outline-offset: -2px", "changed since the last step (orange frame)")},
)
UNIFORM_STATES = ("noise", "accepted", "output")
LABELS = {"masked": "not generated yet", "fill": "after the row's end"}
MARKS = ("blk", "chg", "wrong")

# what a uniform-state run's figures mean, and why the page's decoder settings did not apply to it
UNIFORM_NOTE = (
    "uniform-state model (DiffusionGemma): it runs its own sampler (decoder `uniform`, canvases of the length it was trained with), "
    "whatever masked decoder is chosen above · tokens: the final canvas's (most accepted proposals are replaced later) · "
    "NFE: one encoder forward per canvas plus one decoder forward per step (docs/counting.md)"
)
# A uniform-state run reads none of the masked-diffusion settings, and its views show its own rule
UNIFORM_SETTINGS = (
    "The uniform-state loop caches the prompt and each finished canvas itself (the decoder reads that cache); "
    "the cache modes, smoothing and unrolling are masked-diffusion settings it does not read."
)
UNIFORM_READING = (
    "*Reading the views:* the grid shows the canvas after the selected step (accepted proposals, dimmed noise, "
    "finished canvases' output); the raster is step × position entropy (bright: low), the accepted positions "
    "circled and the bound in the legend; the per-iteration chart counts accepted and re-noised positions per step, "
    "with the temperature. Click a cell for the rule's numbers there."
)
# the step times of the per-iteration chart and the cost panel: every record is one denoising
# forward (and the sampler); the encoder's forward, one per canvas, is counted, timed and costed
# in its canvas's first step (the record's `forwards` is 2 there)
STEP_FORWARD = "denoising forward"
ENCODER_FORWARD = "encoder forward: one per canvas, in its first step's time and cost"


@register
class UniformView(KindView):
    kind = UNIFORM
    label = "uniform-state"
    mask_word = "pad"
    records_cost = False
    runs_own_sampler = True

    def finality_notes(self, timeline: Timeline) -> list[str]:
        return ["a canvas not yet being denoised holds no prediction: its positions count as not final until a step reaches them (an early stop's fill: the last step)"]

    def grid_value(self, timeline: Timeline, iteration: int, expected: list[int] | None) -> dict:
        """The bar is the proposal's probability in the canvas being denoised; an output token that
        differs from `expected` is marked."""
        rec = timeline.records[iteration] if iteration >= 0 else None
        first = first_shown(timeline)
        canvas = timeline.canvas_at(iteration)
        cells = [{"t": f"…{first}", "k": "prompt", "tip": summary_tip(first), "c": 0, "p": -1}] if first > 0 else []
        for p, text, classes, tip in uniform_grid.uniform_cells(timeline, iteration, first):
            c = rec.state["proposal_probability"][timeline.row][p - rec.block_range[0]] if "blk" in classes else 0.0
            want = expected_at(timeline, expected, p)
            if classes[0] == "output" and want is not None and want != canvas[p]:
                classes.append("wrong")
                tip.append(f"expected {timeline.text_of(want)!r} (id {want})")
            cells.append({"t": inert(text), "k": " ".join(classes), "tip": inert("\n".join(tip)), "c": round(float(c), 3), "p": p})
        return {"cells": collapse_fill(cells, "after the row's end")}

    def caption(self, timeline: Timeline, iteration: int, total: int) -> str:
        return uniform_grid.uniform_caption(timeline, iteration, total)

    def cell_state(self, timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
        return uniform_grid.uniform_state(timeline, canvas, p, iteration)

    def live_fields(self, timeline: Timeline, shown: int, since: int, expected: list[int] | None, canvas: list[list]) -> dict[str, Any]:
        """A step may change every position of its canvas (re-noising): each frame brings them all,
        with the proposals and their probabilities as the block's bar."""
        at, row = shown - 1, timeline.row
        head = canvas[:1] if canvas and canvas[0][0] == -1 else []
        cells = uniform_grid.uniform_cells(timeline, at, first_shown(timeline))
        live: dict[str, Any] = {"commits": [], "revisions": [], "canvas": head + [[p, text, " ".join(classes), "\n".join(tip)] for p, text, classes, tip in cells]}
        if at >= 0:
            rec = timeline.records[at]
            live["block"] = list(rec.block_range)
            live["top1"] = [timeline.text_of(t) for t in rec.state["proposal"][row]]
            live["conf"] = [round(float(c), 2) for c in rec.state["proposal_probability"][row]]
            live["win"] = []
        return live

    def legend_states(self, timeline: Timeline | None) -> list[tuple[str, str]]:
        return [(k, LABELS.get(k, CELL_COLOURS[k][1])) for k in ("prompt", "masked", *UNIFORM_STATES, "fill")]

    def legend_html(self, timeline: Timeline | None) -> str:
        return legend_block(self.legend_states(timeline), constraint_marks(timeline, MARKS), "the proposal's probability")

    def raster(self, timeline: Timeline, upto: int | None, highlight: int | None, last_rows: int | None, expected: list[int] | None) -> Any:
        return uniform_figures.uniform_raster(timeline, upto, highlight, last_rows, expected)

    def iteration_chart(self, timeline: Timeline, upto: int | None, highlight: int | None) -> Any:
        return uniform_figures.uniform_iteration_chart(timeline, upto, highlight, STEP_FORWARD, ENCODER_FORWARD)

    def forward_costs(self, timeline: Timeline) -> tuple[str, dict[str, str]]:
        steps = timeline.iterations
        nfe = timeline.forwards(steps)
        encoders = nfe - steps
        title = f"NFE {nfe}: {encoders} encoder forward{'s' * (encoders != 1)} (one per canvas, in its first step) + {steps} denoising step{'s' * (steps != 1)}"
        return title, {rec.forward: f"{STEP_FORWARD} + sampler" for rec in timeline.records}

    def details(self, timeline: Timeline, position: int, iteration: int, expected: list[int] | None) -> str:
        return uniform_details.uniform_position_details(timeline, position, iteration, expected)

    def explanation(self, decoder_text: str, cache: str, smoothing: bool, unroll: bool, options: list[str]) -> str:
        """The sampler reads no cache mode or iteration feature, so its text names none."""
        return "\n\n".join([decoder_text, UNIFORM_SETTINGS, *options, UNIFORM_READING])

    def settings_words(self, config: Any) -> list[str]:
        """Its canvas (it keeps its own cache)."""
        return [f"canvas {config.block_length}"]

    def readout_notes(self, timeline: Timeline) -> list[str]:
        return [UNIFORM_NOTE]

    def settled_tokens(self, timeline: Timeline, records: int) -> int:
        """The finished canvases' output (before the record's `final_until`), plus the current
        canvas's accepted proposals; end-of-text and pad excluded, as the engine counts the final
        canvas (docs/counting.md)."""
        if records <= 0:
            return 0
        index = min(records, timeline.iterations) - 1
        rec, row = timeline.records[index], timeline.row
        s, e = rec.block_range
        final = max(timeline.prompt_length, rec.final_until[row])
        canvas = timeline.canvas_at(index)
        settled = canvas[timeline.prompt_length : final]
        if final < e:
            settled += [rec.state["proposal"][row][p - s] for p in rec.committed[row]]
        return sum(not timeline.is_end(t) and t != timeline.mask_id for t in settled)

    def frame_title(self, timeline: Timeline, index: int) -> str:
        return uniform_grid.uniform_caption(timeline, index, timeline.iterations)  # the step's rule and counts, as the page's grid says them

    def frame_legend_states(self, timeline: Timeline) -> tuple[str, ...]:
        return ("prompt", *UNIFORM_STATES)
