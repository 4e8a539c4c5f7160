"""The app's tabs, one module each: its handlers (a class), its layout and its events (`build`).

- run: prompt, settings, the live run, replay of a run or a loaded trace (its page: run_page)
  (its handlers in parts: run_settings, replay, run_files; the panels they draw: run_view)
- compare: two settings on the Run tab's prompt, side by side
- sweep: one setting swept over prompts with known answers
- model: the Model and system section (in the Run tab) and the model status line
- common: what they all stand on (the engine host, the settings mapping, errors in the page)

ui.py puts every tab's handlers on one object and composes the page.
"""
