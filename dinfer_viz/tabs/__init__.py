"""The app's tabs, one module each: its handlers (a class), its layout and its events (`build`).

- run: prompt, settings, the live run, replay of a run or a loaded trace (its page: run_page)
  (its handlers in parts: run_settings, replay, run_files, server_trace; the panels they draw:
  run_view; the run on display: shown; a live run's frames: live_view, which Compare shares)
- compare: two settings on the Run tab's prompt, side by side
- sweep: one setting swept over prompts with known answers
- tune: the engine's tuner on the page's model, its Pareto front growing as trials finish
- diff: Diff & analysis: how autoregressive a run is, two runs of one prompt diffed step by step
- model: the Model and system section (in the Run tab) and the model status line
- common: what they all stand on (the engine host, the settings mapping, errors in the page)

ui.py puts every tab's handlers on one object and composes the page. Tabs import from every floor
below them (docs/app.md, module map), never from ui.py.
"""
