"""The grid of a uniform-state run (DiffusionGemma; docs/trace.md §3.2): every position holds a
token at every step, so a cell's state is what the step did there. Inside the canvas being
denoised a cell is *accepted* (its proposal passed the entropy-bound rule) or *noise* (it was
re-noised with a random token, drawn on the record); a finished canvas shows its *output*; later
canvases are not generated yet. A cell whose token differs from the step before gets the `chg`
mark. Tips and the caption carry the rule's numbers (entropy, running sum, bound, temperature,
the stop rule's state). The uniform view (dinfer_viz/views/uniform/__init__.py) draws the grid
with these."""

from __future__ import annotations

from engine import IterationRecord

from ...drawing.cells import cell_text
from ...drawing.constraint import CUT, hover_line, restricted_at, summary
from ...reading.timeline import Timeline, iteration_number
from ...reading.words import plural


def finished_until(timeline: Timeline, iteration: int) -> int:
    """End of the last canvas whose output was written by record `iteration` or before (the prompt's
    end if none): the record's own `final_until` (docs/trace.md §3)."""
    return max(timeline.prompt_length, timeline.records[iteration].final_until[timeline.row])


def deciding_record(timeline: Timeline, iteration: int) -> int:
    """The record whose decision this row's canvas shows after record `iteration`: itself, or for
    a row that had stopped (inactive: its canvas froze), the last record of that canvas where the
    row still denoised (-1: none)."""
    row, block = timeline.row, timeline.records[iteration].block
    for i in range(iteration, -1, -1):
        rec = timeline.records[i]
        if rec.block != block:
            return -1
        if rec.active[row]:
            return i
    return -1


def uniform_state(timeline: Timeline, canvas: list[int], p: int, iteration: int, done: int | None = None, decided: int | None = None) -> str:
    """Position `p`'s state after record `iteration` (-1: before the first step): prompt, masked
    (not generated yet), output / fill (a finished canvas; fill after the row's end), accepted or
    noise (the canvas being denoised). `done`: `finished_until`, when the caller has it. At a
    finished run's last record the canvases it never made are fill."""
    if p < timeline.prompt_length:
        return "prompt"
    if iteration < 0:
        return "masked"
    done = finished_until(timeline, iteration) if done is None else done
    if p < done:
        return "fill" if canvas[p] == timeline.mask_id else "output"
    s, e = timeline.records[iteration].block_range
    if not s <= p < e:
        # after the last step of a finished run, a canvas never made never will be: the row ended
        # before it (its cells said "not generated yet" for good)
        return "fill" if p >= e and timeline.finished and iteration >= timeline.iterations - 1 else "masked"
    decided = deciding_record(timeline, iteration) if decided is None else decided
    return "accepted" if decided >= 0 and p in timeline.records[decided].committed[timeline.row] else "noise"


def step_verdict(timeline: Timeline, rec: IterationRecord, p: int) -> str:
    """Record `rec`'s rule at canvas position `p`, with its numbers: entropy, the sum compared with
    the bound, accepted or re-noised (and the random token drawn). The verdict is the engine's flag
    (`committed`): the recorded sums are rounded to 4 decimals."""
    row, s = timeline.row, rec.block_range[0]
    u = rec.state
    total, bound = u["entropy_sum"][row][p - s], u["bound"]
    if p in rec.committed[row]:
        return f"accepted {timeline.text_of(u['proposal'][row][p - s])!r}: the lower entropies sum to {total:.4g} ≤ bound {bound:g}"
    noise = dict(zip(u["renoised"][row], u["noise"][row])).get(p)
    drawn = f" → random {timeline.text_of(noise)!r}" if noise is not None else ""
    return f"re-noised{drawn}: the lower entropies sum to {total:.4g} > bound {bound:g}"


def _rule(timeline: Timeline, rec: IterationRecord, p: int) -> str:
    """The hover's line for `p` in `rec`: its proposal and entropy, then the rule's verdict."""
    row, s = timeline.row, rec.block_range[0]
    proposal = rec.state["proposal"][row][p - s]
    return f"proposal {timeline.text_of(proposal)!r} (id {proposal}, p {rec.state['proposal_probability'][row][p - s]:.3f}) · entropy {rec.state['entropy'][row][p - s]:.3f} · {step_verdict(timeline, rec, p)}"


