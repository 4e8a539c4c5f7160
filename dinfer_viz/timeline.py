"""One row of a trace as per-position history: the shared model behind every view.

A `Timeline` answers what the views ask: the canvas after iteration i, when and how each
position was committed (iteration, token, the confidence it had then, forced or not), and the
token text to show. It is built from a finished trace (replay, upload) or fed record by record
while the engine runs (live), so live and replay render the same data the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import IterationRecord, Trace

from .tokens import is_special, readable

# Cache forward kinds that compute the whole canvas (engine/cache.py); the others use cached K/V.
EXACT_FORWARDS = ("full", "refresh")


def iteration_number(index: int) -> int:
    """The number the page shows for record `index`: iterations count 1..N, as a class counts
    forwards, and 0 is the canvas before the first forward (record index -1). Timeline methods
    and the engine's records stay 0-based; only what is drawn or written for people uses this."""
    return index + 1


@dataclass(frozen=True)
class Commit:
    iteration: int
    token: int
    confidence: float  # the decoder's confidence in `token` when it committed it
    forced: bool  # committed only by the at-least-one rule, below the threshold


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
        self.records: list[IterationRecord] = []
        self.commits: dict[int, Commit] = {}
        self._tokens: list[int] = []  # commits that are not an end-of-text id, up to each record
        for rec in trace.iterations:
            self.add(rec)

    def add(self, rec: IterationRecord) -> None:
        index = len(self.records)
        start = rec.block_range[0]
        forced = set(rec.forced[self.row])
        tokens = self._tokens[-1] if self._tokens else 0
        for p in rec.committed[self.row]:
            token = rec.top1[self.row][p - start]
            self.commits[p] = Commit(index, token, rec.confidence[self.row][p - start], p in forced)
            if token not in self.trace.eos_ids:
                tokens += 1
        self._tokens.append(tokens)
        self.records.append(rec)

    def committed_tokens(self, records: int | None = None) -> int:
        """Tokens (end-of-text excluded) committed by the first `records` records (default: all)."""
        n = self.iterations if records is None else min(records, self.iterations)
        return self._tokens[n - 1] if n > 0 else 0

    # ---- shape -------------------------------------------------------------------------------
    @property
    def iterations(self) -> int:
        return len(self.records)

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
        leaves the rest undecoded)."""
        if not self.finished:
            return self.canvas_length
        return max([rec.block_range[1] for rec in self.records] + [self.prompt_length])

    def clamp(self, iteration: int) -> int:
        """An iteration index within this timeline (-1: before the first forward)."""
        return max(-1, min(iteration, self.iterations - 1))

    # ---- state at an iteration ------------------------------------------------------------------
    def canvas_at(self, iteration: int) -> list[int]:
        """Canvas after record `iteration` (-1: before any); at the last record of a finished
        run, positions filled by early stop (they have no commit) come from the final canvas."""
        canvas = list(self.initial)
        for p, c in self.commits.items():
            if c.iteration <= iteration:
                canvas[p] = c.token
        if self.finished and iteration >= self.iterations - 1:
            final = self.trace.final[self.row]
            canvas = [f if x == self.mask_id else x for x, f in zip(canvas, final)]
        return canvas

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
