"""What the page shows of a run, each asked of the run's kind view (views/) (docs/app.md, module
map; what each shows: §2).

- grid: the token grid, finished or live; figures: the raster, the per-iteration chart, the
  extras and the comparison; cost_figure: what each iteration cost; details: the details panel
- readouts: the speed readouts; explain: the teaching text beside the views
- export: the run as GIF or MP4, the comparison as CSV
- analysis_figure: how autoregressive a run is; diff_view: two runs of one prompt diffed

Imports from reading/, drawing/, views/ and settings.py.
"""
