"""The page: every tab's handlers on one object (`Handlers`) and the tabs composed into one Blocks
(`build_demo`). Each tab's layout, events and handlers live in dinfer_viz/tabs/.

Public API endpoints (gradio_client, `api_name`): /run, /replay, /load_trace, /load_sample,
/export_gif, /export_mp4, /load_model, /compare, /compare_replay, /sweep, /diff, /record_reference.
Comparisons, sweeps, reference recordings and model loads share the queue concurrency id "engine"
with limit 1: one at a time, the rest wait in line. Runs have their own ("runs", up to a batch at once): they wait for the engine in the
RunBatcher, where runs of different sessions join one batch (dinfer_viz/live/batching.py).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .live.stream_keeper import add_keeper
from .tabs import compare, diff, model, run, run_page, sweep, tune
from .tabs.common import PRIVATE


class Handlers(run.RunHandlers, compare.CompareHandlers, sweep.SweepHandlers, tune.TuneHandlers, model.ModelHandlers, diff.DiffHandlers):
    """Every tab's event functions around one EngineHost (tabs.common.TabHandlers takes the
    arguments): what app.py builds and build_demo wires."""


# The largest trace the app writes (1024 generated positions in one block, the fixed decoder: one
# record per position) measured 12.5 MB; the cap leaves room for a longer prompt.
MAX_UPLOAD = "32mb"
PLOTS = ("raster", "iterations", "cost", "extras", "cache-states", "forward-costs", "compare-chart", "sweep-chart", "tune-chart", "analysis-steps", "analysis-order", "diff-chart")  # every gr.Plot's elem_id
# The readout tables (Run, Compare): a cell never breaks inside a word or a number ("TP S", "95. 5");
# a table wider than its column scrolls sideways instead.
READOUT_CSS = (
    "#stats table, #stats-a table, #stats-b table {display: block; overflow-x: auto; max-width: 100%}\n"
    "#stats th, #stats td {white-space: nowrap}\n"
    # Compare's two tables share the tab's width: at 1024 px each column is narrower than its
    # table, whose last columns sat behind a hidden scroll. They fill their column and break a
    # cell only between words ("engine" / "s", "0.6 ms" / "(0.3%)"), never inside a word or number
    "#stats-a table, #stats-b table {display: table; width: 100%; font-size: 13px}\n"
    "#stats-a th, #stats-a td, #stats-b th, #stats-b td {white-space: normal; word-break: keep-all; overflow-wrap: normal; padding: 4px 5px !important}\n"
    # The details panel beside the grid grows with what it says, with no scroll of its own (its
    # "why", candidates and K/V state sat below a 360 px box's fold): a label beside its value,
    # small, the values in a font still readable from the back. No word breaks inside (a label
    # broke "positio/n" in a 28% column); only a value longer than its line (a trace's token
    # string) may. Its iteration-by-iteration table: compact cells that break between words.
    "#details .pos-details {font-size: 15px !important; padding: 8px 10px !important; box-sizing: border-box; max-width: 100% !important}\n"
    "#details .pos-details * {word-break: normal; overflow-wrap: normal; hyphens: manual}\n"
    "#details .pos-details > div:first-child {font-size: 18px !important}\n"
    "#details .pos-details > table:first-of-type td {padding: 2px 4px !important; vertical-align: top}\n"
    "#details .pos-details > table:first-of-type td:first-child {font-size: 12px; width: 28%}\n"
    "#details .pos-details > table:first-of-type td:last-child {overflow-wrap: break-word}\n"
    "#details .history table {font-size: 15px !important}\n"
    "#details .history td, #details .history th {padding: 2px 6px 2px 0 !important; white-space: normal; word-break: keep-all}\n"
    # On a screen under 1,200 px (the panel's column under 300 px) a label stands above its value,
    # which then takes the whole width: side by side, the rows grew the panel to 1,280 px. Media
    # queries: Gradio's scoping of the page's CSS drops @container rules
    "@media (max-width: 1200px) {"
    " #details .pos-details > table:first-of-type, #details .pos-details > table:first-of-type tbody,"
    " #details .pos-details > table:first-of-type tr, #details .pos-details > table:first-of-type td {display: block; width: auto; border: none; margin: 0 !important; padding: 0 !important}"
    " #details .pos-details > table:first-of-type td:first-child {padding: 6px 0 0 0 !important; line-height: 1.2; width: auto}"
    " #details .pos-details > table:first-of-type td:last-child {padding: 0 0 2px 0 !important; border-bottom: 1px solid #e5e7eb; line-height: 1.3; font-size: 14px}"
    "}\n"
    # Under 1,600 px (the column under 450 px) the table's rows read as lines of "column value"
    # pairs: its six to eight columns were wider than the panel, at 1400 px too
    "@media (max-width: 1600px) {"
    " #details .pos-details .history table {font-size: 13px !important}"
    " #details .history table, #details .history tbody, #details .history tr {display: block; margin: 0 !important; padding: 0 !important}"
    " #details .history tr:has(th) {display: none}"
    " #details .history tr {padding: 3px 0 !important; border-bottom: 1px solid #e5e7eb; line-height: 1.35}"
    " #details .history td {display: inline; padding: 0 !important; border: none}"
    " #details .history td::before {content: attr(data-label) ' '; color: #6b7280; font-size: 11px}"
    " #details .history td + td::before {content: ' · ' attr(data-label) ' '}"
    "}\n"
    # a long choice (a lesson's name, model B's) ends in "…" before its box's arrow: at 1024 px
    # its text ran under the arrow
    "#lesson input, #compare-model-b input {text-overflow: ellipsis; padding-right: 28px !important}\n"
    "#grid .cells .cell, #grid-a .cells .cell, #grid-b .cells .cell {cursor: pointer}\n"
    # Compare's captions take two lines at 1024 px or one, by their decoder's words: the same room
    # on both sides keeps A's and B's cells level
    "#grid-a .caption, #grid-b .caption {min-height: 3.4em}\n"
    # A plot's label is a chip floating over the figure's top (its title, the colour bar's top);
    # on a projector's narrow columns it wraps and covers more: it takes its own line instead
    + "".join(f"#{p} > label[data-testid=block-label]," for p in PLOTS).rstrip(",")
    + " {position: static !important; margin-bottom: 4px}"
)


def launch_kwargs(max_upload: str = MAX_UPLOAD) -> dict[str, Any]:
    """The theme goes to launch() in Gradio 6 (Blocks(theme=) is deprecated). Gradio's run history
    would store every run's outputs (plots, grids) in the browser: the trace download does that job.
    Uploads (trace files) are capped at `max_upload`. The page's own CSS goes to launch() too."""
    return {"theme": gr.themes.Soft(primary_hue="blue"), "run_history": False, "max_file_size": max_upload, "css": READOUT_CSS}


