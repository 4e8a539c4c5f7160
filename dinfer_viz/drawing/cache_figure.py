"""The KV cache made visible: the state of every position's K/V at every forward, what each forward
kind costs on the loaded model, and the forward count rule of each cache mode.

The state of position `p` at record `i` (row `timeline.row`) is derived from the records alone,
as engine/cache.py runs them (docs/algorithms.md §4.2-4.4):
- **fresh**: `p` lies in one of the record's `recomputed` ranges (the forward's query range, whose
  K/V it computed from this iteration's input): every position of a `full` or `refresh` forward,
  `[s, N)` for `prefix`, the block for `dual`, the clipped window for `window`.
- **not computed**: outside the query range and not read from any store: an uncached forward over
  part of the canvas (block diffusion's attention-mask reference computes `[0, e)` only), or a
  block-causal prefix forward's positions from the block's end on (masked out of the attention).
- **cached, exact / cached, stale** (a cached forward, outside its query range): the K/V come from
  the store written by the last `refresh` record `r`, computed from the input `r` saw. In a
  bidirectional model every position's K/V depend on every token, so they are exact only while
  that input is unchanged: no commit of this row in records `r .. i-1` (the refresh's own decode
  included), and, with iteration smoothing, no still-masked position inside those records' query
  ranges (their soft embeddings change after every forward). Otherwise they are stale, prompt and
  finished blocks included, until the next refresh. A cached forward with no refresh before it is
  block diffusion's exact prefix cache (engine/cache.py: BlockCausalCache, which never refreshes):
  `[0, s)` is cached and exact by construction.

The staleness the engine measures (`measure_staleness`: KL(exact ‖ cached) per *block* position,
docs/trace.md §3) is the error the stale store caused in the block's predictions, not a value per
cached position; the figure shades a forward's stale cells by the largest KL of its block.

The prompt's K/V follow the same rule as every other position (they are recomputed by a full
forward, cached otherwise, and go stale with the rest); the figure marks the prompt's span with a
bracket above the positions rather than giving it a colour of its own, which would hide its state.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from engine import EngineError, GenerationConfig
from engine.cache import DUAL, FULL, PREFIX, REFRESH, WINDOW, KVCacheManager
from engine.cache_modes import cache_mode as declared_mode
from engine.pipeline import Engine

from .figure_base import FORWARD_COLOURS, _finish, _plain, _upto, heatmap_rows, legend_at_foot, heatmap_y, rows_title, MAX_HEATMAP_CELLS
from .cells import inert_markdown
from .figure_base import message_figure
from ..reading.timeline import EXACT_FORWARDS, Timeline, iteration_number

# state code -> (colour, legend label, one-line meaning for the details panel); codes order the
# colour scale, and STALE's code starts a band shaded by the measured staleness
NOT_COMPUTED, EXACT, FRESH, STALE = 0, 1, 2, 3
STATES: dict[int, tuple[str, str, str]] = {
    NOT_COMPUTED: ("#e5e7eb", "not cached, not computed", "not computed by this forward and not in the cache (masked out)"),
    EXACT: ("#4ade80", "cached, still exact", "read from the cache, still exact: nothing has changed since the refresh that stored it"),
    FRESH: ("#2563eb", "recomputed this forward (fresh)", "recomputed by this forward from the current input (fresh)"),
    STALE: ("#ea580c", "cached, stale (darker: larger measured KL)", "read from the cache, stale: the canvas changed since the refresh that stored it"),
}
HOVER_WORDS = {NOT_COMPUTED: "not computed", EXACT: "cached, exact", FRESH: "fresh", STALE: "cached, stale"}  # the legend names them in full
STALE_LIGHT, STALE_DARK = "#fed7aa", "#991b1b"
UNMEASURED = 0.5  # where a stale cell sits in its band when the trace has no staleness measured
PROMPT_COLOUR = "#6b7280"
BLOCK_COLOUR = "#111827"
HEIGHT = 420


@dataclass
class CacheStates:
    """`codes[i, p]`: the state of position `p` at record `i` (STATES); `kl[i]`: the largest
    measured KL(exact ‖ cached) of record `i`'s block (NaN: not measured); `refreshed[i]`: the
    record whose refresh wrote the store record `i` read (-1: none); `commits[i]`: this row's
    commits between that refresh's input and record `i`'s."""

    codes: np.ndarray
    kl: np.ndarray
    refreshed: list[int]
    commits: list[int]


def cache_states(timeline: Timeline, upto: int | None = None) -> CacheStates:
    """The K/V state of every canvas position at records 0..`upto` (default: all), by the rule in
    the module docstring."""
    upto = _upto(timeline, upto)
    n, row, mask = timeline.canvas_length, timeline.row, timeline.mask_id
    smoothing = bool(timeline.trace.config.get("smoothing"))
    codes = np.full((upto + 1, n), NOT_COMPUTED, dtype=np.int8)
    kl = np.full(upto + 1, np.nan, dtype=np.float32)
    refreshed: list[int] = []
    commits: list[int] = []
    last_refresh, changes, soft = -1, 0, False  # soft: smoothing changed a masked input since the refresh
    for i in range(upto + 1):
        rec = timeline.records[i]
        if rec.forward == REFRESH:  # the store now holds the K/V of this record's input
            last_refresh, changes, soft = i, 0, False
        if rec.forward not in EXACT_FORWARDS:
            s, e = rec.block_range
            if last_refresh < 0:  # block diffusion's prefix cache: committed blocks only, exact
                codes[i, :s] = EXACT
            else:
                codes[i, :] = STALE if changes or soft else EXACT
        for a, b in rec.recomputed:
            codes[i, max(a, 0) : min(b, n)] = FRESH
        # extras are untrusted display data in a trace file: numbers only
        measured = [float(v) for v in timeline.extras_at(i).get("staleness_kl", []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if measured and rec.forward not in EXACT_FORWARDS:
            kl[i] = max(measured)
        refreshed.append(last_refresh)
        commits.append(changes)
        # what this record's decode changed in the input, which the store's K/V do not know about
        changes += len(rec.committed[row])
        soft = soft or (smoothing and any(
            timeline.initial[p] == mask and (p not in timeline.commits or timeline.commits[p].iteration > i)
            for a, b in rec.recomputed
            for p in range(max(a, 0), min(b, n))
        ))
    return CacheStates(codes, kl, refreshed, commits)


def state_explanation(states: CacheStates, timeline: Timeline, iteration: int, position: int) -> tuple[int, str]:
    """(state code, one sentence) for `position` at record `iteration` of `states`."""
    code = int(states.codes[iteration, position])
    rec = timeline.records[iteration]
    text = f"{STATES[code][2]} ({rec.forward} forward)"
    r = states.refreshed[iteration]
    if code in (EXACT, STALE) and r >= 0:
        text += f"; stored by the refresh at iteration {iteration_number(r)}, {states.commits[iteration]} commit(s) since"
        if code == STALE and not states.commits[iteration]:
            text += " (smoothing changed the soft inputs of masked positions)"
    elif code == EXACT:
        text += "; block diffusion's prefix cache holds only finished blocks, exact by construction"
    if code == STALE and np.isfinite(states.kl[iteration]):
        text += f"; measured staleness of this forward: largest KL in the block {states.kl[iteration]:.4g}"
    return code, text


def _z(states: CacheStates) -> np.ndarray:
    """Codes as heatmap values: a stale cell moves up its band [STALE, STALE + 1) with its
    forward's KL relative to the largest KL shown (UNMEASURED where none was measured)."""
    z = states.codes.astype(np.float32)
    top = float(np.nanmax(states.kl)) if np.isfinite(states.kl).any() else 0.0
    shade = np.where(np.isfinite(states.kl), states.kl / top if top > 0 else 0.0, UNMEASURED)
    stale = states.codes == STALE
    z[stale] += 0.999 * np.broadcast_to(shade[:, None], z.shape)[stale]
    return z


