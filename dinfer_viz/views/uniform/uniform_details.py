"""The details panel of a uniform-state run (DiffusionGemma; docs/trace.md §3.2): one canvas
position at one step, all from the record's `uniform` dict. In such a run every position holds a
token at every step, so the panel says what the step did there: the token the model read, the
proposal sampled at the temperature in force, its entropy, and the entropy-bound rule's verdict with
its numbers (accepted iff the entropies of the lower-entropy positions sum to at most the bound; the
others re-noised, with the random token drawn), the draft, and the stop rule's state; then the
position's canvas step by step. The uniform view draws it for dinfer_viz/panes/details.py, which has
checked the position and iteration are in the run.
"""

from __future__ import annotations

from typing import Any

from engine import IterationRecord
from engine.kinds.uniform import UniformSampler

from ...drawing.constraint import dropped_at, history_cell, restricted_at, restriction_words, run_constraint, run_line
from ...drawing.panel import PanelRows, history_table, number, panel, run_option
from ...drawing.panel import token_name as _token_name
from ...reading.timeline import Timeline, iteration_number
from .uniform_grid import deciding_record, uniform_state

# what the token at a position is, by its state after the step shown (uniform_grid.uniform_state)
STATE_WORDS = {
    "prompt": "prompt",
    "masked": "not generated yet: its canvas has not started (the pad holds its place)",
    "accepted": "accepted at this step: the model's proposal",
    "noise": "noise: a random token (this step re-noised the position)",
    "output": "its canvas's output: the last draft",
    "fill": "pad after the row's end (an earlier output held an end-of-text id)",
}


def token_name(timeline: Timeline, token: int) -> str:
    """A token as the panel names it; the header's `mask_id` is the pad here."""
    return _token_name(timeline, token, "pad")


def _option(timeline: Timeline, name: str) -> Any:
    """The run's value of a `uniform` decoder option (its declared default when the header lacks
    it), None unless a number: a trace file's config is untrusted display data."""
    value = run_option(timeline, UniformSampler, name)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def temperature_text(timeline: Timeline, rec: IterationRecord) -> str:
    """The step's temperature, with the linear schedule that gave it."""
    u = rec.state
    text = f"{u['temperature']:.4g}"
    t_min, t_max, steps = (_option(timeline, n) for n in ("t_min", "t_max", "max_denoising_steps"))
    if None not in (t_min, t_max, steps):
        text += f" = t_min {t_min:g} + (t_max {t_max:g} − t_min) × {u['steps_left']}/{steps:g} (steps left / at most); the logits were divided by it"
    return text


def verdict_text(timeline: Timeline, rec: IterationRecord, p: int) -> str:
    """The entropy-bound rule at `p` in `rec` (a step where the row denoised), in words with its
    numbers; the verdict is the engine's flag (`committed`): the recorded sums are rounded."""
    row, s = timeline.row, rec.block_range[0]
    u = rec.state
    total, bound = float(u["entropy_sum"][row][p - s]), float(u["bound"])
    rule = f"sorted by entropy, lowest first, the entropies before it sum to {number(total, bound)}"
    if p in rec.committed[row]:
        return f"accepted: {rule} ≤ bound {bound:g} (the lowest always passes), so its proposal {token_name(timeline, u['proposal'][row][p - s])} was written"
    noise = dict(zip(u["renoised"][row], u["noise"][row])).get(p)
    drawn = f"; re-noised with the random token {token_name(timeline, noise)} (uniform over the vocabulary)" if noise is not None else ""
    return f"not accepted: {rule} > bound {bound:g}{drawn}"


def stop_text(timeline: Timeline, rec: IterationRecord) -> str:
    """The adaptive stop's state after `rec` for this row: stable count against its threshold, mean
    entropy against the confidence threshold, and what followed."""
    stop, row = rec.state["stopping"], timeline.row
    need = stop["stability_threshold"]
    stable = f"draft equal to each of the last {need} draft(s): {_yes(stop['stable'][row])}" if need else "stability threshold 0: the draft need not repeat"
    confident = f"mean entropy {number(float(stop['mean_entropy'][row]), float(stop['confidence_threshold']))} < confidence threshold {stop['confidence_threshold']:g}: {_yes(stop['confident'][row])}"
    then = "so this row has stopped: its canvas is frozen" if stop["stopped"][row] else "so denoising goes on"
    if rec.state.get("output") is not None:
        then += "; the canvas is done after this step, and its output is the last draft"
    return f"{stable} · {confident}, {then}"


def token_read(timeline: Timeline, rec: IterationRecord, index: int, position: int) -> int:
    """The token the model read at `position` in step `index`: on a canvas's first step its random
    start (`uniform.start`, written by that step's record), else what the step before left."""
    start = rec.state.get("start")
    if start is not None:
        return start[timeline.row][position - rec.block_range[0]]
    return timeline.token_before(position, index)


