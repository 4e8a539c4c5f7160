"""The details panel's HTML pieces, shared by every kind's panel (dinfer_viz/views/): its styles, how a number and a token are
written, the iteration-by-iteration table and the panel around the rows. Every string that reaches
the HTML goes through `grid.inert` (token strings come from tokenizers and trace files, i.e. anyone).
"""

from __future__ import annotations

from typing import Any

from engine import IterationRecord

from .cells import expected_at, inert
from ..reading.timeline import Timeline

BASE_FONT = 20  # px: read from the back of a room
HISTORY_ROWS = 40  # a block decoded over more iterations shows its last ones
_STYLE = (
    f"font-size:{BASE_FONT}px;line-height:1.45;color:#111827;background:#ffffff;"
    "border:2px solid #d1d5db;border-radius:8px;padding:14px 18px;max-width:1100px"
)
# labels wrap between words: unwrapped, a long one ("probability before the credit boost") pushed the values out of
# the panel in a projector's narrow column
_LABEL = "color:#4b5563;padding:4px 12px 4px 0;vertical-align:top"
NOTE = "color:#4b5563;font-size:18px"
_CELL = "padding:2px 12px 2px 0"


def run_option(timeline: Timeline, decoder: type, name: str) -> Any:
    """The shown run's value of `decoder`'s declared option `name`: the trace config's
    `decoder_options` (old traces' spellings are lifted there on load), else the declared default;
    None for options that are not an object (a trace file's config is untrusted display data)."""
    options = (timeline.trace.config or {}).get("decoder_options") or {}
    return options.get(name, decoder.options[name].default) if isinstance(options, dict) else None


def message_line(text: str) -> str:
    """The one-line message for a request the trace cannot answer."""
    return f'<div class="pos-details" style="font-size:{BASE_FONT}px;color:#4b5563">{inert(text)}</div>'


def number(value: float, against: float | None = None) -> str:
    """A number with 3 decimals, 4 when 3 would print it equal to the value it is compared with
    (the trace keeps 4: 0.8996 against τ 0.90 must not read "0.900 < τ 0.90")."""
    text = f"{value:.3f}"
    if against is not None and text == f"{against:.3f}" and value != against:
        text = f"{value:.4f}"
    return text


def token_name(timeline: Timeline, token: int, mask_word: str = "[MASK]") -> str:
    """A token as the page names it: its text (quoted, so spaces show) and id; the header's
    `mask_id` as `mask_word` (a kind's view says what it is: [MASK], or a uniform-state run's pad)."""
    if token == timeline.mask_id:
        return f"{mask_word} (id {token})"
    return f"{timeline.text_of(token)!r} (id {token})"


class PanelRows(list):
    """A panel's (label, value as escaped HTML) rows, as every kind's details panel builds them:
    each added as text and escaped here."""

    def add(self, label: str, text: str) -> None:
        self.append((label, inert(text)))

    def add_position(self, timeline: Timeline, position: int, span: str, never: str) -> None:
        """The "position" row: the prompt, or which generated token, in which `span` of the run
        ("block", "canvas") it first stood, or `never` when the run reached none."""
        first = next((rec for rec in timeline.records if rec.block_range[0] <= position < rec.block_range[1]), None)
        in_prompt = position < timeline.prompt_length
        pinned = position in timeline.pinned
        where = "prompt" if in_prompt else "pinned by the request" if pinned else f"generated token {position - timeline.prompt_length + 1} of the answer"
        if first is not None:
            where += f", {span} {first.block} [{first.block_range[0]}, {first.block_range[1]})"
        elif pinned:  # blocks end at the last hole: text pinned after it is context (docs/algorithms.md §11)
            where += f", after the last hole: in no {span}, the model reads it as context"
        elif not in_prompt:
            where += f", {never}"
        self.add("position", f"{position} ({where})")

    def record_holding(self, timeline: Timeline, iteration: int, position: int, before: str, outside: str) -> IterationRecord | None:
        """The record shown (`iteration`) when the range it worked on (its block, its canvas) holds
        `position`; else None, with the "this iteration" row that says why: `before` the first
        record, or `outside` the range (formatted with its bounds `s` and `e`)."""
        if iteration < 0:
            self.add("this iteration", before)
            return None
        rec = timeline.records[iteration]
        s, e = rec.block_range
        if s <= position < e:
            return rec
        self.add("this iteration", outside.format(s=s, e=e))
        return None

    def add_expected(self, timeline: Timeline, expected: list[int] | None, position: int, token: int, pending: str | None, mask_word: str = "[MASK]") -> None:
        """The "expected" row: the token the answer wants at `position` and whether `token` (the one
        there) matches it, or `pending` when nothing is chosen there yet; no row without an answer."""
        want = expected_at(timeline, expected, position)
        if want is not None:
            verdict = pending if pending is not None else "matches" if want == token else "differs from the token here"
            self.add("expected", f"{token_name(timeline, want, mask_word)}: {verdict}")


def history_table(head: tuple[str, ...], rows: list[tuple[tuple[str, ...], bool]]) -> str:
    """A table of `rows` (cells as text, and whether the row is the iteration shown, highlighted)
    under `head`, the last HISTORY_ROWS of them with a note of how many were left out."""
    cells = []
    for values, shown in rows:
        weight = "font-weight:700;background:#fef9c3" if shown else ""
        # each cell names its column (data-label): in a narrow panel a row reads as one line of
        # "column value" pairs, the page's CSS hiding the header (dinfer_viz/ui.py)
        cells.append(f'<tr style="{weight}">' + "".join(f'<td data-label="{inert(h)}" style="{_CELL}">{inert(c)}</td>' for h, c in zip(head, values, strict=True)) + "</tr>")
    header = "".join(f'<th style="text-align:left;{_CELL}">{inert(h)}</th>' for h in head)
    dropped = len(cells) - HISTORY_ROWS
    note = f'<div style="{NOTE}">{dropped} earlier iterations not shown</div>' if dropped > 0 else ""
    # wider than the panel (a uniform-state run's eight columns beside the grid), the table scrolls
    # sideways in its own box, never past the panel's edge
    table = f'<table style="border-collapse:collapse;font-size:18px;font-variant-numeric:tabular-nums"><tr>{header}</tr>{"".join(cells[-HISTORY_ROWS:])}</table>'
    return f'{note}<div class="history" style="overflow-x:auto;max-width:100%">{table}</div>'


def panel(title: str, rows: list[tuple[str, str]], history_title: str, history: str) -> str:
    """The panel: `title`, the (label, value as escaped HTML) rows, then `history` (a
    `history_table`, or "" for none) under `history_title`."""
    body = "".join(f'<tr><td style="{_LABEL}">{inert(label)}</td><td style="padding:4px 0">{value}</td></tr>' for label, value in rows)
    history_html = f'<div style="margin-top:12px;font-weight:600">{inert(history_title)}</div>{history}' if history else ""
    return (
        f'<div class="pos-details" style="{_STYLE}">'
        f'<div style="font-size:{BASE_FONT + 6}px;font-weight:700;margin-bottom:8px">{inert(title)}</div>'
        f'<table style="border-collapse:collapse">{body}</table>{history_html}</div>'
    )
