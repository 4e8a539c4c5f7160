"""Runs over many prompts, and what they are judged against (docs/app.md, module map).

- answers: the embedded model's task prompts with known answers, and where a run went wrong
- lessons: short sequences of runs, each changing one setting
- sweep_study: one setting swept over prompts with known answers; sweep_chart: its charts
- tuning: the engine's tuner on the page's model, its Pareto front and chart

Imports from the floors below it: reading/, drawing/, live/, views/, settings.py, panes/.
"""
