"""AUP, "accuracy under parallelism": one number for a decoder's accuracy-against-TPF curve, as
d3LLM (hao-ai-lab) defines it (docs/counting.md §11). The app's sweep (dinfer_viz/studies/sweep_study.py) and
the sweep benchmark (benchmarks/sweep.py) both report it; it lives in this package because both
import it and neither imports the other.

A curve is its points (ρ_i, y_i): ρ the tokens per forward, y the accuracy in percent (0-100).
Sorted by ρ, the points kept are those within `DROP_POINTS` of the accuracy at the lowest ρ
(y_i >= y_1 - 5), and

    AUP = ρ_1·y_1 + ½ Σ_{i≥2} (ρ_i − ρ_{i−1})·(y_i·W(y_i) + y_{i−1}·W(y_{i−1}))
    W(y) = min(exp(−α(1 − y/y_max)), 1), α = 3,

y_max the best accuracy on that task among the curves compared: a curve is weighed against the
best any of them reached, so AUP of one curve depends on which others are shown with it.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

DROP_POINTS = 5.0  # percentage points below the lowest-TPF accuracy a kept point may fall
ALPHA = 3.0


def weight(y: float, y_max: float) -> float:
    """W(y): 1 at the best accuracy, exp(−α(1 − y/y_max)) below it (y, y_max in percent)."""
    if y_max <= 0:
        return 1.0  # every curve scored 0: nothing to weigh against (the terms are 0 anyway)
    return min(math.exp(-ALPHA * (1.0 - y / y_max)), 1.0)


def kept_points(points: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(ρ, y) sorted by ρ (ties keep their order), those below y_1 − DROP_POINTS left out."""
    ordered = sorted(points, key=lambda point: point[0])
    if not ordered:
        return []
    floor = ordered[0][1] - DROP_POINTS
    return [(rho, y) for rho, y in ordered if y >= floor]


def aup(points: Iterable[tuple[float, float]], y_max: float | None = None) -> float:
    """AUP of one curve, `points` as (TPF, accuracy in percent); `y_max`: the best accuracy among
    the curves compared (default: this curve's own best). 0 for a curve with no points."""
    kept = kept_points(points)
    if not kept:
        return 0.0
    best = max(y for _, y in kept) if y_max is None else y_max
    total = kept[0][0] * kept[0][1]
    for (rho0, y0), (rho1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (rho1 - rho0) * (y1 * weight(y1, best) + y0 * weight(y0, best))
    return total


def aup_by_curve(curves: dict[str, Sequence[tuple[float, float]]]) -> dict[str, float]:
    """AUP of each curve (name -> (TPF, accuracy in percent) points), y_max the best accuracy of
    any of them: the curves are compared on one task."""
    every = [y for points in curves.values() for _, y in points]
    y_max = max(every) if every else 0.0
    return {name: aup(points, y_max) for name, points in curves.items()}
