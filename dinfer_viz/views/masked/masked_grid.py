"""The grid of a masked-diffusion run: each cell is prompt, pinned by the request, masked, committed (new above the
threshold, forced by the at-least-one rule, or earlier), filled by early stop, or, for a revising
decoder, edited or remasked by the record shown; marks for the current block, what a partial
forward recomputed, anchors and wrong tokens. A live frame brings the commits and revisions since
the page's state (grid.LiveGrid)."""

from __future__ import annotations

from typing import Any

from engine.trace import EDIT, REMASK

from ...drawing.cells import PINNED, PINNED_WORDS, cell_text, collapse_fill, expected_at, first_shown, inert, revision_line, summary_tip
from ...drawing.constraint import CUT, cut_positions, dropped_at, hover_line, restricted_at, summary
from ...reading.timeline import EXACT_FORWARDS, Commit, Timeline, iteration_number

STATE_TIPS = {
    "prompt": "prompt", "masked": "masked", "fill": "filled with end-of-text by early stop",
    PINNED: PINNED_WORDS,
}
# states whose token a decoder chose (compared with the expected answer)
COMMITTED_STATES = ("old", "new", "forced", "edited")


def masked_cells(timeline: Timeline, iteration: int, expected: list[int] | None) -> list[dict]:
    """grid_value's cells for a masked run after record `iteration` (already clamped)."""
    canvas = timeline.canvas_at(iteration)
    rec = timeline.records[iteration] if iteration >= 0 else None
    block = range(*rec.block_range) if rec else range(0)
    confidence = rec.confidence[timeline.row] if rec else []
    recomputed = [range(a, b) for a, b in rec.recomputed] if rec and rec.forward not in EXACT_FORWARDS else []
    extras = timeline.extras_at(iteration) if rec else {}
    anchors = extras.get("anchors")
    dropped = set(dropped_at(timeline, iteration))
    first = first_shown(timeline)
    cells = []
    if first > 0:
        cells.append({"t": f"…{first}", "k": "prompt", "tip": summary_tip(first), "c": 0, "p": -1})
    for p in range(first, timeline.canvas_length):
        token = canvas[p]
        commit = timeline.commit_at(p, iteration)
        in_block = p in block
        kind = cell_state(timeline, canvas, p, iteration)
        if kind in STATE_TIPS:
            tip = [f"pos {p} · {STATE_TIPS[kind]}"]
        elif kind == "remasked":
            tip = [f"pos {p} · back to [MASK] at iteration {iteration_number(iteration)}"]
        else:
            how = "forced top-1 (below threshold)" if commit.forced else "above threshold"
            tip = [f"pos {p} · committed at iteration {iteration_number(commit.iteration)} ({how}) · confidence then {commit.confidence:.3f}"]
        tip += [revision_line(timeline, r) for r in timeline.revisions.get(p, []) if r.iteration <= iteration]
        classes = [kind]
        c = 0.0
        if in_block:
            classes.append("blk")
            c = confidence[p - block.start]
            candidate = rec.top1[timeline.row][p - block.start]
            tip.append(f"now: top-1 {timeline.text_of(candidate)!r} (id {candidate}) confidence {c:.3f}")
            for name, values in extras.items():
                if isinstance(values, list) and len(values) == len(block) and name != "anchors":
                    tip.append(f"{name} {_short(values[p - block.start])}")
            if anchors and len(anchors) == len(block) and anchors[p - block.start]:
                classes.append("anchor")
        if any(p in r for r in recomputed):
            classes.append("win")
        if token != timeline.mask_id:
            tip.insert(1, f"token {timeline.text_of(token)!r} (id {token})")
        cut = chosen_under_cut(timeline, p, iteration, kind, commit)
        if cut is not None:
            classes.append(CUT)
            tip.append(cut)
        if p in dropped:
            tip.append("the decoder chose to write here; the constraint's joint check dropped it (with the writes kept before it, no answer fits)")
        want = expected_at(timeline, expected, p)
        if kind in COMMITTED_STATES and want is not None and want != token:
            classes.append("wrong")
            tip.append(f"expected {timeline.text_of(want)!r} (id {want})")
        text = inert(cell_text(timeline, token))
        if kind == "edited":  # the replaced token struck through, the new one beside it
            text = f'<s class="was">{inert(cell_text(timeline, timeline.revision_at(p, iteration).old))}</s>{text}'
        cells.append({"t": text, "k": " ".join(classes), "tip": inert("\n".join(tip)), "c": round(float(c), 3), "p": p})
    return collapse_fill(cells)


