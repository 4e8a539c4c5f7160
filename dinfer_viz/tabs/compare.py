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

from .. import answers
from ..export import compare_csv
from ..figures import compare_figure
from ..grid import EMPTY_GRID, LiveGrid, grid_value, inert
from ..readouts import MAX_PASSES, live_line, median_stats, message_readout, passes_count, readout
from ..runner import run_live, timed_passes
from ..settings import all_controls, control_value, decoder_fields
from ..timeline import Timeline
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, TabHandlers, error_text, grid_view, guarded, make_control, outputs
from .run import LIVE_README
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
        if other is None:
            labels = tuple(f"{side}: {_label(cfg.to_dict())}" for side, (_, cfg) in zip("AB", runs))
            titles = {"title_a": "### A", "title_b": "### B"}
        else:
            names = [self.host.name_of(spec) for spec, _ in runs]
            labels = tuple(f"{side}: {name}" for side, name in zip("AB", names))
            titles = {f"title_{side}": f"### {side.upper()} · {inert(name)}" for side, name in zip("ab", names)}
        yield outputs(COMPARE_VIEW, titles)  # the panels say at once which side is which
        done: list[Timeline] = []
        walls: list[float] = []
        medians: list[dict[str, Any]] = []
        texts: dict[str, str] = {}  # each side's output and readout, sent again at the end: an API client's result holds both
        wanted: list[list[int] | None] = []  # each side's expected ids (two models may tokenize apart)
        for side, (spec, config) in zip("ab", runs):
            live: LiveGrid | None = None
            want: list[int] | None = None
            names: dict[str, str] = {}  # the expected ids' strings, which the trace may not name (run.py)
            for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz):
                tl, say = frame.timeline, f"{side.upper()}: {frame.message}"
                if frame.stage == "error":
                    yield outputs(COMPARE_VIEW, {"message": error_text(say)})
                    return
                if tl is not None and names:  # the done frame brings a new Timeline
                    tl.add_token_strings(names)
                if frame.stage == "running" and tl is not None:
                    out: dict[str, Any] = {}
                    if live is None:  # the first frame: the masked canvas
                        engine = self.host.peek(spec)
                        if engine is not None and expected:
                            want = answers.expected_ids(engine, expected)
                            names = engine.token_strings(set(want or []))
                            tl.add_token_strings(names)
                        live = LiveGrid(tl, frame.run, want)
                        out = {"message": say, f"readout_{side}": message_readout(LIVE_README), f"text_{side}": ""}
                    out[f"grid_{side}"] = live.value(frame.shown, frame.number, frame.since, live_line(tl, frame.shown, frame.wall))
                elif frame.stage == "done" and tl is not None:
                    out = {"message": say, f"grid_{side}": grid_value(tl, frame.shown - 1, want), f"text_{side}": frame.text}
                    out[f"readout_{side}"] = readout(tl, frame.wall, note=inert(labels["ab".index(side)]))
                    done.append(tl)
                    wanted.append(want)
                    walls.append(frame.wall)
                    texts[f"text_{side}"] = frame.text
                else:  # waiting, loading, a heartbeat
                    out = {"message": say} if frame.message else {}
                yield outputs(COMPARE_VIEW, out)
            # The other passes, with no view: one pass's timing is noise (another process, a GC)
            timings = [done[-1].trace.stats]
            try:
                for stats in timed_passes(self.host, spec, prompt, config, passes - 1):
                    if stats is not None:
                        timings.append(stats)
                    yield outputs(COMPARE_VIEW, {"message": f"{side.upper()}: timing pass {len(timings)} of {passes}"})
            except EngineError as exc:
                yield outputs(COMPARE_VIEW, {"message": error_text(f"{side.upper()}: {exc}")})
                return
            medians.append(median_stats(timings))
            texts[f"readout_{side}"] = readout(done[-1], walls[-1], note=inert(labels["ab".index(side)]), stats=medians[-1])
            yield outputs(COMPARE_VIEW, {f"readout_{side}": texts[f"readout_{side}"]})
        longest = max(t.iterations for t in done)
        shared = "" if other is None else f" (both: {_label(runs[0][1].to_dict())})"
        timing = f" (TPS: median of {passes} passes)" if passes > 1 else ""
        state = CompareState(done[0], done[1], labels, (walls[0], walls[1]), (medians[0], medians[1]), (wanted[0], wanted[1]))
        yield outputs(
            COMPARE_VIEW,
            {
                "chart": compare_figure(done, labels),
                # the page's numbering (timeline.iteration_number): 0 before the first forward, 1..N
                "scrub": gr.update(minimum=0, maximum=max(longest, 1), value=longest, interactive=True),
                "state": state,
                "csv": self.write_file("compare", ".csv", state.csv()),
                "message": "done: " + " · ".join(f"{inert(l)} → TPF {m['tpf']:.2f}, TPS {m['tps']:.1f}" for l, m in zip(labels, medians)) + timing + shared,
                **titles,
                **texts,
            },
        )

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
    defaults = GenerationConfig()
    by_field = {c.field: c for c in all_controls()}
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
        side_controls: list[gr.components.Component] = []  # A's COMPARE_FIELDS, then B's
        side_groups: list[gr.Column] = []  # each side's controls: hidden while model B is set
        slots: dict[str, gr.components.Component] = {}  # each side's panel, by COMPARE_VIEW name
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