def _step_rows(timeline: Timeline, rec: IterationRecord, index: int, position: int) -> list[tuple[str, str]]:
    """(label, text) of what step `index` did at `position`, inside its canvas."""
    row, s = timeline.row, rec.block_range[0]
    u = rec.state
    out = [("step", f"step {u['step'] + 1} of canvas {rec.block} [{s}, {rec.block_range[1]}), {u['steps_left']} step(s) left counting this one"), ("temperature", temperature_text(timeline, rec))]
    decided = deciding_record(timeline, index)
    if decided != index:
        since = f"at iteration {iteration_number(decided)}" if decided >= 0 else "before this step"
        out.append(("this step", f"this row had stopped (stable and confident) {since}: its canvas is frozen, nothing was proposed or re-noised here"))
        return out
    offset = position - s
    entropy = [float(h) for h in u["entropy"][row]]
    rank = sorted(range(len(entropy)), key=lambda q: (entropy[q], q)).index(offset) + 1
    out += [
        ("token read", f"{token_name(timeline, token_read(timeline, rec, index, position))}: what the model saw here at this step" + (" (its canvas's random start)" if u.get("start") is not None else "")),
        ("proposal", f"{token_name(timeline, u['proposal'][row][offset])}, sampled with probability {number(float(u['proposal_probability'][row][offset]))}"),
        ("entropy", f"{entropy[offset]:.4g}: rank {rank} of the canvas's {len(entropy)} positions, lowest first"),
        ("decision", verdict_text(timeline, rec, position)),
        ("draft", f"{token_name(timeline, u['draft'][row][offset])}: the argmax, what the stop rule compares and the canvas outputs"),
    ]
    restricted = restricted_at(timeline, index, position)
    if restricted is not None:  # the proposal and the draft came from the allowed tokens only
        out.insert(4, ("constraint now", restriction_words(timeline, restricted, "pad")))
    if position in dropped_at(timeline, index):
        out.append(("dropped", "the sampler accepted a proposal here, and the constraint's joint check dropped it: with the ones kept before it the answer could not be completed"))
    return out


def _history(timeline: Timeline, position: int, shown: int) -> str:
    """Every step of the canvas holding `position`: the token read, proposal, entropy, the rule's
    numbers and verdict, the draft."""
    rows = []
    row = timeline.row
    constrained = run_constraint(timeline) is not None
    for i, rec in enumerate(timeline.records):
        s, e = rec.block_range
        if not s <= position < e:
            continue
        u = rec.state
        step = f"{u['step'] + 1} · t {u['temperature']:.3g}"
        if deciding_record(timeline, i) != i:
            cells: tuple[str, ...] = (str(iteration_number(i)), step, token_name(timeline, token_read(timeline, rec, i, position)), "—", "—", "—", "row stopped: frozen", "—")
        else:
            offset = position - s
            total, bound = float(u["entropy_sum"][row][offset]), float(u["bound"])
            accepted = position in rec.committed[row]
            noise = dict(zip(u["renoised"][row], u["noise"][row])).get(position)
            verdict = "accepted" if accepted else "re-noised" + (f" → {token_name(timeline, noise)}" if noise is not None else "")
            cells = (
                str(iteration_number(i)), step, token_name(timeline, token_read(timeline, rec, i, position)), token_name(timeline, u["proposal"][row][offset]),
                f"{float(u['entropy'][row][offset]):.3f}", f"{number(total, bound)} {'≤' if accepted else '>'} {bound:g}", verdict, token_name(timeline, u["draft"][row][offset]),
            )
        rows.append((cells + ((history_cell(timeline, i, position),) if constrained else ()), i == shown))
    if not rows:
        return ""
    head = ("iteration", "step · temperature", "token read", "proposal", "entropy", "sum below vs bound", "verdict", "draft")
    return history_table(head + (("constraint",) if constrained else ()), rows)


def uniform_position_details(timeline: Timeline, position: int, iteration: int, expected: list[int] | None = None) -> str:
    """HTML panel for canvas `position` after record `iteration` (-1: before the first step) of a
    uniform-state `timeline` (both within the run); `expected`: the answer's ids from the prompt's end."""
    rows = PanelRows()
    add = rows.add
    canvas = timeline.canvas_at(iteration)
    token = canvas[position]
    in_prompt = position < timeline.prompt_length
    steps = [i for i, rec in enumerate(timeline.records) if rec.block_range[0] <= position < rec.block_range[1]]
    rows.add_position(timeline, position, "canvas", "in no canvas this run denoised (the run ended first)")
    constraint = run_line(timeline)
    if constraint is not None and not in_prompt:
        add("constraint", constraint)
    state = uniform_state(timeline, canvas, position, iteration)
    add("token", f"{token_name(timeline, token)}: {STATE_WORDS[state]}")
    ends = [i for i in steps if timeline.records[i].state.get("output") is not None]
    if ends:
        when = " (this iteration)" if ends[0] == iteration else " (later than the iteration shown)" if ends[0] > iteration else ""
        add("output", f"{token_name(timeline, timeline.canvas_at(ends[0])[position])}, written when its canvas ended at iteration {iteration_number(ends[0])}{when}")
    rows.add_expected(timeline, expected, position, token, "not generated yet" if state == "masked" else None, "pad")
    rec = rows.record_holding(
        timeline, iteration, position, "before the first step: the canvases start as random tokens at their first step",
        "not in this step's canvas [{s}, {e}): the step did not touch it",
    )
    if rec is not None:
        for label, text in _step_rows(timeline, rec, iteration, position):
            add(label, text)
        add("stop rule", stop_text(timeline, rec))
    title = f"Position {position} · " + (f"iteration {iteration_number(iteration)} of {timeline.iterations}" if iteration >= 0 else "before the first step (iteration 0)")
    return panel(title, rows, "Its canvas, step by step", _history(timeline, position, iteration))