def chosen_under_cut(timeline: Timeline, p: int, iteration: int, kind: str, commit: Commit | None) -> str | None:
    """The hover line of a cell whose token the decoder chose where the constraint had removed the
    model's top-1 (at its commit's record, or the edit's), else None."""
    if kind not in COMMITTED_STATES:
        return None
    index = iteration if kind == "edited" or commit is None else commit.iteration
    r = restricted_at(timeline, index, p)
    if r is None or not r.top1_removed:
        return None
    return hover_line(timeline, r) + ("" if index == iteration else f" (at iteration {iteration_number(index)})")


def masked_caption(timeline: Timeline, iteration: int, total: int) -> str:
    rec = timeline.records[iteration]
    s, e = rec.block_range
    where = ", ".join(f"[{a}, {b})" for a, b in rec.recomputed)
    threshold = "" if rec.threshold is None else f" · threshold {rec.threshold:.2f}"
    return (
        f"iteration {iteration_number(iteration)}/{total} · block {rec.block} [{s}, {e}) · "
        f"{rec.forward} forward over {where}{threshold} · committed {len(rec.committed[timeline.row])}{revised_summary(timeline, iteration)}{summary(timeline, iteration)}"
    )


def revised_summary(timeline: Timeline, iteration: int) -> str:
    """" · edited 2 · remasked 1" for what record `iteration` revised ("" for a decoder that never
    revises); the captions of the grid and of the exported frames."""
    if timeline.records[iteration].revisions is None:
        return ""
    kinds = [r.kind for r in timeline.record_revisions[iteration]]
    return f" · edited {kinds.count(EDIT)} · remasked {kinds.count(REMASK)}"


def cell_state(timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
    """Position `p`'s state after record `iteration` (-1: before the first forward), as the grid
    colours it: prompt, pinned (by the request, docs/algorithms.md §11), masked, fill (early stop's
    end-of-text), committed new / forced (by this record) / old (earlier), or edited / remasked (by
    this record, a revising decoder)."""
    if p in timeline.pinned:  # no decoder writes a pinned position, nor early stop
        return PINNED
    revision = timeline.revision_at(p, iteration) if iteration >= 0 else None
    if revision is not None:
        return "edited" if revision.kind == EDIT else "remasked"
    commit = timeline.commit_at(p, iteration)
    if p < timeline.prompt_length and commit is None:
        return "prompt"
    if canvas[p] == timeline.mask_id:
        return "masked"
    if commit is None:
        return "fill"
    if commit.iteration == iteration:
        return "forced" if commit.forced else "new"
    return "old"


def live_fields(timeline: Timeline, shown: int, since: int, expected: list[int] | None, canvas: list[list]) -> dict[str, Any]:
    """A masked run's live frame: the commits and revisions since the page's state (the whole
    canvas only for a page that holds nothing), the block's top-1 and confidences now, and what a
    partial forward recomputed."""
    tl, row = timeline, timeline.row
    commits = []
    for i in range(max(since, 0), shown):
        rec = tl.records[i]
        start, forced, cut = rec.block_range[0], set(rec.forced[row]), cut_positions(tl, i)
        for p in rec.committed[row]:
            token = rec.top1[row][p - start]
            want = expected_at(tl, expected, p)
            commits.append([p, cell_text(tl, token), i, int(p in forced), round(float(rec.confidence[row][p - start]), 3), int(want is not None and want != token), int(p in cut)])
    revisions = []
    for i in range(max(since, 0), shown):
        for r in tl.record_revisions[i]:
            want = expected_at(tl, expected, r.position)
            revisions.append([r.position, cell_text(tl, r.new), i, r.kind, cell_text(tl, r.old), revision_line(tl, r), int(r.kind == EDIT and want is not None and want != r.new)])
    live: dict[str, Any] = {"commits": commits, "revisions": revisions}
    if since < 0:
        live["canvas"] = canvas
    at = shown - 1
    if at >= 0:
        rec = tl.records[at]
        live["block"] = list(rec.block_range)
        live["top1"] = [tl.text_of(t) for t in rec.top1[row]]
        live["conf"] = [round(float(c), 2) for c in rec.confidence[row]]
        live["win"] = [list(r) for r in rec.recomputed] if rec.forward not in EXACT_FORWARDS else []
    return live


def _short(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
