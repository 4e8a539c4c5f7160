"""dinfer-viz app: a Gradio visual debugger for the engine, driven by its per-iteration trace.

- ui: the page, composed of the tabs; tabs/: each tab's layout, events and handlers (run,
  compare, sweep, model; common: what they share)
- runner: the engine on a worker thread (host lock, time-throttled frames, cancel); host: the
  loaded engines and the lock; system: what the machine and engine build support
- timeline: a trace as per-position history; grid, figures, readouts: views of a timeline;
  tokens: readable token pieces
- settings: controls <-> GenerationConfig; explain: teaching text
- sweep: a setting swept over prompts with known answers (answers: those answers, wrong commits)

The app sees the engine only through `engine`'s public API and the trace.
"""
