"""The Compare tab: the Run tab's prompt and settings run twice, A then B, each side changing a few
settings (COMPARE_FIELDS); or, when "model B" names another model, the Run tab's settings unchanged
on the Run tab's model (A) and on model B (the distilled model against the base, say). Both stream
into their panels, then a chart sets them against each other and one slider steps through both.
Each side runs `passes` times (the first one shown live): its TPS, forwards/s and engine seconds are
the median over the passes (greedy decoding: the tokens, and so TPF and NFE, are the same every pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig

from ..export import compare_csv
from ..figures import compare_figure
from ..grid import EMPTY_GRID, grid_value, inert
from ..host import ModelSpec
from ..readouts import MAX_PASSES, median_stats, message_readout, passes_count, readout
from ..runner import run_live, timed_passes
from ..settings import all_controls, control_value, decoder_fields
from ..timeline import Timeline
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, TabHandlers, error_text, grid_view, guarded, make_control, outputs
from .live import LiveView
from .run_page import RunTab

# The panels' titles come last, so API clients reading the earlier outputs by place keep working.
COMPARE_VIEW = ("grid_a", "readout_a", "text_a", "grid_b", "readout_b", "text_b", "chart", "message", "scrub", "state", "title_a", "title_b", "csv")
# The settings each side of a comparison sets itself; the rest come from the Run tab.
COMPARE_FIELDS = ("decoder", "threshold", "cache", "block_length", "smoothing", "unroll")
# B changes one setting of A (the first lesson's first comparison): what differs is what explains
COMPARE_DEFAULTS = ({"decoder": "fixed", "cache": "none"}, {"decoder": "threshold", "cache": "none"})
SAME_MODEL = ("same as A: compare settings", "")  # model B's first choice
COMPARE_PASSES = 3  # runs of each side whose median timings are shown (MAX_PASSES at most)


@dataclass
class CompareState:
    """A session's finished comparison: what the shared slider steps through, and what its CSV holds."""

    a: Timeline
    b: Timeline
    labels: tuple[str, str] = ("A", "B")
    wall_seconds: tuple[float, float] | None = None  # since each side's start, UI included (the readouts' wall s)
    stats: tuple[dict[str, Any], dict[str, Any]] | None = None  # each side's median_stats over its passes
    expected: tuple[list[int] | None, list[int] | None] = (None, None)  # each side's expected ids (its tokenizer's)

    def csv(self) -> str:
        """Both runs as the CSV of the Compare tab's download (export.compare_csv)."""
        return compare_csv([self.a, self.b], self.labels, self.wall_seconds, self.stats)


def side_fields(decoder: str) -> set[str]:
    """The COMPARE_FIELDS a side shows for `decoder`: the Run tab's rule (only the settings the
    decoder reads), so the fixed decoder shows no τ."""
    return {f for f in COMPARE_FIELDS if f != "threshold" or "threshold" in decoder_fields(decoder)}


def _label(config: dict[str, Any]) -> str:
    parts = [config.get("decoder", "?")]
    if config.get("decoder") != "fixed":
        parts.append(f"τ={config.get('threshold')}")
    parts.append(f"cache {config.get('cache')}")
    parts.append(f"block {config.get('block_length')}")
    if config.get("smoothing"):
        parts.append("smoothing")
    if config.get("unroll"):
        parts.append("unroll")
    return ", ".join(str(p) for p in parts)


@dataclass
class SideResult:
    """One side's finished run: its timeline (None until done), wall seconds, output text, and the
    median of its passes' stats (None until timed)."""

    label: str
    timeline: Timeline | None = None
    wall: float = 0.0
    text: str = ""
    stats: dict[str, Any] | None = None

    def readout(self) -> str:
        assert self.timeline is not None
        return readout(self.timeline, self.wall, note=inert(self.label), stats=self.stats)


