"""The Compare tab: the Run tab's prompt and settings run twice, A then B, each side changing a few
settings (COMPARE_FIELDS); or, when "model B" names another model, the Run tab's settings unchanged
on the Run tab's model (A) and on model B (the distilled model against the base, say), or with "B
uses its own settings", B's side's changes on model B (the base model with threshold against the
edit model with `edit`, issue #26). Each side's settings are fitted to its own model
(TabHandlers.fit_to: engine.kinds.fit), so a masked model and a uniform-state one (DiffusionGemma) each run their
own kind of diffusion. Both stream into their panels, then a chart sets them against each other and
one slider steps through both (the shorter run holding its last frame).
Each side runs `passes` times (the first one shown live): its TPS, forwards/s and engine seconds are
the median over the passes (greedy decoding: the tokens, and so TPF and NFE, are the same every pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig
from engine.constraints import spec_of

from ..drawing.cells import inert_markdown
from ..panes.explain import run_kind
from ..panes.export import compare_csv
from ..panes.figures import compare_figure
from ..panes.grid import EMPTY_GRID, grid_value
from ..live.host import ModelSpec
from ..panes.readouts import MAX_PASSES, median_stats, message_readout, passes_count, readout
from ..live.runner import run_live, timed_passes
from ..studies import answers
from ..settings import CONSTRAINT, CONSTRAINT_TEXT, OPTION_PREFIX, all_controls, control_value, decoder_fields, decoder_settings, parse_settings, sweep_setting
from ..reading.timeline import Timeline, record_index
from ..views import view_of_kind
from .common import ENGINE_QUEUE, LATEST, PRIVATE, Stoppable, TabHandlers, error_text, grid_view, guarded, make_control, outputs, redraw_on, sent_value
from .live_view import LiveView
from .run_page import RunTab

# The panels' titles come last, so API clients reading the earlier outputs by place keep working.
COMPARE_VIEW = ("grid_a", "readout_a", "text_a", "grid_b", "readout_b", "text_b", "chart", "message", "scrub", "state", "title_a", "title_b", "csv")
# The settings each side of a comparison sets itself; the rest come from the Run tab. The answer's
# constraint too (its mode and text), so one side can run with it and the other without.
# Then every other setting of a decoder (its own options included), each shown with a decoder that
# reads it, so B can run the edit decoder with its own edit threshold; last, so API clients and the
# page's value order keep the earlier ones in place.
DECODER_OWN = tuple(f for f in decoder_settings() if f != "threshold")
# The diffusion kind last of all (threshold decoding against self-speculation on one model), its
# verify settings the Run tab's.
COMPARE_FIELDS = ("decoder", "threshold", "cache", "block_length", "smoothing", "unroll", CONSTRAINT, CONSTRAINT_TEXT, *DECODER_OWN, "kind")
# each side's controls, row by row: the kind first, the decoder's own under the decoder's row
SIDE_ROWS = (("kind",), COMPARE_FIELDS[:3], DECODER_OWN, COMPARE_FIELDS[3:6], COMPARE_FIELDS[6:8])
# B changes one setting of A (the first lesson's first comparison): what differs is what explains
COMPARE_DEFAULTS = ({"decoder": "fixed", "cache": "none"}, {"decoder": "threshold", "cache": "none"})
SAME_MODEL = ("same as A: compare settings", "")  # model B's first choice
SCRUB_LABEL = "iteration, both runs (0 = before the first forward; a run that has ended holds its last frame)"
COMPARE_PASSES = 3  # runs of each side whose median timings are shown (MAX_PASSES at most)


@dataclass
class CompareState:
    """A session's finished comparison: what the shared slider steps through, and what its CSV holds."""

    a: Timeline
    b: Timeline
    labels: tuple[str, str] = ("A", "B")
    wall_seconds: tuple[float, float] | None = None  # each side's seconds on the server (the readouts' server s)
    stats: tuple[dict[str, Any], dict[str, Any]] | None = None  # each side's median_stats over its passes
    expected: tuple[list[int] | None, list[int] | None] = (None, None)  # each side's expected ids (its tokenizer's)

    def csv(self) -> str:
        """Both runs as the CSV of the Compare tab's download (export.compare_csv)."""
        return compare_csv([self.a, self.b], self.labels, self.wall_seconds, self.stats)