def _colour_scale() -> list[list]:
    """Flat bands for the categorical codes, a gradient for the stale band; values 0..STALE + 1."""
    top = STALE + 1.0
    scale: list[list] = []
    for code in (NOT_COMPUTED, EXACT, FRESH):
        scale += [[code / top, STATES[code][0]], [(code + 1) / top, STATES[code][0]]]
    return scale + [[STALE / top, STALE_LIGHT], [1.0, STALE_DARK]]


def _hover(timeline: Timeline, states: CacheStates, x0: int, x1: int, rows: list[int]) -> np.ndarray:
    """Plain-text hover lines of the records `rows` (numbers and fixed words only: no token string
    reaches the figure), as an array: plotly checks a list of lists string by string, ten times slower."""
    out = []
    for i in rows:
        rec = timeline.records[i]
        measured = f" · block KL ≤ {states.kl[i]:.3g}" if np.isfinite(states.kl[i]) else ""
        # position and iteration come from the hover template: a line per cell is most of the figure's bytes
        out.append([f"{_plain(rec.forward)} forward: {HOVER_WORDS[int(states.codes[i, p])]}" + (measured if states.codes[i, p] == STALE else "") for p in range(x0, x1)])
    return np.array(out, dtype=object)


def cache_state_figure(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """Iteration (1..N, labelled with the forward kind) x canvas position heatmap of each
    position's K/V state: fresh, cached and exact, cached and stale (shaded by the measured
    staleness), not computed; block starts as blue lines, the prompt bracketed above, `highlight`
    (a record index) outlined in red; a legend names every colour."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", HEIGHT)
    upto = _upto(timeline, upto)
    states = cache_states(timeline, upto)
    x0, x1 = 0, timeline.view_end()
    its = [iteration_number(i) for i in range(upto + 1)]
    # a hover line per cell costs several times the cell: this figure gets a quarter of the common bound
    rows = heatmap_rows(0, upto, x1 - x0, keep=highlight, cells=MAX_HEATMAP_CELLS // 4)
    fig = go.Figure()
    fig.add_trace(
        go.Heatmap(
            z=_z(states)[rows, x0:x1],
            x0=x0,
            dx=1,
            **heatmap_y(0, rows),
            zmin=0,
            zmax=STALE + 1,
            colorscale=_colour_scale(),
            showscale=False,
            text=_hover(timeline, states, x0, x1, rows),
            hovertemplate="pos %{x} · iteration %{y}<br>%{text}<extra></extra>",
            xgap=1,
            ygap=1,
            uid="cache-states",
        )
    )
    shown = set(np.unique(states.codes[:, x0:x1]).tolist())
    top_kl = float(np.nanmax(states.kl)) if np.isfinite(states.kl).any() else None
    for code, (colour, label, _) in STATES.items():
        if code not in shown:
            continue
        if code == STALE:
            label = f"cached, stale (darker: larger KL, up to {top_kl:.3g})" if top_kl is not None else "cached, stale (staleness not measured)"
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, marker=dict(symbol="square", size=12, color=colour), hoverinfo="skip", uid=f"state-{code}"))
    shapes: list[dict[str, Any]] = []
    for s in sorted({rec.block_range[0] for rec in timeline.records[: upto + 1]}):
        # black, not the other figures' blue: fresh cells are blue here
        shapes.append(dict(type="line", xref="x", yref="paper", x0=s - 0.5, x1=s - 0.5, y0=0, y1=1, line=dict(color=BLOCK_COLOUR, width=3)))
    if timeline.prompt_length > 0:
        end = min(timeline.prompt_length, x1) - 0.5
        shapes.append(dict(type="line", xref="x", yref="paper", x0=x0 - 0.5, x1=end, y0=1.02, y1=1.02, line=dict(color=PROMPT_COLOUR, width=4)))
        fig.add_annotation(x=(x0 - 0.5 + end) / 2, y=1.03, xref="x", yref="paper", text="prompt", showarrow=False, yanchor="bottom", font=dict(size=12, color=PROMPT_COLOUR))
    if highlight is not None and 0 <= highlight <= upto:
        y = iteration_number(highlight)
        # an outline, not the other figures' line: a line would vanish on the dark stale cells
        shapes.append(dict(type="rect", xref="paper", yref="y", x0=0, x1=1, y0=y - 0.5, y1=y + 0.5, line=dict(color="#dc2626", width=3)))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="iteration shown (red outline)", line=dict(color="#dc2626", width=3), hoverinfo="skip", uid="state-shown"))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="block start (black line)", line=dict(color=BLOCK_COLOUR, width=3), hoverinfo="skip", uid="state-block"))
    # tick labels name each forward while they fit; past that, plotly's own numbering
    ticks = dict(tickmode="array", tickvals=its, ticktext=[f"{n} {_plain(timeline.records[i].forward)}" for i, n in enumerate(its)]) if len(its) <= 30 else {}
    fig.update_layout(shapes=shapes, margin=dict(t=60, l=90))
    fig.update_xaxes(title_text="canvas position", range=[x0 - 0.5, x1 - 0.5])
    fig.update_yaxes(title_text=rows_title(rows, 0, upto, "iteration · forward"), range=[its[-1] + 0.5, its[0] - 0.5], **ticks)
    return _finish(fig, legend_at_foot(fig, HEIGHT, 110), "cache-states")


# ---- what each forward kind costs ----------------------------------------------------------------
# the cache mode that plans each forward kind after a refresh (FULL: mode none)
KIND_MODES = {FULL: "none", REFRESH: "dual", PREFIX: "prefix", DUAL: "dual", WINDOW: "vicinity"}


def measure_forward_costs(engine: Engine, lengths: Sequence[int], repeats: int = 3, block_length: int = 32) -> list[dict[str, Any]]:
    """Median milliseconds of one forward of each kind (full, refresh, prefix, dual, window) on
    `engine`'s model, at each canvas length, with the block in the middle of the canvas (so a
    prefix forward's query, the block and everything after it, is about half the canvas, as halfway
    through a generation). One untimed forward per kind first, then `repeats` rounds that time
    every kind once, interleaved so a shared machine's drift hits all alike. A measurement the app
    runs on demand (the caller holds the engine's lock), not a benchmark: the eager model, one
    row of random tokens. Rows: kind, length, query (tokens fed), ms, repeats."""
    model = engine.model
    if model.device.type == "meta":
        raise EngineError("this engine's weights live in its worker processes (tensor/expert parallel): forward costs are measured on a one-process engine")
    limit = model.max_positions
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    vocab = model.embedding_weight().shape[0]
    generator = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for length in lengths:
            if length < 2 or (limit and length > limit):
                raise EngineError(f"canvas length {length} is outside 2..{limit or 'the model limit'}")
            ids = torch.randint(0, vocab, (1, length), generator=generator)
            ids[ids == model.mask_token_id] = model.eos_token_id
            ids = ids.to(model.device)
            width = min(block_length, length)
            s = (length // 2) // width * width
            e = min(s + width, length)
            runs = []  # (kind, manager, plan)
            for kind, mode in KIND_MODES.items():
                manager = KVCacheManager(GenerationConfig(gen_length=width, block_length=width, cache=mode, warmup=0), length)
                plan = manager.plan(0, 0, s, e)
                if kind not in (FULL, REFRESH):
                    manager.forward(model, plan, 0, input_ids=ids)  # the refresh that fills the store
                    plan = manager.plan(1, 0, s, e)
                runs.append((kind, manager, plan))
            times: dict[str, list[float]] = {kind: [] for kind, _, _ in runs}
            for round_ in range(repeats + 1):  # round 0 warms up
                for kind, manager, plan in runs:
                    sync()
                    start = time.perf_counter()
                    manager.forward(model, plan, 0, input_ids=ids[:, plan.start : plan.end])
                    sync()
                    if round_:
                        times[kind].append(time.perf_counter() - start)
            for kind, _, plan in runs:
                rows.append({"kind": kind, "length": length, "query": plan.end - plan.start, "ms": 1000 * statistics.median(times[kind]), "repeats": repeats})
    return rows


def forward_cost_figure(timings: Sequence[dict[str, Any]]) -> go.Figure:
    """From `measure_forward_costs` rows: left, ms per forward of each kind against canvas length;
    right, each cached kind's cost as a share of a full forward at that length (1 = the cache
    saves nothing). Where the cached lines leave 1 is where a cache starts to pay."""
    if not timings:
        return message_figure("no forward costs measured yet", 360)
    kinds = [k for k in KIND_MODES if any(r["kind"] == k for r in timings)]
    full = {r["length"]: r["ms"] for r in timings if r["kind"] == FULL}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["ms per forward", "share of a full forward"], horizontal_spacing=0.12)
    for kind in kinds:
        mine = sorted((r for r in timings if r["kind"] == kind), key=lambda r: r["length"])
        colour = FORWARD_COLOURS.get(kind, "#111827")
        x = np.array([r["length"] for r in mine], dtype=np.float32)
        fig.add_trace(
            go.Scatter(
                x=x, y=np.array([r["ms"] for r in mine], dtype=np.float32), name=kind, legendgroup=kind, mode="lines+markers",
                line=dict(color=colour), customdata=np.array([r["query"] for r in mine], dtype=np.float32),
                hovertemplate=f"{kind}: canvas %{{x}} · query %{{customdata}} tokens<br>%{{y:.2f}} ms (median)<extra></extra>", uid=f"fc-{kind}",
            ),
            row=1, col=1,
        )
        if kind != FULL and full:
            shares = [(r["length"], r["ms"] / full[r["length"]]) for r in mine if full.get(r["length"])]
            fig.add_trace(
                go.Scatter(
                    x=np.array([a for a, _ in shares], dtype=np.float32), y=np.array([b for _, b in shares], dtype=np.float32),
                    name=kind, legendgroup=kind, showlegend=False, mode="lines+markers", line=dict(color=colour),
                    hovertemplate=f"{kind}: canvas %{{x}}<br>%{{y:.2f}} × a full forward<extra></extra>", uid=f"fs-{kind}",
                ),
                row=1, col=2,
            )
    fig.add_hline(y=1.0, line=dict(color="#6b7280", dash="dash", width=1), row=1, col=2, annotation_text="1 = saves nothing", annotation_position="bottom right")
    fig.update_xaxes(title_text="canvas length (tokens)")
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="× full forward", rangemode="tozero", row=1, col=2)
    fig.update_layout(
        title=dict(text=_pays_from(timings), font=dict(size=12), x=0.01, xanchor="left", yref="container", y=0.98, yanchor="top"),
        margin=dict(t=80, b=110),
        legend=dict(y=-0.3, yanchor="top"),
    )
    return _finish(fig, 360, "forward-costs")


def _pays_from(timings: Sequence[dict[str, Any]]) -> str:
    """One line: for each cached kind, the shortest measured canvas from which on it stays cheaper
    than a full forward (a cache's forward must beat a full one before a run can save anything)."""
    full = {r["length"]: r["ms"] for r in timings if r["kind"] == FULL}
    parts = []
    for kind in (PREFIX, DUAL, WINDOW):
        shares = sorted((r["length"], r["ms"] / full[r["length"]]) for r in timings if r["kind"] == kind and full.get(r["length"]))
        if not shares:
            continue
        cheaper = [length for k, (length, _) in enumerate(shares) if all(share < 1.0 for _, share in shares[k:])]
        parts.append(f"{kind} from {cheaper[0]} tokens" if cheaper else f"{kind} never (up to {shares[-1][0]})")
    return "cheaper than a full forward: " + ", ".join(parts) if parts else ""


# ---- the forward count rule ----------------------------------------------------------------------


def cache_rule_markdown(cache_mode: str) -> str:
    """The forward count rule of `cache_mode` (NFE, the extra forward a block entry can cost, why an
    iteration after a refresh can commit nothing), in a few sentences of Markdown."""
    mode = declared_mode(cache_mode)
    return mode.forward_rule if mode is not None else f"**{inert_markdown(cache_mode)} cache.** No forward count rule written for this cache mode yet."  # a trace file's name