class CompareHandlers(TabHandlers):
    """The Compare tab's events: collect both sides' settings, run them, step through both."""

    def compare_settings(self, *values: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run-tab control values, then A's and B's COMPARE_FIELDS values, then model B -> two
        settings JSONs: each side's changes applied, or, with model B named, the Run tab's settings
        for both (B's on model B)."""
        n = len(COMPARE_FIELDS)
        base, a, b, model_b = values[: -2 * n - 1], values[-2 * n - 1 : -n - 1], values[-n - 1 : -1], values[-1]
        out = []
        for side in (a, b):
            settings = self.settings(*base)
            if not model_b:
                settings["config"].update(dict(zip(COMPARE_FIELDS, side)))
            out.append(settings)
        if model_b:
            out[1]["model"]["path"] = model_b
        return out[0], out[1]

    @guarded(COMPARE_VIEW)
    def compare(
        self,
        prompt: str,
        settings_a: dict[str, Any] | None,
        settings_b: dict[str, Any] | None,
        model_b: str | None = "",
        passes: float = COMPARE_PASSES,
        expected: str = "",
    ) -> Iterator[tuple]:
        """Run A, then B (one device: runs never overlap, so each speed is its own), streaming each
        into its panel (live frames, as the Run tab's grid); then the comparison chart. With
        `model_b` (a model's name, folder or hub id) B is A's settings on that model and
        `settings_b` is not read: the two models decode under the same settings. `passes`: runs
        of each side; the readouts' timings are their median. `expected`: the Run tab's expected
        response; each side strikes out its committed tokens that differ from it."""
        try:
            passes = passes_count(passes)
            runs = [self.parse(settings_a)]
            other = self.host.second_model(runs[0][0], model_b)
            runs.append((other, runs[0][1]) if other is not None else self.parse(settings_b))
            for _, config in runs:
                self.check_request(prompt, config)
        except EngineError as exc:
            yield outputs(COMPARE_VIEW, {"message": error_text(str(exc))})
            return
        labels, titles = self._labels(runs, other is not None)
        yield outputs(COMPARE_VIEW, titles)  # the panels say at once which side is which
        sides: list[SideResult] = []
        for side, (spec, config) in zip("ab", runs):
            result = SideResult(labels["ab".index(side)])
            for slots in self._side(side, spec, config, prompt, expected, passes, result):
                yield outputs(COMPARE_VIEW, slots)
            if result.timeline is None or result.stats is None:  # the side failed: its message is out
                return
            sides.append(result)
        shared = "" if other is None else f" (both: {_label(runs[0][1].to_dict())})"
        yield outputs(COMPARE_VIEW, {**self._finished(sides, labels, passes, shared), **titles})

    def _labels(self, runs: list[tuple[ModelSpec, GenerationConfig]], two_models: bool) -> tuple[tuple[str, str], dict[str, str]]:
        """Each side's label (its settings, or its model with model B set) and panel title."""
        if not two_models:
            a, b = (_label(cfg.to_dict()) for _, cfg in runs)
            return (f"A: {a}", f"B: {b}"), {"title_a": "### A", "title_b": "### B"}
        a, b = (self.host.name_of(spec) for spec, _ in runs)
        return (f"A: {a}", f"B: {b}"), {"title_a": f"### A · {inert(a)}", "title_b": f"### B · {inert(b)}"}

    def _side(self, side: str, spec: ModelSpec, config: GenerationConfig, prompt: str, expected: str, passes: int, result: "SideResult") -> Iterator[dict[str, Any]]:
        """One side: its live run in its panel (the Run tab's live view), then its other passes
        timed with no view; fills `result`, which keeps its timeline None or its stats None when
        the side failed (the message says why)."""
        live = LiveView()
        for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz, expected=expected):
            tl, say = frame.timeline, f"{side.upper()}: {frame.message}"
            if frame.stage == "error":
                yield {"message": error_text(say)}
                return
            if frame.stage == "running" and tl is not None:
                yield {("message" if name == "message" else f"{name}_{side}"): value for name, value in live.running(frame, say).items()}
            elif frame.stage == "done" and tl is not None:
                result.timeline, result.wall, result.text = tl, frame.wall, frame.text
                yield {"message": say, f"grid_{side}": grid_value(tl, frame.shown - 1, tl.expected), f"text_{side}": frame.text, f"readout_{side}": readout(tl, frame.wall, note=inert(result.label))}
            elif frame.message:  # waiting, loading, a heartbeat
                yield {"message": say}
        if result.timeline is None:
            return
        # The other passes, with no view: one pass's timing is noise (another process, a GC)
        timings = [result.timeline.trace.stats]
        try:
            for stats in timed_passes(self.host, spec, prompt, config, passes - 1):
                if stats is not None:
                    timings.append(stats)
                yield {"message": f"{side.upper()}: timing pass {len(timings)} of {passes}"}
        except EngineError as exc:
            yield {"message": error_text(f"{side.upper()}: {exc}")}
            return
        result.stats = median_stats(timings)
        yield {f"readout_{side}": result.readout()}

    def _finished(self, sides: list["SideResult"], labels: tuple[str, str], passes: int, shared: str) -> dict[str, Any]:
        """The comparison's last slots: the chart, the shared slider, the state and its CSV, and
        both sides' output and readout again (an API client's result holds both)."""
        a, b = sides
        assert a.timeline is not None and b.timeline is not None and a.stats is not None and b.stats is not None
        longest = max(a.timeline.iterations, b.timeline.iterations)
        timing = f" (TPS: median of {passes} passes)" if passes > 1 else ""
        state = CompareState(a.timeline, b.timeline, labels, (a.wall, b.wall), (a.stats, b.stats), (a.timeline.expected, b.timeline.expected))
        return {
            "chart": compare_figure([a.timeline, b.timeline], labels),
            # the page's numbering (timeline.iteration_number): 0 before the first forward, 1..N
            "scrub": gr.update(minimum=0, maximum=max(longest, 1), value=longest, interactive=True),
            "state": state,
            "csv": self.write_file("compare", ".csv", state.csv()),
            "message": "done: " + " · ".join(f"{inert(l)} → TPF {m['tpf']:.2f}, TPS {m['tps']:.1f}" for l, m in zip(labels, (a.stats, b.stats))) + timing + shared,
            "text_a": a.text, "text_b": b.text, "readout_a": a.readout(), "readout_b": b.readout(),
        }

    def compare_replay(self, iteration: float, state: CompareState | None) -> tuple:
        """Both runs at the same iteration (the slider's number: 0 before the first forward, 1..N;
        a run that already finished holds its last frame)."""
        if state is None:
            return outputs(COMPARE_VIEW, {"message": "nothing to replay: compare first"})
        it = int(iteration) - 1  # the record index
        return outputs(
            COMPARE_VIEW,
            {
                "grid_a": grid_value(state.a, state.a.clamp(it), state.expected[0]),
                "grid_b": grid_value(state.b, state.b.clamp(it), state.expected[1]),
                "chart": compare_figure([state.a, state.b], state.labels, highlight=it),
                "text_a": state.a.text_at(state.a.clamp(it)),
                "text_b": state.b.text_at(state.b.clamp(it)),
            },
        )


def build(h: CompareHandlers, run: RunTab) -> Stoppable:
    """The Compare tab and its events; it runs on the Run tab's prompt and settings."""
    with gr.Tab("Compare", id="compare"):
        gr.Markdown(
            "Runs **A**, then **B**, on the Run tab's prompt, each with the Run tab's settings changed as below; "
            "or, with **model B** set, the Run tab's settings unchanged on the Run tab's model (A) and on model B "
            "(one device: the runs never overlap, so each speed is its own). Committed tokens that differ from the Run tab's "
            "expected response are struck out on both sides."
        )
        with gr.Row():
            model_b = gr.Dropdown(
                [SAME_MODEL, *h.host.model_choices()], value=SAME_MODEL[1], label="model B",
                info="another model: both sides run the Run tab's settings", allow_custom_value=not h.host.public,
                elem_id="compare-model-b", scale=2,
            )
            passes = gr.Slider(
                1, MAX_PASSES, value=COMPARE_PASSES, step=1, label="passes per side", info="timings: the median of the passes (the first one shown live)",
                elem_id="compare-passes", scale=1, min_width=240,  # narrower, its label and info wrap a word a line (1024 px)
            )
            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=1)
            stop_btn = gr.Button("Stop", variant="stop", scale=1)
        message = gr.Markdown(elem_id="compare-message")
        side_controls, side_groups, slots = _side_panels(GenerationConfig())
        scrub = gr.Slider(0, 1, value=0, step=1, label="iteration, both runs (0 = before the first forward)", interactive=False, elem_id="compare-scrub")
        chart = gr.Plot(label="A against B", elem_id="compare-chart")
        csv = gr.DownloadButton("Download table (CSV)", value=None, elem_id="compare-csv")
        with gr.Accordion("Settings JSON of A and B (what /compare receives)", open=False):
            settings_a = gr.JSON(value=None)
            settings_b = gr.JSON(value=None)
        state = gr.State(None)
    slots.update(chart=chart, message=message, scrub=scrub, state=state, csv=csv)
    view = [slots[name] for name in COMPARE_VIEW]

    def mode(chosen: str | None) -> list[Any]:
        """Model B set: the sides' settings do not apply (both run the Run tab's), so they hide."""
        return [gr.update(visible=not chosen) for _ in side_groups]

    def decoder_shown(decoder: str) -> list[Any]:
        """A side's decoder chose: only the settings that decoder reads show (the Run tab's rule)."""
        shown = side_fields(decoder)
        return [gr.update(visible=f in shown) for f in COMPARE_FIELDS]

    n = len(COMPARE_FIELDS)
    for k in range(2):
        controls = side_controls[k * n : (k + 1) * n]
        controls[COMPARE_FIELDS.index("decoder")].change(decoder_shown, controls[COMPARE_FIELDS.index("decoder")], controls, **PRIVATE)
    model_b.change(mode, model_b, side_groups, **PRIVATE)
    collect = compare_btn.click(h.compare_settings, [*run.settings_inputs, *side_controls, model_b], [settings_a, settings_b], **PRIVATE)
    event = collect.then(h.compare, [run.prompt, settings_a, settings_b, model_b, passes, run.expected], view, api_name="compare", show_progress="minimal", show_progress_on=message, **ENGINE_QUEUE)
    scrub.release(h.compare_replay, [scrub, state], view, api_name="compare_replay", show_progress="hidden")
    # a number typed into the slider's box fires `input`, not `release`; while dragging, only the
    # latest value is drawn
    scrub.input(h.compare_replay, [scrub, state], view, trigger_mode="always_last", show_progress="hidden", api_visibility="private")
    return Stoppable(event, stop_btn, message)


