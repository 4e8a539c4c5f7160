"""A self-speculative run's steps as its views read them (engine/kinds/speculative.py; the record's
`state`: docs/trace.md §3.4): what each step drafted, what the verifier said, and the fate of each
drafted position; the grid's cells and the caption built on that. Strings are plain text here: the
grid escapes them (`cells.inert`), the live renderer sets them as text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...drawing.cells import cell_text, expected_at, first_shown, summary_tip
from ...reading.timeline import Timeline, iteration_number
from ..masked.masked_grid import COMMITTED_STATES, STATE_TIPS, cell_state as masked_state
from .speculative_figures import router_words

# the fate of a drafted position at its step (`Step.outcome`), in the words the views share
KEPT = "kept: verifier agrees"
REPLACED = "replaced: verifier's argmax differs"
AFTER = "not verified: after the first disagreement"
SKIP_KEPT = "kept without a verify: the draft's run from the first open position was all at least τ_v confident"
ROUTER_KEPT = "kept without a verify: the router skipped it (in the draft's confident run, or the one open position)"
SKIP_OPEN = "not committed: after the draft's confident run (the verify was skipped)"
# a still-open position whose draft the verifier also contradicts, after the correction
REJECTED = "rejected draft"


@dataclass(frozen=True)
class Step:
    """One speculative record's step, for the timeline's row: its block `[s, e)`, the first open
    position `c` (the draft covers `[c, e)`), the per-block-position lists of the state, and what
    it committed."""

    s: int
    e: int
    c: int
    draft: list
    draft_p: list
    verify: list
    verify_p: list
    verified: bool
    accepted: int
    corrected: int | None
    committed: tuple[int, ...]
    verify_threshold: float | None
    router: dict | None  # the router's decision (verify=router), else None

    @property
    def drafted(self) -> int:
        return self.e - self.c

    def at(self, values: list, p: int) -> Any:
        return values[p - self.s] if self.s <= p < self.e else None

    def outcome(self, p: int) -> str | None:
        """What the step did with its draft at `p` (None: `p` was not drafted this step)."""
        if not self.c <= p < self.e:
            return None
        if not self.verified:
            return (ROUTER_KEPT if self.router is not None else SKIP_KEPT) if p in self.committed else SKIP_OPEN
        if p == self.corrected:
            return REPLACED
        if p in self.committed:
            return KEPT
        return AFTER

    def rejected(self, p: int) -> bool:
        """`p` stays open holding a draft the verifier contradicts, after the correction."""
        return self.corrected is not None and p > self.corrected and self.c <= p < self.e and self.at(self.draft, p) != self.at(self.verify, p)


def step(timeline: Timeline, index: int) -> Step:
    rec, row = timeline.records[index], timeline.row
    st = rec.state
    s, e = rec.block_range
    return Step(
        s, e, st["open_from"][row], st["draft"][row], st["draft_probability"][row], st["verify"][row], st["verify_probability"][row],
        st["verified"][row], st["accepted"][row], st["corrected"][row], tuple(rec.committed[row]), st.get("verify_threshold"),
        st.get("router", [None])[row],
    )


def token_words(timeline: Timeline, token: int | None, p: float | None) -> str:
    """"'x' (id 7) p 0.912", or "—" for none."""
    if token is None:
        return "—"
    return f"{timeline.text_of(token)!r} (id {token})" + ("" if p is None else f" p {p:.3f}")


def draft_and_verifier(timeline: Timeline, st: Step, p: int) -> str:
    """The hover line of a drafted position: the draft token and its probability, the verifier's."""
    verifier = token_words(timeline, st.at(st.verify, p), st.at(st.verify_p, p)) if st.verified else "not run (verify skipped)"
    return f"draft {token_words(timeline, st.at(st.draft, p), st.at(st.draft_p, p))} · verifier {verifier}"


def speculative_state(timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
    """The masked states (prompt, masked, fill, new, old), and after record `iteration`:
    `corrected` at its correction, `rejected` at an open position whose draft the verifier also
    contradicts after it."""
    kind = masked_state(timeline, canvas, p, iteration)
    if iteration < 0:
        return kind
    st = step(timeline, iteration)
    if kind == "new" and p == st.corrected:
        return "corrected"
    if kind == "masked" and st.rejected(p):
        return "rejected"
    return kind


def cells(timeline: Timeline, iteration: int, expected: list[int] | None) -> list[tuple[int, str, list[str], list[str], float]]:
    """(position, text, classes, hover lines, bar) of each cell after record `iteration`, the
    summary cell of a long prompt's head first (position -1)."""
    canvas = timeline.canvas_at(iteration)
    st = step(timeline, iteration) if iteration >= 0 else None
    rec = timeline.records[iteration] if iteration >= 0 else None
    first = first_shown(timeline)
    out: list[tuple[int, str, list[str], list[str], float]] = [(-1, f"…{first}", ["prompt"], [summary_tip(first)], 0.0)] if first > 0 else []
    for p in range(first, timeline.canvas_length):
        token = canvas[p]
        kind = speculative_state(timeline, canvas, p, iteration)
        commit = timeline.commit_at(p, iteration)
        text = cell_text(timeline, token)
        if kind in ("prompt", "masked", "fill"):
            tip = [f"pos {p} · {STATE_TIPS[kind]}"]
        elif kind == "rejected":
            tip = [f"pos {p} · still open: {REJECTED} (after the correction at {st.corrected}, and the verifier's guess differs)"]
            text = cell_text(timeline, st.at(st.draft, p))
        else:
            how = step(timeline, commit.iteration).outcome(p)
            tip = [f"pos {p} · committed at iteration {iteration_number(commit.iteration)} ({how})"]
        if token != timeline.mask_id:
            tip.insert(1, f"token {timeline.text_of(token)!r} (id {token})")
        classes, bar = [kind], 0.0
        if st is not None and st.s <= p < st.e:
            classes.append("blk")
            bar = float(rec.confidence[timeline.row][p - st.s])
            if p >= st.c:
                tip.append(f"this step: {draft_and_verifier(timeline, st, p)} · {st.outcome(p)}")
        want = expected_at(timeline, expected, p)
        if (kind in COMMITTED_STATES or kind == "corrected") and want is not None and want != token:
            classes.append("wrong")
            tip.append(f"expected {timeline.text_of(want)!r} (id {want})")
        out.append((p, text, classes, tip, round(bar, 3)))
    return out


def caption(timeline: Timeline, iteration: int, total: int) -> str:
    """"iteration 3/11 · block 1 [8, 16) · drafted 8, accepted 2, corrected at 10 (verifier 'x')"."""
    rec = timeline.records[iteration]
    st = step(timeline, iteration)
    head = f"iteration {iteration_number(iteration)}/{total} · block {rec.block} [{st.s}, {st.e}) · drafted {st.drafted}"
    if st.router is not None:
        head += f" · router {router_words(st.router)}"
    if not st.verified:
        if st.router is not None:
            return f"{head}, committed {len(st.committed)} without a verify"
        tau = "" if st.verify_threshold is None else f" {st.verify_threshold:g}"
        return f"{head}, committed {len(st.committed)}: skipped the verify (all committed drafts ≥ τ_v{tau})"
    if st.corrected is None:
        return f"{head}, accepted {st.accepted}: the verifier agreed with every drafted token"
    fix = st.at(rec.top1[timeline.row], st.corrected)
    return f"{head}, accepted {st.accepted}, corrected at {st.corrected} (verifier {timeline.text_of(fix)!r})"
