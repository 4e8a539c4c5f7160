"""The Compare tab: the Run tab's prompt and settings run twice, A then B, each side changing a few
settings (COMPARE_FIELDS); both stream into their panels, then a chart sets them against each other
and one slider steps through both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig

from ..figures import compare_figure
from ..grid import EMPTY_GRID, LiveGrid, grid_value
from ..readouts import live_line, message_readout, readout
from ..runner import run_live
from ..settings import all_controls, control_value
from ..timeline import Timeline
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, TabHandlers, error_text, grid_view, guarded, make_control, outputs
from .run import LIVE_README, RunTab

COMPARE_VIEW = ("grid_a", "readout_a", "text_a", "grid_b", "readout_b", "text_b", "chart", "message", "scrub", "state")
# The settings each side of a comparison sets itself; the rest come from the Run tab.
COMPARE_FIELDS = ("decoder", "threshold", "cache", "block_length", "smoothing", "unroll")
COMPARE_DEFAULTS = ({"decoder": "fixed", "cache": "none"}, {"decoder": "threshold", "cache": "dual"})


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
        """Run-tab control values, then A's and B's COMPARE_FIELDS values -> two settings JSONs."""
        n = len(COMPARE_FIELDS)
        base, a, b = values[: -2 * n], values[-2 * n : -n], values[-n:]
        out = []
        for side in (a, b):
            settings = self.settings(*base)
            settings["config"].update(dict(zip(COMPARE_FIELDS, side)))
            out.append(settings)
        return out[0], out[1]

    @guarded(COMPARE_VIEW)
    def compare(self, prompt: str, settings_a: dict[str, Any] | None, settings_b: dict[str, Any] | None) -> Iterator[tuple]:
        """Run A, then B (one device: runs never overlap, so each speed is its own), streaming each
        into its panel (live frames, as the Run tab's grid); then the comparison chart."""
        try:
            runs = [self.parse(s) for s in (settings_a, settings_b)]
            for _, config in runs:
                self.check_request(prompt, config)
        except EngineError as exc:
            yield outputs(COMPARE_VIEW, {"message": error_text(str(exc))})
            return
        labels = tuple(f"{side}: {_label(cfg.to_dict())}" for side, (_, cfg) in zip("AB", runs))
        done: list[Timeline] = []
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
                    out[f"readout_{side}"] = readout(tl, frame.wall, note=labels["ab".index(side)])
                    done.append(tl)
                else:  # waiting, loading, a heartbeat
                    out = {"message": say} if frame.message else {}
                yield outputs(COMPARE_VIEW, out)
        longest = max(t.iterations for t in done)
        yield outputs(
            COMPARE_VIEW,
            {
                "chart": compare_figure(done, labels),
                "scrub": gr.update(minimum=-1, maximum=max(longest - 1, 0), value=longest - 1, interactive=True),
                "state": CompareState(done[0], done[1]),
                "message": "done: " + " · ".join(f"{l} → TPF {t.trace.stats['tpf']:.2f}, TPS {t.trace.stats['tps']:.1f}" for l, t in zip(labels, done)),
            },
        )

    def compare_replay(self, iteration: float, state: CompareState | None) -> tuple:
        """Both runs at the same iteration (a run that already finished shows its end)."""
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
            "Runs **A**, then **B**, on the Run tab's prompt, each with the Run tab's settings changed as below "
            "(one device: the runs never overlap, so each speed is its own)."
        )
        with gr.Row():
            compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
            stop_btn = gr.Button("Stop", variant="stop")
        message = gr.Markdown()
        side_controls: list[gr.components.Component] = []  # A's COMPARE_FIELDS, then B's
        slots: dict[str, gr.components.Component] = {}  # each side's panel, by COMPARE_VIEW name
        with gr.Row(equal_height=False):
            for side, overrides in zip("AB", COMPARE_DEFAULTS):
                x = side.lower()
                with gr.Column():
                    gr.Markdown(f"### {side}")
                    for row in (COMPARE_FIELDS[:3], COMPARE_FIELDS[3:]):
                        with gr.Row():
                            side_controls += [make_control(by_field[f], overrides.get(f, control_value(by_field[f], defaults)), show_info=False, min_width=140) for f in row]
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

    collect = compare_btn.click(h.compare_settings, [*run.settings_inputs, *side_controls], [settings_a, settings_b], **PRIVATE)
    event = collect.then(h.compare, [run.prompt, settings_a, settings_b], view, api_name="compare", show_progress="minimal", show_progress_on=message, **ENGINE_QUEUE)
    scrub.release(h.compare_replay, [scrub, state], view, api_name="compare_replay", show_progress="hidden")
    return Stoppable(event, stop_btn, message)