def side_fields(decoder: str) -> set[str]:
    """The COMPARE_FIELDS a side shows for `decoder`: the Run tab's rule (only the settings the
    decoder reads), so the fixed decoder shows no τ."""
    reads = decoder_fields(decoder)
    return {f for f in COMPARE_FIELDS if f not in decoder_settings() or f in reads}


def diffusion_kind(config: GenerationConfig) -> str:
    """What kind of diffusion a run's settings ran, in its view's words."""
    return view_of_kind(run_kind(config)).label


def _label(config: GenerationConfig) -> str:
    """A run's settings in a few words: its decoder, the value of the setting the decoder declares
    as the one to sweep (τ, an entropy bound; the fixed decoder's steps when set), cache and block
    (a uniform-state run: its canvas, its sampler keeping its own cache)."""
    parts = [config.decoder]
    swept = sweep_setting(config.decoder)
    control = {c.field: c for c in all_controls()}.get(swept)
    value = control_value(control, config) if control is not None else None
    if value:  # 0: the fixed decoder's one token per step
        parts.append(f"τ={value}" if swept == "threshold" else f"{swept.removeprefix(OPTION_PREFIX).replace('_', ' ')} {value}")
    parts += view_of_kind(run_kind(config)).settings_words(config)
    if config.smoothing:
        parts.append("smoothing")
    if config.unroll:
        parts.append("unroll")
    if spec_of(config) is not None:
        parts.append(spec_of(config).kind)
    return ", ".join(str(p) for p in parts)


def _judged(prompt: str, text: str) -> str:
    """A side's verdict for the done message: ', <family> verifier: valid', or '' outside the families."""
    judged = answers.verdict(prompt, text)
    return f", {judged}" if judged else ""


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
        return readout(self.timeline, self.wall, note=inert_markdown(self.label), stats=self.stats)


