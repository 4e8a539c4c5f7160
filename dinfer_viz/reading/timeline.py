"""One row of a trace as per-position history: the shared model behind every view.

A `Timeline` answers what the views ask: the canvas after iteration i, when and how each
position was committed (iteration, token, the confidence it had then, forced or not), and the
token text to show. It is built from a finished trace (replay, upload) or fed record by record
while the engine runs (live), so live and replay render the same data the same way.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from engine import EngineError, IterationRecord, Trace
from engine.trace import EDIT, REMASK, record_writes

from .tokens import is_special, readable

# Cache forward kinds that compute the whole canvas (engine/cache.py); the others use cached K/V.
EXACT_FORWARDS = ("full", "refresh")


def iteration_number(index: int) -> int:
    """The number the page shows for record `index`: iterations count 1..N, as a class counts
    forwards, and 0 is the canvas before the first forward (record index -1). Timeline methods
    and the engine's records stay 0-based; only what is drawn or written for people uses this."""
    return index + 1


def record_index(number: Any) -> int:
    """The record index of the iteration number a person or an API client gave (the slider's: 0
    before the first forward, 1..N): the replay handlers take the raw value, since Gradio's own
    check of a slider's value fails on a non-number with a generic error; EngineError in one
    line for anything that is not a whole number."""
    try:
        value = float(number)
    except (TypeError, ValueError, OverflowError):
        raise EngineError(f"the iteration to show must be a whole number (0 = before the first forward), not {str(number)[:40]!r}") from None
    if isinstance(number, bool) or not math.isfinite(value) or value != int(value):
        raise EngineError(f"the iteration to show must be a whole number (0 = before the first forward), not {str(number)[:40]!r}")
    return int(value) - 1


@dataclass(frozen=True)
class Commit:
    iteration: int
    token: int
    confidence: float  # the decoder's confidence in `token` when it committed it
    forced: bool  # committed only by the at-least-one rule, below the threshold


@dataclass(frozen=True)
class Revised:
    """A committed position a revising decoder changed at record `iteration` (docs/trace.md §3.1):
    `kind` EDIT (`old` -> `new`) or REMASK (`new` is [MASK]), because `score` compared with
    `bound` as `rule` says."""

    iteration: int
    position: int
    kind: str
    old: int
    new: int
    rule: str
    score: float
    bound: float


_OPERATORS = (" >= ", " <= ", " > ", " < ", " ≥ ", " ≤ ")


