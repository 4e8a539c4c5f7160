"""The speed readouts: the engine's own numbers, never the UI's.

Finished run: the trace footer's stats (engine/stats.py: NFE, counted tokens, device-synchronised
seconds without the tracing time, TPS, TPF, forwards/s) and the tracing overhead the engine
measured. While live: the same quantities summed from the per-iteration engine timings so far.
The server's seconds for the run (from the moment it took the run to its last frame) are shown
apart, labelled as such: not the engine's, and not the page's request, queue or painting either.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from engine import EngineError

from ..reading.timeline import Timeline
from ..views import view_for
from ..reading.words import plural

__all__ = ["plural", "percent", "passes_count", "median_stats", "readout", "live_line", "message_readout", "MAX_PASSES"]

MAX_PASSES = 5  # most passes of one configuration a comparison or a sweep times

# The run's time on the server (runner.Frame.wall), named for what it measures: "wall s" with "since
# the click" claimed the page's time too, which under load was seconds more than it (#54)
SERVER_SECONDS = "server s"
_HEAD = f"| TPS | TPF | NFE | fwd/s | engine s | tokens | tracing | {SERVER_SECONDS} |\n|---|---|---|---|---|---|---|---|\n"
_LEGEND = (
    "TPS, TPF, NFE, forwards/s and engine s are the engine's; tracing: time excluded from engine s "
    "(trace recording, the live hook, staleness probes); "
    f"{SERVER_SECONDS}: the server's, from taking the run (waiting for the engine and loading it included) to its last frame, "
    "not the page's request, queue or painting; "
    "tokens (and so TPF, TPS) count no end-of-text: the fill after the answer is not output"
)
# Under a fixed-decoder run's readout when its TPF is this low: a class reads 0.06 as a bug
LOW_TPF = 0.5
FIXED_NOTE = (
    "**Why TPF is this low:** the fixed decoder commits one position per forward, including the "
    "end-of-text positions after the answer, and those are not counted as tokens; so TPF is the answer's "
    "length over the positions decoded, far below 1."
)


def percent(fraction: float) -> str:
    """An accuracy as the page writes it everywhere (table, chart, messages): "100%", "66.7%"."""
    return f"{fraction * 100:.1f}".removesuffix(".0") + "%"


def passes_count(value: Any) -> int:
    """How many passes to time (a control's or an API client's value), checked: 1..MAX_PASSES."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= MAX_PASSES or n != value:
        raise EngineError(f"passes must be a whole number from 1 to {MAX_PASSES}, got {value!r}")
    return n


def median_stats(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The engine stats of N passes of one greedy run as one: the first pass's counts (every pass
    decodes the same tokens in the same forwards), the median engine seconds, and TPS and
    forwards/s from that median; `passes` and `seconds_range` say what it summarises."""
    seconds = [p["seconds"] for p in passes]
    out = dict(passes[0])
    middle = statistics.median(seconds)
    batch = out.get("batch", 1) or 1
    out.update(
        seconds=middle,
        tps=out["tokens"] / middle / batch if middle > 0 else 0.0,
        forwards_per_second=out["nfe"] / middle if middle > 0 else 0.0,
        passes=len(passes),
        seconds_range=(min(seconds), max(seconds)),
    )
    return out


def _finished_stats(timeline: Timeline, stats: dict[str, Any] | None) -> dict[str, Any]:
    """The finished run's figures (`stats`, else the trace's footer), any the footer lacks or
    leaves null summed from the records as a live run's are: a hand-written or older trace's
    footer may name only some (a missing one broke the readout with a KeyError)."""
    names = ("tps", "tpf", "nfe", "forwards_per_second", "seconds", "tokens")
    given = {k: v for k, v in (stats or timeline.trace.stats).items() if v is not None}
    return {**dict(zip(names, _so_far(timeline, timeline.iterations))), **given} if not set(names) <= set(given) else given


def readout(timeline: Timeline, wall_seconds: float | None = None, note: str = "", stats: dict[str, Any] | None = None) -> str:
    """Markdown table of the run's speed; `note` is a line under it (stage, model). `stats`: the
    finished run's figures when they are not the trace's own (`median_stats` of several passes)."""
    wall = "–" if wall_seconds is None else f"{wall_seconds:.2f}"
    if timeline.finished:
        s = _finished_stats(timeline, stats)
        seconds, overhead = s["seconds"], s.get("trace_seconds", timeline.trace.trace_seconds)
        share = f" ({overhead / seconds:.1%})" if seconds > 0 else ""
        row = (
            f"| **{s['tps']:.1f}** | {s['tpf']:.2f} | {s['nfe']} | {s['forwards_per_second']:.1f} | "
            f"{seconds:.3f} | {s['tokens']} | {overhead * 1000:.1f} ms{share} | {wall} |"
        )
        source = "the finished run's engine stats (device-synchronised)"
        if s.get("passes", 1) > 1:
            low, high = s["seconds_range"]
            source += f"; TPS, fwd/s and engine s: median of {s['passes']} passes (engine s {low:.3f}–{high:.3f})"
    else:
        tps, tpf, nfe, fps, seconds, tokens = _so_far(timeline, timeline.iterations)
        row = f"| {tps:.1f} | {tpf:.2f} | {nfe} | {fps:.1f} | {seconds:.3f} | {tokens} | – | {wall} |"
        source = "summed from the engine's per-iteration timings (the trace has no footer)"
    lines = [_HEAD + row, f"<small>{source} · {_LEGEND}{' · ' + note if note else ''}</small>"]
    tpf = _finished_stats(timeline, stats)["tpf"] if timeline.finished else _so_far(timeline, timeline.iterations)[1]
    if (timeline.trace.config or {}).get("decoder") == "fixed" and tpf < LOW_TPF:
        lines.append(f"<small>{FIXED_NOTE}</small>")
    lines += [f"<small>{note}</small>" for note in view_for(timeline).readout_notes(timeline)]
    return "\n\n".join(lines)


def _so_far(timeline: Timeline, shown: int) -> tuple[float, float, int, float, float, int]:
    """(TPS, TPF, NFE, forwards/s, engine seconds, tokens) of the first `shown` records, from the
    engine's per-iteration timings (end-of-text commits are not tokens)."""
    records = timeline.records[:shown]
    seconds = sum(rec.seconds for rec in records)
    tokens, nfe = view_for(timeline).settled_tokens(timeline, shown), timeline.forwards(shown)
    return (tokens / seconds if seconds > 0 else 0.0), (tokens / nfe if nfe else 0.0), nfe, (nfe / seconds if seconds > 0 else 0.0), seconds, tokens


def live_line(timeline: Timeline, shown: int, wall_seconds: float) -> str:
    """The live grid's speed line: the readout's figures over the iterations shown so far."""
    tps, tpf, nfe, fps, seconds, tokens = _so_far(timeline, shown)
    return f"live · TPS {tps:.1f} · TPF {tpf:.2f} · NFE {nfe} · fwd/s {fps:.1f} · engine s {seconds:.3f} · tokens {tokens} · {SERVER_SECONDS} {wall_seconds:.2f}"


def message_readout(text: str) -> str:
    return _HEAD + "| – | – | – | – | – | – | – | – |\n\n" + f"<small>{text}</small>"
