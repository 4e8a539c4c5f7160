"""The Compare tab: the Run tab's prompt and settings run twice, A then B, each side changing a few
settings (COMPARE_FIELDS); or, when "model B" names another model, the Run tab's settings unchanged
on the Run tab's model (A) and on model B (the distilled model against the base, say). Both stream
into their panels, then a chart sets them against each other and one slider steps through both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig

from ..figures import compare_figure
from ..grid import EMPTY_GRID, LiveGrid, grid_value, inert
from ..readouts import live_line, message_readout, readout
from ..runner import run_live
from ..settings import all_controls, control_value
from ..timeline import Timeline
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, TabHandlers, error_text, grid_view, guarded, make_control, outputs
from .run import LIVE_README, RunTab

# The panels' titles come last, so API clients reading the earlier outputs by place keep working.
COMPARE_VIEW = ("grid_a", "readout_a", "text_a", "grid_b", "readout_b", "text_b", "chart", "message", "scrub", "state", "title_a", "title_b")
# The settings each side of a comparison sets itself; the rest come from the Run tab.
COMPARE_FIELDS = ("decoder", "threshold", "cache", "block_length", "smoothing", "unroll")
COMPARE_DEFAULTS = ({"decoder": "fixed", "cache": "none"}, {"decoder": "threshold", "cache": "dual"})
SAME_MODEL = ("same as A: compare settings", "")  # model B's first choice


@dataclass
class CompareState:
    """A session's finished comparison: what the shared slider steps through."""

    a: Timeline
    b: Timeline


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
    def compare(self, prompt: str, settings_a: dict[str, Any] | None, settings_b: dict[str, Any] | None, model_b: str | None = "") -> Iterator[tuple]:
        """Run A, then B (one device: runs never overlap, so each speed is its own), streaming each
        into its panel (live frames, as the Run tab's grid); then the comparison chart. With
        `model_b` (a model's name, folder or hub id) B is A's settings on that model and
        `settings_b` is not read: the two models decode under the same settings."""
        try:
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
        texts: dict[str, str] = {}  # each side's output, sent again at the end: an API client's result holds both
        for side, (spec, config) in zip("ab", runs):
            live: LiveGrid | None = None
            for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz):
                tl, say = frame.timeline, f"{side.upper()}: {frame.message}"
                if frame.stage == "error":
                    yield outputs(COMPARE_VIEW, {"message": error_text(say)})
                    return
                if frame.stage == "running" and tl is not None:
                    out: dict[str, Any] = {}
                    if live is None:  # the first frame: the masked canvas
                        live = LiveGrid(tl, frame.run)
                        out = {"message": say, f"readout_{side}": message_readout(LIVE_README), f"text_{side}": ""}
                    out[f"grid_{side}"] = live.value(frame.shown, frame.number, frame.since, live_line(tl, frame.shown, frame.wall))
                elif frame.stage == "done" and tl is not None:
                    out = {"message": say, f"grid_{side}": grid_value(tl, frame.shown - 1), f"text_{side}": frame.text}
                    out[f"readout_{side}"] = readout(tl, frame.wall, note=inert(labels["ab".index(side)]))
                    done.append(tl)
                    texts[f"text_{side}"] = frame.text
                else:  # waiting, loading, a heartbeat
                    out = {"message": say} if frame.message else {}
                yield outputs(COMPARE_VIEW, out)
        longest = max(t.iterations for t in done)
        shared = "" if other is None else f" (both: {_label(runs[0][1].to_dict())})"
        yield outputs(
            COMPARE_VIEW,
            {
                "chart": compare_figure(done, labels),
                "scrub": gr.update(minimum=-1, maximum=max(longest - 1, 0), value=longest - 1, interactive=True),
                "state": CompareState(done[0], done[1]),
                "message": "done: " + " · ".join(f"{inert(l)} → TPF {t.trace.stats['tpf']:.2f}, TPS {t.trace.stats['tps']:.1f}" for l, t in zip(labels, done)) + shared,
                **titles,
                **texts,
            },
        )

    def compare_replay(self, iteration: float, state: CompareState | None) -> tuple:
        """Both runs at the same iteration (a run that already finished holds its last frame)."""
        if state is None:
            return outputs(COMPARE_VIEW, {"message": "nothing to replay: compare first"})
        it = int(iteration)
        return outputs(
            COMPARE_VIEW,
            {
                "grid_a": grid_value(state.a, state.a.clamp(it)),
                "grid_b": grid_value(state.b, state.b.clamp(it)),
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
            "(one device: the runs never overlap, so each speed is its own)."
        )
        with gr.Row():
            model_b = gr.Dropdown(
                [SAME_MODEL, *h.host.model_choices()], value=SAME_MODEL[1], label="model B",
                info="another model: both sides run the Run tab's settings", allow_custom_value=not h.host.public,
                elem_id="compare-model-b", scale=2,
            )
            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn", scale=1)
            stop_btn = gr.Button("Stop", variant="stop", scale=1)
        message = gr.Markdown()
        side_controls: list[gr.components.Component] = []  # A's COMPARE_FIELDS, then B's
        side_groups: list[gr.Column] = []  # each side's controls: hidden while model B is set
        slots: dict[str, gr.components.Component] = {}  # each side's panel, by COMPARE_VIEW name
        with gr.Row(equal_height=False):
            for side, overrides in zip("AB", COMPARE_DEFAULTS):
                x = side.lower()
                with gr.Column():
                    slots[f"title_{x}"] = gr.Markdown(f"### {side}", elem_id=f"compare-title-{x}")
                    with gr.Column() as group:
                        for row in (COMPARE_FIELDS[:3], COMPARE_FIELDS[3:]):
                            with gr.Row():
                                side_controls += [make_control(by_field[f], overrides.get(f, control_value(by_field[f], defaults)), show_info=False, min_width=140) for f in row]
                    side_groups.append(group)
                    slots[f"readout_{x}"] = gr.Markdown(message_readout("not run yet"), elem_id=f"stats-{x}")
                    slots[f"grid_{x}"] = grid_view(EMPTY_GRID, f"grid-{x}", 100)
                    slots[f"text_{x}"] = gr.Textbox(label=f"{side} output", interactive=False, elem_id=f"output-{x}")
        scrub = gr.Slider(-1, 0, value=0, step=1, label="iteration (both runs)", interactive=False)
        chart = gr.Plot(label="A against B", elem_id="compare-chart")
        with gr.Accordion("Settings JSON of A and B (what /compare receives)", open=False):
            settings_a = gr.JSON(value=None)
            settings_b = gr.JSON(value=None)
        state = gr.State(None)
    slots.update(chart=chart, message=message, scrub=scrub, state=state)
    view = [slots[name] for name in COMPARE_VIEW]

    def mode(chosen: str | None) -> list[Any]:
        """Model B set: the sides' settings do not apply (both run the Run tab's), so they hide."""
        return [gr.update(visible=not chosen) for _ in side_groups]

    model_b.change(mode, model_b, side_groups, **PRIVATE)
    collect = compare_btn.click(h.compare_settings, [*run.settings_inputs, *side_controls, model_b], [settings_a, settings_b], **PRIVATE)
    event = collect.then(h.compare, [run.prompt, settings_a, settings_b, model_b], view, api_name="compare", show_progress="minimal", show_progress_on=message, **ENGINE_QUEUE)
    scrub.release(h.compare_replay, [scrub, state], view, api_name="compare_replay", show_progress="hidden")
    return Stoppable(event, stop_btn, message)
