"""dinfer-viz app: a Gradio visual debugger for the engine, driven by its per-iteration trace.

Its packages are floors, bottom to top, a module importing only from its own package and the
floors below (tests/test_layout.py, APP_FLOORS): reading/ < drawing/, live/ < views/, settings.py <
panes/ < studies/ < sample_traces.py < tabs/ < ui.py. What each holds: its docstring, and the
module map that opens docs/app.md.

The app sees the engine only through `engine`'s public API and the trace.
"""
