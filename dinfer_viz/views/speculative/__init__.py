"""The self-speculative kind's view (engine/kinds/speculative.py; records: docs/trace.md §3.4): a
block-causal model drafts its block's open positions with a masked decoder, verifies the draft
autoregressively, keeps the agreeing prefix and writes the verifier's token at the first
disagreement. The masked view draws its canvas, raster, settled tokens and cost panel as they
are; this view draws each step's draft, accepted prefix, correction and rejected suffix (the grid,
its caption, the chart, the details panel) and says what ran. Its modules: steps (the records
read, the cells), figures, details."""

from __future__ import annotations

from typing import Any

from engine.kinds import kind_named

from ...drawing.cells import CELL_COLOURS, add_states, collapse_fill, inert, legend_block
from ...reading.timeline import Timeline
from ..base import register
from ..masked import MaskedView
from . import speculative_details, speculative_figures, steps

SPECULATIVE = "speculative"  # engine.kinds.speculative.SPECULATIVE (the app imports no kind module)
DRAFT_VERIFY, DRAFT = "draft+verify", "draft"  # a record's `forward`

add_states(
    {
        # the edited colour: a token replaced, here the draft's by the verifier's
        "corrected": (CELL_COLOURS["edited"][0], "the verifier's correction (its token where the draft disagreed)"),
        "rejected": ("#fecaca", "still open: a rejected draft token (after the correction)"),
    },
    {},
)
SPECULATIVE_STATES = ("corrected", "rejected")
STATES = ("prompt", "masked", "old", "new", *SPECULATIVE_STATES, "fill")
LABELS = {"new": "accepted now: the verifier agrees (or no verify ran)"}
MARKS = ("blk", "wrong")
FORWARD_NAMES = {DRAFT_VERIFY: "draft + verify forwards", DRAFT: "draft forward only (verify skipped)"}

SPECULATION = (
    "**Self-speculation.** A block-diffusion model whose blocks are one token long is an autoregressive model, "
    "so one checkpoint both drafts and checks. Each step **drafts** the block's open positions in one forward "
    "(the request's masked decoder, described below, proposes a token at each, seeing the committed text and each other), then **verifies** "
    "the draft in one more forward: the drafted tokens are fed as text, each seeing only the text before it, and a "
    "[MASK] query at every open position predicts it autoregressively. The longest drafted prefix the verifier's "
    "argmax agrees with is kept, and at the first disagreement the verifier's own token is written (the correction): "
    "every step commits at least one token. With **verify always** decoding is lossless: the tokens equal the "
    "model's own block-length-1 greedy decode (autoregressive), in fewer forwards when drafts are right. With **verify auto** "
    "a step skips its verify forward when the decoder commits the first open position and every position of its run "
    "of commits from there is at least τ_v confident; that run is committed as a plain diffusion step (one forward, "
    "no equality guarantee). With **verify router** (S2D2's cost rule) a step verifies when the draft's expected accepted "
    "tokens, estimated from its entropies, beat what a skip would commit (the draft's run of tokens above τ_r); its "
    "decisions are the lane under the per-iteration chart. With an **adaptive draft window** each step drafts a window "
    "that grows while drafts are kept and shrinks to what they kept when they break."
)
SPECULATIVE_SETTINGS = (
    "The speculative loop keeps its own K/V store of the committed text (computed as blocks of one, as the verifier "
    "needs); the cache modes, smoothing and unrolling are masked-diffusion settings it does not read."
)
SPECULATIVE_READING = (
    "*Reading the views:* the grid shows the canvas after the selected step: the drafted tokens the verifier "
    "accepted (green), its correction (magenta) and, still open after it, the drafted tokens it rejected (pink); "
    "hover a cell for its draft and verifier tokens and probabilities. The per-iteration chart stacks each step's "
    "accepted drafts and correction and counts its forwards (2: draft + verify, 1: skipped); click a cell for why "
    "its draft was kept or replaced."
)


