"""The pieces every kind's view draws with (docs/app.md, module map).

- cells: what one grid cell is (states, colours, marks, escaping, the legend)
- figure_base: what every figure shares (size, axes, the line at the iteration shown)
- panel: the details panel's HTML pieces
- constraint: what the answer's constraint did, as marks, hover lines and panel rows
- cache_figure: the KV cache's state per position and forward, and each forward kind's cost

Imports from reading/ only.
"""