class Timeline:
    """Per-position history of row `row` of `trace`; `add` appends a record while live."""

    def __init__(self, trace: Trace, row: int = 0) -> None:
        if not trace.initial:
            raise ValueError("the trace has no initial canvas")
        if not 0 <= row < len(trace.initial):
            raise ValueError(f"row {row} is not in the trace (it has {len(trace.initial)})")
        self.trace = trace
        self.row = row
        self.initial = list(trace.initial[row])
        self.prompt_length = trace.prompt_lengths[row]
        # the positions the request pinned (a suffix, a template's text: docs/algorithms.md §11), which
        # no step writes; none in a trace without them (before version 7, or nothing was pinned)
        self.pinned: frozenset[int] = frozenset(trace.pinned[row]) if trace.pinned else frozenset()
        self.records: list[IterationRecord] = []
        self.commits: dict[int, Commit] = {}  # each position's latest commit
        # every commit of a position, in order: a remasked position may be committed again
        self.commit_log: dict[int, list[Commit]] = {}
        self.revisions: dict[int, list[Revised]] = {}  # per position, in order
        self.record_revisions: list[list[Revised]] = []  # per record, this row's
        self.revision_counts: dict[str, int] = {EDIT: 0, REMASK: 0}
        # per position, (record index, token) of every write in replay order: commits, then revisions
        self._writes: dict[int, list[tuple[int, int]]] = {}
        # the diffusion kind that ran and its decoder's declared capabilities, from the header (so a
        # live timeline knows them before its first record): dinfer_viz/views/ picks the run's view by it
        self.kind = trace.kind
        self.capabilities = dict(trace.capabilities or {})
        for rec in trace.iterations:
            self.add(rec)

    def add(self, rec: IterationRecord) -> None:
        index = len(self.records)
        start = rec.block_range[0]
        forced = set(rec.forced[self.row])
        for p in rec.committed[self.row]:
            commit = Commit(index, rec.top1[self.row][p - start], rec.confidence[self.row][p - start], p in forced)
            self.commits[p] = commit
            self.commit_log.setdefault(p, []).append(commit)
        revised = []
        for r in (rec.revisions[self.row] if rec.revisions else []):
            revision = Revised(index, r["position"], r["kind"], r["old"], r["new"], r["rule"], float(r["score"]), float(r["bound"]))
            revised.append(revision)
            self.revisions.setdefault(revision.position, []).append(revision)
            self.revision_counts[revision.kind] = self.revision_counts.get(revision.kind, 0) + 1
        for p, token in record_writes(rec, self.row, self.kind):
            self._writes.setdefault(p, []).append((index, token))
        self.record_revisions.append(revised)
        self.records.append(rec)

    # ---- shape -------------------------------------------------------------------------------
    @property
    def iterations(self) -> int:
        return len(self.records)

    def forwards(self, shown: int) -> int:
        """The model forwards of the first `shown` records: the run's NFE so far, as the engine
        counted it (a record may stand for several: a speculative draft and verify, a uniform
        canvas's encoder forward with its first step)."""
        return sum(rec.forwards for rec in self.records[:shown])

    @property
    def canvas_length(self) -> int:
        return len(self.initial)

    @property
    def mask_id(self) -> int:
        return self.trace.mask_id

    @property
    def finished(self) -> bool:
        """The trace has its footer (final canvas and stats): the run ended normally."""
        return bool(self.trace.final) and bool(self.trace.stats)

    def view_start(self) -> int:
        """First canvas position the views show: the first block's start (aligned blocks may
        begin inside the prompt), else the prompt's end."""
        starts = [rec.block_range[0] for rec in self.records]
        return min(starts + [self.prompt_length])

    def view_end(self) -> int:
        """Last canvas position the figures show, plus one: the canvas end while a run can still
        reach it (a live view keeps its axes), else the end of the last block decoded (early stop
        leaves the rest undecoded) or of the text the request pinned, which the model read."""
        if not self.finished:
            return self.canvas_length
        return max([rec.block_range[1] for rec in self.records] + [self.prompt_length] + [p + 1 for p in self.pinned])

    def clamp(self, iteration: int) -> int:
        """An iteration index within this timeline (-1: before the first forward)."""
        return max(-1, min(iteration, self.iterations - 1))

    # ---- state at an iteration ------------------------------------------------------------------
    def canvas_at(self, iteration: int) -> list[int]:
        """Canvas after record `iteration` (-1: before any); at the last record of a finished
        run, positions filled by early stop (they have no commit) come from the final canvas."""
        canvas = list(self.initial)
        for p, writes in self._writes.items():
            k = bisect.bisect_right(writes, (iteration, float("inf")))
            if k:
                canvas[p] = writes[k - 1][1]
        if self.finished and iteration >= self.iterations - 1:
            final = self.trace.final[self.row]
            canvas = [f if x == self.mask_id else x for x, f in zip(canvas, final)]
        return canvas

    def token_before(self, position: int, index: int) -> int:
        """The token `position` held when record `index` started (its decoder read this)."""
        writes = self._writes.get(position, [])
        k = bisect.bisect_left(writes, (index, -1))
        return writes[k - 1][1] if k else self.initial[position]

    def commit_at(self, position: int, iteration: int) -> Commit | None:
        """The commit behind `position`'s token after record `iteration`: its latest commit up to
        then, unless a remask since took it back (None: never committed, or back to [MASK])."""
        done = [c for c in self.commit_log.get(position, []) if c.iteration <= iteration]
        if not done:
            return None
        taken_back = any(r.kind == REMASK and done[-1].iteration < r.iteration <= iteration for r in self.revisions.get(position, []))
        return None if taken_back else done[-1]

    def revision_at(self, position: int, iteration: int) -> Revised | None:
        """The revision record `iteration` made at `position`, if it made one."""
        return next((r for r in self.revisions.get(position, []) if r.iteration == iteration), None)

    @property
    def revises(self) -> bool:
        """The run's decoder may revise its commits (its records carry revisions, maybe empty)."""
        return any(rec.revisions is not None for rec in self.records)

    def describe_revision(self, revision: Revised) -> str:
        """A revision in words with the numbers its rule compared, e.g. "edited '4' -> '7'
        (p(new) 0.930 > edit threshold 0.9)"; the rule's text comes from the trace (docs/trace.md §3.1)."""
        if revision.kind == EDIT:
            what = f"edited {self.text_of(revision.old)!r} -> {self.text_of(revision.new)!r}"
        else:
            what = f"remasked {self.text_of(revision.old)!r} -> [MASK]"
        found = [(revision.rule.find(op), op) for op in _OPERATORS if op in revision.rule]
        operator = min(found)[1] if found else None  # the first comparison in the rule's text
        if operator is None:
            why = f"{revision.rule}: {revision.score:.3f} against {revision.bound:g}"
        else:
            left, right = revision.rule.split(operator, 1)
            why = f"{left} {revision.score:.3f}{operator}{right} {revision.bound:g}"
        return f"{what} ({why})"

    def extras_at(self, iteration: int) -> dict[str, list]:
        """This row's per-position extras of record `iteration`, one value per block position
        (decoder/cache specifics: credit, runs, anchors, staleness...)."""
        out = {}
        for name, value in self.records[iteration].extras.items():
            if isinstance(value, list) and len(value) > self.row and isinstance(value[self.row], list):
                out[name] = value[self.row]
        return out

    def scalar_extras_at(self, iteration: int) -> dict[str, float]:
        """This row's single-number extras of record `iteration` (e.g. smoothing's cont_weight):
        a number for the whole batch, or one per row."""
        out = {}
        for name, value in self.records[iteration].extras.items():
            if isinstance(value, list) and len(value) > self.row:
                value = value[self.row]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = float(value)
        return out

    @property
    def expected(self) -> list[int] | None:
        """The expected answer's ids the run was given, as its header carries them for this row
        (their strings are in the header's `tokens`); None when it had none."""
        rows = self.trace.expected
        return (list(rows[self.row]) or None) if rows and len(rows) > self.row else None

    # ---- text -----------------------------------------------------------------------------------
    def piece(self, token: int) -> str:
        return self.trace.tokens.get(str(token), f"<{token}>")

    def text_of(self, token: int) -> str:
        return readable(self.piece(token))

    def is_end(self, token: int) -> bool:
        return token in self.trace.eos_ids

    def judged_answer(self, text: str) -> str:
        """What a family's verifier judges for a run whose engine text was `text` (its holes' text):
        the holes with the text the request pinned in place, end-of-text inside a hole dropped
        (a hole filled by ` 23` before ` + 34` answers ` 23 + 34`, as benchmarks/infill.py scores
        it); `text` itself when nothing was pinned."""
        if not self.pinned:
            return text
        canvas = self.canvas_at(self.iterations - 1)[self.prompt_length : self.view_end()]
        return "".join(self.text_of(t) for t in canvas if not self.is_end(t) and t != self.mask_id and not is_special(self.piece(t)))

    def text_at(self, iteration: int, mask_glyph: str = "░") -> str:
        """The generated part of the canvas as text, masks as `mask_glyph`, stopping at the first
        end-of-text token (what the user would read)."""
        out = []
        for token in self.canvas_at(iteration)[self.prompt_length :]:
            if self.is_end(token):
                break
            if token == self.mask_id:
                out.append(mask_glyph)
            elif not is_special(self.piece(token)):
                out.append(self.text_of(token))
        return "".join(out)