def _side_panels(defaults: GenerationConfig) -> tuple[list[Any], list[gr.Column], dict[str, Any]]:
    """Both sides' columns: (A's COMPARE_FIELDS controls then B's, each side's group of controls,
    hidden while model B is set, and each side's panel by COMPARE_VIEW name)."""
    by_field = {c.field: c for c in all_controls()}
    side_controls: list[gr.components.Component] = []
    side_groups: list[gr.Column] = []
    slots: dict[str, gr.components.Component] = {}
    with gr.Row(equal_height=False):
        for side, overrides in zip("AB", COMPARE_DEFAULTS):
            x = side.lower()
            with gr.Column():
                slots[f"title_{x}"] = gr.Markdown(f"### {side}", elem_id=f"compare-title-{x}")
                shown = side_fields(overrides.get("decoder", defaults.decoder))
                with gr.Column() as group:
                    for row in (COMPARE_FIELDS[:3], COMPARE_FIELDS[3:]):
                        with gr.Row():
                            side_controls += [
                                make_control(
                                    by_field[f], overrides.get(f, control_value(by_field[f], defaults)), show_info=False, min_width=140,
                                    visible=f in shown, elem_id=f"compare-{x}-{f}",
                                )
                                for f in row
                            ]
                side_groups.append(group)
                slots[f"readout_{x}"] = gr.Markdown(message_readout("not run yet"), elem_id=f"stats-{x}")
                slots[f"grid_{x}"] = grid_view(EMPTY_GRID, f"grid-{x}", 100)
                slots[f"text_{x}"] = gr.Textbox(label=f"{side} output", interactive=False, elem_id=f"output-{x}")
    return side_controls, side_groups, slots