# what a cell's hover says its state is
STATE_TIPS = {
    "prompt": "prompt",
    "masked": "not generated yet",
    "noise": "noise: a random token (re-noised: its proposal was not accepted)",
    "accepted": "accepted this step",
    "output": "a finished canvas's output",
    "fill": "after the row's end",
}


def uniform_tip(timeline: Timeline, canvas: list[int], previous: list[int], p: int, iteration: int, state: str, decided: int) -> list[str]:
    """The hover lines of `p`'s cell after record `iteration` in `state`."""
    token = canvas[p]
    lines = [f"pos {p} · {STATE_TIPS[state]}", f"token {timeline.text_of(token)!r} (id {token})"]
    if state in ("accepted", "noise"):
        if decided >= 0:
            lines.append(_rule(timeline, timeline.records[decided], p))
            if decided != iteration:
                lines.append(f"this row stopped at iteration {iteration_number(decided)}: its canvas is frozen")
    elif state == "output":
        lines.append("its canvas's output: the last draft (argmax) of its last step")
    if previous[p] != token:
        lines.append(f"changed since the last step: {timeline.text_of(previous[p])!r} -> {timeline.text_of(token)!r}")
    return lines


def uniform_cells(timeline: Timeline, iteration: int, first: int) -> list[tuple[int, str, list[str], list[str]]]:
    """(position, text, classes, tip lines) of every cell from `first` after record `iteration`."""
    canvas = timeline.canvas_at(iteration)
    previous = timeline.canvas_at(iteration - 1) if iteration >= 0 else canvas
    done = finished_until(timeline, iteration) if iteration >= 0 else timeline.prompt_length
    block = range(*timeline.records[iteration].block_range) if iteration >= 0 else range(0)
    decided = deciding_record(timeline, iteration) if iteration >= 0 else -1  # once per grid, not per cell
    # the step that wrote each finished canvas's output (its last draft)
    wrote = {p: i for i in range(iteration + 1) if timeline.records[i].state.get("output") is not None for p in range(*timeline.records[i].block_range)}
    out = []
    for p in range(first, timeline.canvas_length):
        state = uniform_state(timeline, canvas, p, iteration, done, decided)
        classes = [state]
        if p in block and p >= done:
            classes.append("blk")
        if previous[p] != canvas[p] and state != "prompt":
            classes.append("chg")
        text = "∎" if state == "fill" else cell_text(timeline, canvas[p])  # the pad after a row's end (often the EOS id too)
        tip = uniform_tip(timeline, canvas, previous, p, iteration, state, decided)
        # an accepted proposal, or an output draft, chosen where the constraint had removed the model's top-1
        r = restricted_at(timeline, decided if state == "accepted" else wrote.get(p, -1) if state == "output" else -1, p)
        if r is not None and r.top1_removed:
            classes.append(CUT)
            tip.append(hover_line(timeline, r))
        out.append((p, text, classes, tip))
    return out


def uniform_caption(timeline: Timeline, iteration: int, total: int) -> str:
    """What step `iteration` did: the canvas and step, temperature, accepted and re-noised counts
    against the bound, the stop rule's state."""
    rec = timeline.records[iteration]
    u, row = rec.state, timeline.row
    s, e = rec.block_range
    stop = u["stopping"]
    head = f"iteration {iteration_number(iteration)}/{total} · canvas {rec.block} [{s}, {e}) step {u['step'] + 1} · temperature {u['temperature']:.2f}"
    if not rec.active[row]:
        return f"{head} · this row has stopped: its canvas is frozen"
    parts = [
        f"accepted {len(rec.committed[row])} (entropy bound {u['bound']:g})",
        f"re-noised {len(u['renoised'][row])}",
        f"stop rule: draft unchanged for {plural(stop['stability_threshold'], 'step')} {_yes(stop['stable'][row])}, "
        f"mean entropy {stop['mean_entropy'][row]:.3f} < {stop['confidence_threshold']:g} {_yes(stop['confident'][row])}",
    ]
    if u.get("output") is not None:
        parts.append("canvas done: its output is the last draft")
    return " · ".join([head, *parts]) + summary(timeline, iteration)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