def build_demo(handlers: Handlers) -> gr.Blocks:
    # Gradio's cached copies of downloads and uploads: swept every 30 min, kept 2 h
    with gr.Blocks(title="dinfer-viz", delete_cache=(1800, 7200)) as demo:
        gr.Markdown("## dinfer-viz · watch a masked-diffusion LM decode, one iteration at a time")
        # names the model of the run on display (tabs/shown.py), else the default model
        header = gr.Markdown(handlers.model_status(), elem_id="model-status")
        with gr.Tabs() as tabs:
            run_tab = run_page.build(handlers, demo, model_section=lambda: model.build(handlers), header=header)
            compare_tab = compare.build(handlers, run_tab)
            sweep_tab = sweep.build(handlers, run_tab, tabs)
            tune_tab = tune.build(handlers, run_tab, tabs)
            diff.build(handlers, run_tab)
        run_page.wire_structure(handlers, demo, run_tab, sweep_tab.parameter)
        add_keeper()  # a page's queued events reach it even where Gradio's client dropped its stream
        # One engine: each tab's Stop cancels whichever engine event is running, in any tab; a live
        # Run stays on its page with what it produced (RunHandlers.stop), whichever Stop it was
        stoppable = [run_tab.engine, compare_tab, sweep_tab.engine, tune_tab]
        everything = [t.event for t in stoppable]
        # (the live Run's stream ends itself with the stopped run, then the cancel catches the rest)
        run_stop = dict(inputs=[run_tab.state, run_tab.pinned], outputs=run_tab.view, **PRIVATE)
        run_tab.engine.stop.click(handlers.stop, **run_stop).then(None, cancels=everything, **PRIVATE)
        for tab in stoppable[1:]:
            tab.stop.click(handlers.stop_quietly, **run_stop).then(handlers.stopped, None, tab.message, cancels=everything, **PRIVATE)
    # Comparisons, sweeps and loads queue one at a time (concurrency id "engine"), runs up to a batch
    # at once ("runs"); replay and loading traces are cheap and run side by side for several sessions.
    demo.queue(max_size=32, default_concurrency_limit=4)
    return demo
