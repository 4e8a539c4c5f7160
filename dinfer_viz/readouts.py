"""The speed readouts: the engine's own numbers, never the UI's.

Finished run: the trace footer's stats (engine/stats.py: NFE, counted tokens, device-synchronised
seconds without the tracing time, TPS, TPF, forwards/s) and the tracing overhead the engine
measured. While live: the same quantities summed from the per-iteration engine timings so far.
The wall time since the click (which includes the UI) is shown apart, labelled as such.
"""

from __future__ import annotations

from .timeline import Timeline

_HEAD = "| TPS | TPF | NFE | fwd/s | engine s | tokens | tracing | wall s |\n|---|---|---|---|---|---|---|---|\n"
_LEGEND = (
    "TPS, TPF, NFE, forwards/s and engine s are the engine's; tracing: time excluded from engine s "
    "(trace recording, the live hook, staleness probes); wall s: since the click, UI included"
)


def readout(timeline: Timeline, wall_seconds: float | None = None, note: str = "") -> str:
    """Markdown table of the run's speed; `note` is a line under it (stage, model)."""
    wall = "–" if wall_seconds is None else f"{wall_seconds:.2f}"
    if timeline.finished:
        s = timeline.trace.stats
        seconds, overhead = s["seconds"], s.get("trace_seconds", timeline.trace.trace_seconds)
        share = f" ({overhead / seconds:.1%})" if seconds > 0 else ""
        row = (
            f"| **{s['tps']:.1f}** | {s['tpf']:.2f} | {s['nfe']} | {s['forwards_per_second']:.1f} | "
            f"{seconds:.3f} | {s['tokens']} | {overhead * 1000:.1f} ms{share} | {wall} |"
        )
        source = "the finished run's engine stats (device-synchronised)"
    else:
        seconds = sum(rec.seconds for rec in timeline.records)
        nfe, tokens = timeline.iterations, timeline.committed_tokens
        tps = tokens / seconds if seconds > 0 else 0.0
        tpf = tokens / nfe if nfe else 0.0
        fps = nfe / seconds if seconds > 0 else 0.0
        row = f"| {tps:.1f} | {tpf:.2f} | {nfe} | {fps:.1f} | {seconds:.3f} | {tokens} | – | {wall} |"
        source = "live: summed from the engine's per-iteration timings so far"
    lines = [_HEAD + row, f"<small>{source} · {_LEGEND}{' · ' + note if note else ''}</small>"]
    return "\n\n".join(lines)


def message_readout(text: str) -> str:
    return _HEAD + "| – | – | – | – | – | – | – | – |\n\n" + f"<small>{text}</small>"
