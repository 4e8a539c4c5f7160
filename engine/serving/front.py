"""Decoding that follows the load along a tuned front (docs/serving.md §7).

`python -m engine tune --front-out FILE` writes its Pareto front, most accurate point first and the
fastest (most tokens per forward) last (docs/tuning.md §1). `serve --front FILE --target-p95-ms N`
reads it (`read_front`: every point's settings checked against the served model, so no request is
refused for the front's sake) and gives each new request the settings of the point `LoadFollower`
holds: one step toward the fastest point when the p95 latency of the requests answered since the
last step exceeds the target, one step back when the latest answers' is a margin below the target
and no row waits.
The controller is pure (latencies and a queue length in, a point index out), so its rule is
tested on synthetic latencies and never on a clock.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..arguments import read_text_file
from ..config import MOVED_KIND_SETTINGS, MOVED_SETTINGS, GenerationConfig
from ..errors import EngineError
from ..generation import check_settings

MAX_FRONT_BYTES = 1 << 20
WINDOW = 20  # the latest answers' latencies whose p95 decides
LEAST = 5  # answers since the last step before the next may be decided: each point is judged on its own latencies
MARGIN = 0.2  # back toward accuracy only below (1 - MARGIN) x the target: no step to and fro at the target
# settings of a front's points that the request decides, not the front: its canvas (from max_tokens)
REQUEST_SETTINGS = ("gen_length",)


def p95(latencies: list[float]) -> float:
    """The 95th percentile by nearest rank (one of the values, never interpolated)."""
    ordered = sorted(latencies)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class LoadFollower:
    """Which point of a front of `points` points (0: the most accurate) new requests get, from the
    latencies of answered requests: `observe` each one's latency (seconds) with the number of rows
    waiting when it ended. The window's p95 past the target: a step toward the fastest point; the
    p95 of the latest `least` answers a margin below it with nothing waiting: a step back. Each
    step starts a new window, so the next is decided on the new point's own latencies (`least` of
    them at least)."""

    points: int
    target_s: float
    window: int = WINDOW
    least: int = LEAST
    margin: float = MARGIN
    point: int = 0
    latencies: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.points < 1 or not 0 < self.target_s < math.inf or not 1 <= self.least <= self.window or not 0 <= self.margin < 1:
            raise EngineError("a load follower needs points >= 1, a positive target, 1 <= least <= window and 0 <= margin < 1")

    def observe(self, latency_s: float, waiting: int) -> int:
        """One answered request's latency; the point new requests get from now on."""
        self.latencies = [*self.latencies, latency_s][-self.window:]
        if len(self.latencies) >= self.least:
            if p95(self.latencies) > self.target_s and self.point < self.points - 1:
                self._step(+1)
            # back on the latest answers alone: the window counts answers, not seconds, so after a
            # burst it would hold the burst's latencies until as many answers at the lighter load came
            elif p95(self.latencies[-self.least:]) < self.target_s * (1 - self.margin) and waiting == 0 and self.point > 0:
                self._step(-1)
        return self.point

    def _step(self, by: int) -> None:
        self.point += by
        self.latencies = []


@dataclass(frozen=True)
class Front:
    """A tuned front's points (each the settings a request gets, away from the defaults), most
    accurate first, with their figures as the tuner measured them."""

    settings: list[dict[str, Any]]
    figures: list[dict[str, Any]]

    @property
    def names(self) -> set[str]:
        """The settings any point sets, and the old names of options (which land in the options a
        point may set): a request naming one keeps its own settings."""
        return {name for s in self.settings for name in s} | set(MOVED_SETTINGS) | set(MOVED_KIND_SETTINGS)


def read_front(path: str, model: Any) -> Front:
    """The front in a `tune --front-out` file, each point's settings checked as the served `model`
    (a skeleton will do) runs them (`check_settings`); EngineError in one line naming the point."""
    what = "--front"
    try:
        data = json.loads(read_text_file(path, what, MAX_FRONT_BYTES))
    except ValueError as exc:
        raise EngineError(f"{what} {path[:200]} is not JSON: {exc}") from None
    points = data.get("front") if isinstance(data, dict) else None
    if not (isinstance(points, list) and points and all(isinstance(p, dict) and isinstance(p.get("config"), dict) for p in points)):
        raise EngineError(f"{what} {path[:200]} holds no front: a JSON object whose 'front' is a non-empty list of points, each with a 'config' (engine tune --front-out)")
    settings = []
    for i, point in enumerate(points):
        config = {k: v for k, v in point["config"].items() if k not in REQUEST_SETTINGS}
        try:
            check_settings(GenerationConfig.from_dict(config), model)
        except (EngineError, TypeError, ValueError) as exc:
            raise EngineError(f"{what} point {i} ({json.dumps(config)[:120]}) is not run by this model: {exc}") from None
        settings.append(config)
    figures = [{k: p[k] for k in ("accuracy", "tpf", "held_out_accuracy", "held_out_tpf") if k in p} for p in points]
    return Front(settings, figures)


class FrontFollower:
    """A server's front and its controller: the point each new request is given and what its answer
    reports. Used on the event loop only (requests arrive and end there), so it needs no lock."""

    def __init__(self, front: Front, follower: LoadFollower) -> None:
        if follower.points != len(front.settings):
            raise EngineError(f"the controller has {follower.points} points and the front {len(front.settings)}")
        self.front, self.follower = front, follower

    def assign(self, body: Any) -> tuple[Any, int | None]:
        """The body a request runs and its point: the current point's settings as if the client had
        sent them, unless it names any setting of the front (its own settings win: None)."""
        if not isinstance(body, dict) or self.front.names & {k for k, v in body.items() if v is not None}:
            return body, None
        point = self.follower.point
        return {**body, **self.front.settings[point]}, point  # a null the client sent is "left out"

    def reported(self, point: int | None) -> dict[str, Any]:
        """What a choice says of the setting it used: its point (null: the request's own settings)
        and that point's settings."""
        return {"front_point": point, **({"front_settings": self.front.settings[point]} if point is not None else {})}