class CompareHandlers(TabHandlers):
    """The Compare tab's events: collect both sides' settings, run them, step through both."""

    def compare_settings(self, *values: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run-tab control values, then A's and B's COMPARE_FIELDS values, then model B and "B uses
        its own settings" -> two settings JSONs: each side's changes applied; with model B named,
        the Run tab's settings for A and, on model B, for B too, or B's changes of them when B uses
        its own settings."""
        n = len(COMPARE_FIELDS)
        base, a, b, (model_b, b_own) = values[: -2 * n - 2], values[-2 * n - 2 : -n - 2], values[-n - 2 : -2], values[-2:]
        by_field = {c.field: c for c in all_controls()}
        out = []
        for side, changes in zip("ab", (a, b)):
            settings = self.settings(*base)
            if not model_b or (side == "b" and b_own):
                settings["config"].update({f: sent_value(by_field[f], v) for f, v in zip(COMPARE_FIELDS, changes)})
            out.append(settings)
        if model_b:
            out[1]["model"]["path"] = model_b
        return out[0], out[1]

    def check_sides(self, *values: Any) -> tuple[str, Any]:
        """(the tab's message, the Compare button): both sides' generation settings (compare_settings'
        inputs) checked as the Run tab checks its own, a constraint included, before any run."""
        try:
            for side, settings in zip("AB", self.compare_settings(*values)):
                try:
                    parse_settings(settings, self.host.default)
                except EngineError as exc:
                    raise EngineError(f"{side}: {exc}") from None
        except EngineError as exc:
            return error_text(inert_markdown(str(exc))), gr.update(interactive=False)
        return "", gr.update(interactive=True)

    @guarded(COMPARE_VIEW)
    def compare(
        self,
        prompt: str,
        settings_a: dict[str, Any] | None,
        settings_b: dict[str, Any] | None,
        model_b: str | None = "",
        passes: float = COMPARE_PASSES,
        expected: str = "",
        b_own_settings: bool = False,
    ) -> Iterator[tuple]:
        """Run A, then B (one device: runs never overlap, so each speed is its own), streaming each
        into its panel (live frames, as the Run tab's grid); then the comparison chart.

        Which settings each side runs: with no `model_b`, A runs `settings_a` and B `settings_b`,
        each on the model its settings name. With `model_b` (a model's name, folder or hub id) B
        runs on that model (with A's device, dtype and options) and its generation settings are
        `settings_a`'s (the two models under the same settings; `settings_b` is not read), or,
        with `b_own_settings`, `settings_b`'s "config" (its "model" does not choose B's). Either way
        each side's settings are fitted to its own model (TabHandlers.fit_to: engine.kinds.fit): a masked decoder
        on a uniform-state model (DiffusionGemma) runs as its `uniform` sampler on its canvas, so
        a masked model and a uniform-state one can share one run's settings. `passes`: runs of
        each side; the readouts' timings are their median. `expected`: the Run tab's expected
        response; each side strikes out its committed tokens that differ from it."""
        try:
            passes = passes_count(passes)
            runs = [self.parse(settings_a)]
            other = self.host.second_model(runs[0][0], model_b)
            if other is None:
                runs.append(self.parse(settings_b))
            else:  # B's settings as they were chosen, then fitted to model B (not to A's model)
                chosen = parse_settings(settings_b if b_own_settings else settings_a, self.host.default)[1]
                runs.append((other, self.fit_to(other, chosen)))
            for _, config in runs:
                self.check_request(prompt, config)
        except EngineError as exc:
            yield outputs(COMPARE_VIEW, {"message": error_text(inert_markdown(str(exc)))})  # it may quote a constraint
            return
        labels, titles, shared = self._labels(runs)
        yield outputs(COMPARE_VIEW, titles)  # the panels say at once which side is which
        sides: list[SideResult] = []
        for side, (spec, config) in zip("ab", runs):
            result = SideResult(labels["ab".index(side)])
            for slots in self._side(side, spec, config, prompt, expected, passes, result):
                yield outputs(COMPARE_VIEW, slots)
            if result.timeline is None or result.stats is None:  # the side failed: its message is out
                return
            sides.append(result)
        yield outputs(COMPARE_VIEW, {**self._finished(sides, labels, passes, shared, prompt), **titles})

    def _labels(self, runs: list[tuple[ModelSpec, GenerationConfig]]) -> tuple[tuple[str, str], dict[str, str], str]:
        """Each side's label, its panel's title, and what the done message adds about settings
        both sides share. One model: the labels are the settings. Two models under the same
        settings: the labels are the models (the message says the settings once). Two models under
        different settings (B's own, or each fitted to its own kind of diffusion): both, and the
        titles say which side is masked and which uniform-state, and by which decoder."""
        (spec_a, config_a), (spec_b, config_b) = runs
        settings = (config_a, config_b)
        if spec_a.path == spec_b.path:
            a, b = (_label(s) for s in settings)
            return (f"A: {a}", f"B: {b}"), {"title_a": "### A", "title_b": "### B"}, ""
        names = [self.host.name_of(spec) for spec in (spec_a, spec_b)]
        if config_a == config_b:
            titles = {f"title_{x}": f"### {x.upper()} · {inert_markdown(name)}" for x, name in zip("ab", names)}
            return (f"A: {names[0]}", f"B: {names[1]}"), titles, f" (both: {_label(settings[0])})"
        labels = tuple(f"{x}: {name} · {_label(s)}" for x, name, s in zip("AB", names, settings))
        titles = {f"title_{x}": f"### {x.upper()} · {inert_markdown(name)} · {diffusion_kind(s)} diffusion ({inert_markdown(s.decoder)})" for x, name, s in zip("ab", names, settings)}
        return (labels[0], labels[1]), titles, ""

    def _side(self, side: str, spec: ModelSpec, config: GenerationConfig, prompt: str, expected: str, passes: int, result: "SideResult") -> Iterator[dict[str, Any]]:
        """One side: its live run in its panel (the Run tab's live view), then its other passes
        timed with no view; fills `result`, which keeps its timeline None or its stats None when
        the side failed (the message says why)."""
        live = LiveView()
        for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz, expected=expected):
            tl, say = frame.timeline, f"{side.upper()}: {frame.message}"
            if frame.stage == "error":
                yield {"message": error_text(inert_markdown(say))}
                return
            if frame.stage == "running" and tl is not None:
                yield {("message" if name == "message" else f"{name}_{side}"): value for name, value in live.running(frame, say).items()}
            elif frame.stage == "done" and tl is not None:
                result.timeline, result.wall, result.text = tl, frame.wall, frame.text
                yield {"message": say, f"grid_{side}": grid_value(tl, frame.shown - 1, tl.expected), f"text_{side}": frame.text, f"readout_{side}": readout(tl, frame.wall, note=inert_markdown(result.label))}
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
            yield {"message": error_text(f"{side.upper()}: {inert_markdown(str(exc))}")}
            return
        result.stats = median_stats(timings)
        yield {f"readout_{side}": result.readout()}

    def _finished(self, sides: list["SideResult"], labels: tuple[str, str], passes: int, shared: str, prompt: str) -> dict[str, Any]:
        """The comparison's last slots: the chart, the shared slider, the state and its CSV, and
        both sides' output and readout again (an API client's result holds both). The message
        gives each side's speed and, for a prompt of a task family, its verifier's verdict on the
        side's answer (as the Run tab's message does)."""
        a, b = sides
        assert a.timeline is not None and b.timeline is not None and a.stats is not None and b.stats is not None
        counts = (a.timeline.iterations, b.timeline.iterations)
        longest = max(counts)
        timing = f" (TPS: median of {passes} passes)" if passes > 1 else ""
        # a uniform-state run's iterations are its denoising steps, often many more than a masked run's
        held = "" if counts[0] == counts[1] else f" · {'AB'[counts.index(min(counts))]} ends after iteration {min(counts)} of {longest} and holds its last frame"
        state = CompareState(a.timeline, b.timeline, labels, (a.wall, b.wall), (a.stats, b.stats), (a.timeline.expected, b.timeline.expected))
        return {
            "chart": compare_figure([a.timeline, b.timeline], labels),
            # the page's numbering (timeline.iteration_number): 0 before the first forward, 1..N
            "scrub": gr.update(minimum=0, maximum=max(longest, 1), value=longest, interactive=True),
            "state": state,
            "csv": self.write_file("compare", ".csv", state.csv()),
            "message": "done: " + " · ".join(f"{inert_markdown(l)} → TPF {m['tpf']:.2f}, TPS {m['tps']:.1f}{_judged(prompt, side.timeline.judged_answer(side.text))}" for l, m, side in zip(labels, (a.stats, b.stats), sides)) + timing + shared + held,
            "text_a": a.text, "text_b": b.text, "readout_a": a.readout(), "readout_b": b.readout(),
        }

    def compare_replay(self, iteration: Any, state: CompareState | None) -> tuple:
        """Both runs at the same iteration (the slider's number: 0 before the first forward, 1..N;
        raw, as the API sent it: a non-number is one line in the page; a run that already
        finished holds its last frame)."""
        if state is None:
            return outputs(COMPARE_VIEW, {"message": "nothing to replay: compare first"})
        try:
            it = record_index(iteration)
        except EngineError as exc:
            return outputs(COMPARE_VIEW, {"message": error_text(inert_markdown(str(exc)))})
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
            "or, with **model B** set, the Run tab's settings unchanged on the Run tab's model (A) and on model B, "
            "or with **B uses its own settings**, B's changes below on model B "
            "(one device: the runs never overlap, so each speed is its own). Each side's settings fit its model: "
            "on a uniform-state model (DiffusionGemma) a masked decoder runs as its `uniform` sampler. "
            "Committed tokens that differ from the Run tab's expected response are struck out on both sides."
        )
        with gr.Row():
            model_b = gr.Dropdown(
                [SAME_MODEL, *h.host.model_choices()], value=SAME_MODEL[1], label="model B",
                info="another model: both sides run the Run tab's settings", allow_custom_value=not h.host.public,
                elem_id="compare-model-b", scale=2, min_width=420,  # its longest name whole at 1024 px (it was cut beside "B uses its own settings")
            )
            b_own = gr.Checkbox(
                False, label="B uses its own settings", info="B's settings below, on model B; A keeps the Run tab's",
                visible=False, elem_id="compare-b-own", scale=1, min_width=200,
            )
            passes = gr.Slider(
                1, MAX_PASSES, value=COMPARE_PASSES, step=1, label="passes per side", info="timings: the median of the passes (the first one shown live)",
                elem_id="compare-passes", scale=1, min_width=240,  # narrower, its label and info wrap a word a line (1024 px)
            )
            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=1)
            stop_btn = gr.Button("Stop", variant="stop", scale=1)
        message = gr.Markdown(elem_id="compare-message")
        side_controls, side_groups, slots = _side_panels(GenerationConfig())
        scrub = gr.Slider(0, 1, value=0, step=1, label=SCRUB_LABEL, interactive=False, elem_id="compare-scrub")
        chart = gr.Plot(label="A against B", elem_id="compare-chart")
        csv = gr.DownloadButton("Download table (CSV)", value=None, elem_id="compare-csv")
        with gr.Accordion("Settings JSON of A and B (what /compare receives)", open=False):
            settings_a = gr.JSON(value=None)
            settings_b = gr.JSON(value=None)
        state = gr.State(None)
    slots.update(chart=chart, message=message, scrub=scrub, state=state, csv=csv)
    view = [slots[name] for name in COMPARE_VIEW]

    def mode(chosen: str | None, own: bool) -> list[Any]:
        """Model B set: A runs the Run tab's settings, so A's hide, and so do B's unless B uses its own."""
        return [gr.update(visible=not chosen), gr.update(visible=not chosen or bool(own))]

    def model_b_chosen(chosen: str | None, own: bool) -> list[Any]:
        """The sides' settings as `mode` says, and "B uses its own settings" only with model B set."""
        return [*mode(chosen, own), gr.update(visible=bool(chosen))]

    def decoder_shown(decoder: str) -> list[Any]:
        """A side's decoder chose: only the settings that decoder reads show (the Run tab's rule)."""
        shown = side_fields(decoder)
        return [gr.update(visible=f in shown) for f in COMPARE_FIELDS]

    n = len(COMPARE_FIELDS)
    for k in range(2):
        controls = side_controls[k * n : (k + 1) * n]
        decoder = controls[COMPARE_FIELDS.index("decoder")]
        redraw_on([decoder.change], decoder_shown, decoder, controls, **LATEST)
    redraw_on([model_b.change], model_b_chosen, [model_b, b_own], [*side_groups, b_own], **LATEST)
    redraw_on([b_own.change], mode, [model_b, b_own], side_groups, **LATEST)
    collect = compare_btn.click(h.compare_settings, [*run.settings_inputs, *side_controls, model_b, b_own], [settings_a, settings_b], **PRIVATE)
    # a side's constraint is checked as it is typed: an invalid one says why and disables Compare
    constraint_controls = [c for k, c in enumerate(side_controls) if COMPARE_FIELDS[k % n] in (CONSTRAINT, CONSTRAINT_TEXT)]
    redraw_on([c.change for c in constraint_controls], h.check_sides, [*run.settings_inputs, *side_controls, model_b, b_own], [message, compare_btn], **LATEST)
    # new inputs come last, so API clients passing the earlier ones by place keep working
    event = collect.then(h.compare, [run.prompt, settings_a, settings_b, model_b, passes, run.expected, b_own], view, api_name="compare", show_progress="minimal", show_progress_on=message, **ENGINE_QUEUE)
    # preprocess=False: the raw value, as the Run tab's /replay (run_page._wire_replay)
    scrub.release(h.compare_replay, [scrub, state], view, api_name="compare_replay", show_progress="hidden", preprocess=False)
    # a number typed into the slider's box fires `input`, not `release`; while dragging, only the
    # latest value is drawn
    redraw_on([scrub.input], h.compare_replay, [scrub, state], view, trigger_mode="always_last", show_progress="hidden", api_visibility="private")
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
                made: dict[str, gr.components.Component] = {}  # laid out by SIDE_ROWS, sent in COMPARE_FIELDS order
                with gr.Column() as group:
                    for row in SIDE_ROWS:
                        with gr.Row():
                            for f in row:
                                made[f] = make_control(
                                    by_field[f], overrides.get(f, control_value(by_field[f], defaults)), show_info=False, min_width=140,
                                    visible=f in shown, elem_id=f"compare-{x}-{f}",
                                )
                side_controls += [made[f] for f in COMPARE_FIELDS]
                side_groups.append(group)
    # the readouts, then the grids with their outputs, each pair in a row of its own: a row's two
    # columns start level, so A's and B's grids line up whatever the settings or the readout
    # notes above them take (one column per side put A's grid a paragraph below B's)
    for part in ("readout", "grid"):
        with gr.Row(equal_height=False):
            for side in "AB":
                x = side.lower()
                with gr.Column():
                    if part == "readout":
                        slots[f"readout_{x}"] = gr.Markdown(message_readout("not run yet"), elem_id=f"stats-{x}")
                    else:
                        slots[f"grid_{x}"] = grid_view(EMPTY_GRID, f"grid-{x}", 100)
                        slots[f"text_{x}"] = gr.Textbox(label=f"{side} output", interactive=False, elem_id=f"output-{x}")
    return side_controls, side_groups, slots