@register
class SpeculativeView(MaskedView):
    kind = SPECULATIVE
    label = "self-speculative"

    def grid_value(self, timeline: Timeline, iteration: int, expected: list[int] | None) -> dict:
        cells = [
            {"t": inert(text), "k": " ".join(classes), "tip": inert("\n".join(tip)), "c": bar, "p": p}
            for p, text, classes, tip, bar in steps.cells(timeline, iteration, expected)
        ]
        return {"cells": collapse_fill(cells)}

    def caption(self, timeline: Timeline, iteration: int, total: int) -> str:
        return steps.caption(timeline, iteration, total)

    def cell_state(self, timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
        return steps.speculative_state(timeline, canvas, p, iteration)

    def live_fields(self, timeline: Timeline, shown: int, since: int, expected: list[int] | None, canvas: list[list]) -> dict[str, Any]:
        """A step's correction and rejected drafts are states the live renderer's commits do not
        draw: each frame brings the whole canvas (as a uniform-state run's do), and the block's bar."""
        live = super().live_fields(timeline, shown, shown, expected, canvas)  # the block's marks only
        live["win"] = []  # the grid marks no recomputed window: both forwards read the store
        live["canvas"] = [[p, text, " ".join(classes), "\n".join(tip)] for p, text, classes, tip, _ in steps.cells(timeline, shown - 1, expected)]
        return live

    def legend_states(self, timeline: Timeline | None) -> list[tuple[str, str]]:
        return [(k, LABELS.get(k, CELL_COLOURS[k][1])) for k in STATES]

    def legend_html(self, timeline: Timeline | None) -> str:
        return legend_block(self.legend_states(timeline), MARKS, "the draft's probability")

    def iteration_chart(self, timeline: Timeline, upto: int | None, highlight: int | None) -> Any:
        return speculative_figures.speculative_chart(timeline, upto, highlight, FORWARD_NAMES)

    def forward_costs(self, timeline: Timeline) -> tuple[str, dict[str, str]]:
        """The forwards counted (the cost panel's title: each record's cost sums its step's forwards)."""
        verified = sum(rec.forward == DRAFT_VERIFY for rec in timeline.records)
        skipped = timeline.iterations - verified
        title = f"NFE {timeline.forwards(timeline.iterations)}: {verified} draft + verify step{'s' * (verified != 1)}" + (f", {skipped} draft-only (verify skipped)" if skipped else "")
        return title, FORWARD_NAMES

    def cost_note(self, timeline: Timeline) -> str:
        return self.forward_costs(timeline)[0] + "; a step's bar sums its forwards"

    def details(self, timeline: Timeline, position: int, iteration: int, expected: list[int] | None) -> str:
        return speculative_details.speculative_details(timeline, position, iteration, expected)

    def explanation(self, decoder_text: str, cache: str, smoothing: bool, unroll: bool, options: list[str]) -> str:
        return "\n\n".join([SPECULATION, decoder_text, SPECULATIVE_SETTINGS, *options, SPECULATIVE_READING])

    def settings_words(self, config: Any) -> list[str]:
        option = kind_named(SPECULATIVE).option
        mode = option(config, "verify")
        verify = {
            "always": "verify always",
            "auto": f"verify auto τ_v={option(config, 'verify_threshold'):g}",
            "router": f"verify router T={option(config, 'router_temperature'):g} c={option(config, 'router_cost'):g} τ_r={option(config, 'router_confidence'):g}",
        }[mode]
        window = [f"adaptive draft ≤ {option(config, 'draft_most')}"] if option(config, "draft_window") == "adaptive" else []
        return [verify, f"block {config.block_length}", *window]

    def frame_title(self, timeline: Timeline, index: int) -> str:
        return steps.caption(timeline, index, timeline.iterations)

    def frame_legend_states(self, timeline: Timeline) -> tuple[str, ...]:
        return ("prompt", "masked", "old", "new", *SPECULATIVE_STATES)
