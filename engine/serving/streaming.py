"""A row's text as it becomes final, for server-sent events (docs/serving.md, "Streaming").

What a stream sends is only ever final: the left-to-right prefix of the answer that no later
iteration can change, so a client appends deltas and never has to take text back. Which tokens
are final is the loop's to say, per row, in each record's `final_until` (docs/trace.md §3: a
committed token at once for a decoder that never revises, a block's when the loop leaves it for
one that does, a uniform-state canvas's when it writes its output). The prefix also ends
at the first end-of-text id, at `max_tokens` tokens, before a stop string (the text that could
still become one is held back) and before an incomplete character.

A stream that asks for it (`provisional: true`) also gets the draft after the final text
(`RowText.provisional`): what the run holds or predicts at each position after its last record,
as the kind's own rules say (engine/step_state.py `StepState.current`: committed tokens not final
yet and the top-1 at the block's open positions for masked diffusion, the current draft of a
speculative step, a uniform-state canvas's argmax draft), up to the first position it has no
guess for; text that may still change, which a client draws and replaces.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..step_state import step_state
from ..trace import IterationRecord, Trace, record_writes

INCOMPLETE = "\ufffd"  # what decode writes for a character whose bytes have not all arrived


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found."""
    ends = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def _undecided_tail(text: str, stops: list[str]) -> int:
    """How many final characters could still grow into a stop string (held back until they can't)."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


class RowText:
    """One row's text: `update` with each of the row's records (a stream), `finish` with its final canvas."""

    def __init__(self, header: Trace, decode: Callable[[list[int]], str], max_tokens: int, stops: list[str]) -> None:
        self.canvas = list(header.initial[0])
        self.start = header.prompt_lengths[0]
        self.mask_id, self.stop_ids, self.kind = header.mask_id, set(header.eos_ids), header.kind
        self.decode, self.max_tokens, self.stops = decode, max_tokens, stops
        self.sent = ""
        self.held: list[int | None] = []  # per position, what the run held or predicted after its last record

    def _answer(self, ids: list[int]) -> tuple[list[int], bool]:
        """The answer's ids up to the first end-of-text and at most max_tokens; whether it ended
        there (an end-of-text right after max_tokens tokens too: the whole answer fit)."""
        for i, token in enumerate(ids[: self.max_tokens + 1]):
            if token in self.stop_ids:
                return ids[:i], True
        return ids[: self.max_tokens], False

    def update(self, rec: IterationRecord) -> str:
        """The text this record made final, beyond what was sent."""
        for p, token in record_writes(rec, 0, self.kind):
            self.canvas[p] = token
        self.held = step_state(self.kind).current(rec, 0, self.canvas, self.mask_id)
        committed = []
        for token in self.canvas[self.start : rec.final_until[0]]:
            if token == self.mask_id:
                break
            committed.append(token)
        ids, _ = self._answer(committed)
        text, stopped = cut_at_stop(self.decode(ids), self.stops)
        if not stopped:
            text = text.rstrip(INCOMPLETE)
            text = text[: len(text) - _undecided_tail(text, self.stops)]
        return self._delta(text)

    def provisional(self) -> str:
        """The draft after the text sent so far (module docstring): committed and guessed tokens
        up to the first position without either, cut as the final text is (end of text, max_tokens,
        stop strings); "" when the draft does not extend what was sent."""
        draft = []
        for token in self.held[self.start :]:
            if token is None or token == self.mask_id:
                break
            draft.append(token)
        ids, _ = self._answer(draft)
        text, _ = cut_at_stop(self.decode(ids), self.stops)
        return text[len(self.sent) :] if text.startswith(self.sent) else ""

    def _delta(self, text: str) -> str:
        # appending tokens never changes the text of the ones before (incomplete characters are
        # held back), so `text` extends what was sent; if a tokenizer ever disagrees, send nothing
        # now and let `finish` send the rest
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, canvas: list[int]) -> tuple[str, str, int]:
        """(the rest of the text, finish reason, completion tokens) from the row's final canvas."""
        ids, ended = self._answer(canvas[self.start :])
        text, stopped = cut_at_stop(self.decode(ids), self.stops)
        reason = "stop" if ended or stopped else "length"
        return text[len(self.sent) :] if text.startswith(self.sent) else "", reason, len(ids)


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <json>` (or the literal `[DONE]`) and a blank line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
