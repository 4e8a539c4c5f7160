"""The details panel of a self-speculative run: for one position, the masked panel's rows (its
token, its commit, the expected answer) with why its drafted token was kept or replaced: the
draft token and its probability, the verifier's argmax and its probability, and the verdict, at
its commit and at the iteration shown; its block's steps as a table. Every string reaches the
HTML through `PanelRows.add` / `history_table` (cells.inert)."""

from __future__ import annotations

from ...drawing.panel import PanelRows, history_table, panel, token_name
from ...reading.timeline import Timeline, iteration_number
from .speculative_figures import router_words
from .steps import REJECTED, Step, draft_and_verifier, step, token_words


def _history(timeline: Timeline, position: int, shown: int) -> str:
    """Every step that drafted `position`: its forwards, the draft and the verifier there, the verdict."""
    rows = []
    for i, rec in enumerate(timeline.records):
        st = step(timeline, i)
        outcome = st.outcome(position)
        if outcome is None:
            continue
        verifier = token_words(timeline, st.at(st.verify, position), st.at(st.verify_p, position)) if st.verified else "skipped"
        cells = (str(iteration_number(i)), rec.forward, token_words(timeline, st.at(st.draft, position), st.at(st.draft_p, position)), verifier, outcome)
        rows.append((cells, i == shown))
    return history_table(("iteration", "forwards", "draft", "verifier", "verdict"), rows) if rows else ""


def _verdict(timeline: Timeline, st: Step, position: int) -> str:
    text = f"{st.outcome(position)} ({draft_and_verifier(timeline, st, position)})"
    if st.rejected(position):
        text += f"; {REJECTED}: the verifier's guess here differs too, though it read a draft already wrong before it"
    return text


def speculative_details(timeline: Timeline, position: int, iteration: int, expected: list[int] | None = None) -> str:
    """HTML panel for canvas `position` after record `iteration` (-1: before the first forward)."""
    rows = PanelRows()
    token = timeline.canvas_at(iteration)[position]
    commit = timeline.commits.get(position)
    in_prompt = position < timeline.prompt_length
    rows.add_position(timeline, position, "block", "in no block this run decoded (early stop ended it first)")
    if token == timeline.mask_id:
        rows.add("token", "masked: [MASK], not yet committed")
    elif commit is None and not in_prompt:
        rows.add("token", f"{token_name(timeline, token)}, filled with end-of-text by early stop (no step wrote it)")
    else:
        rows.add("token", token_name(timeline, token) + (" (prompt)" if in_prompt and commit is None else ""))
    if commit is not None:
        when = " (this iteration)" if commit.iteration == iteration else " (later than the iteration shown)" if commit.iteration > iteration else ""
        rows.add("committed", f"at iteration {iteration_number(commit.iteration)}{when} as {token_name(timeline, commit.token)}")
        rows.add("why", _verdict(timeline, step(timeline, commit.iteration), position))
        if step(timeline, commit.iteration).router is not None:
            rows.add("router at its commit", router_words(step(timeline, commit.iteration).router))
    elif not in_prompt and token == timeline.mask_id:
        rows.add("committed", "not by the end of the run" if timeline.finished else "not yet")
    rows.add_expected(timeline, expected, position, token, "not committed yet" if token == timeline.mask_id else None)
    rec = rows.record_holding(
        timeline, iteration, position, "before the first forward: nothing drafted, nothing verified",
        "not in this iteration's block [{s}, {e}): nothing drafted here",
    )
    if rec is not None:
        st = step(timeline, iteration)
        if st.router is not None:
            rows.add("router this iteration", router_words(st.router))
        if st.outcome(position) is None:
            rows.add("this iteration", f"committed before this step's open positions [{st.c}, {st.e}): nothing drafted here")
        elif commit is None or commit.iteration != iteration:  # a commit this iteration has its verdict above
            rows.add("this iteration", _verdict(timeline, st, position))
    title = f"Position {position} · " + (f"iteration {iteration_number(iteration)} of {timeline.iterations}" if iteration >= 0 else "before the first forward (iteration 0)")
    return panel(title, rows, "Its drafts, step by step", _history(timeline, position, iteration))
