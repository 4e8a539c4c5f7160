"""What one grid cell is, shared by every kind's view (dinfer_viz/views/) and the exported frames
(dinfer_viz/panes/export.py): the states and their colours, the marks, a token's text in a cell, the
escaping every string gets, and the legend's HTML. A kind's view adds its own states and marks
(`add_states`) and picks the ones its legend shows (a revising decoder's edits only for a decoder
that revises)."""

from __future__ import annotations

import html
import re
from typing import NamedTuple

from ..reading.timeline import Revised, Timeline, iteration_number
from ..reading.tokens import glyph, is_special

# state -> (background colour, legend label). Order is the legend's order.
CELL_COLOURS: dict[str, tuple[str, str]] = {
    "prompt": ("#e5e7eb", "prompt"),
    "masked": ("#374151", "masked"),
    "old": ("#bfdbfe", "committed earlier"),
    "new": ("#4ade80", "committed now, above threshold"),
    "forced": ("#fb923c", "committed now, forced top-1"),
    "fill": ("#f3f4f6", "filled by early stop"),
    # text the request pinned in the answer (a suffix, a template's text between holes): the model
    # reads it and never writes it (docs/algorithms.md §11); every view and the frames use this state
    "pinned": ("#e6d3a3", "pinned by the request"),
    # a revising decoder's changes to committed positions (engine/decoders/revising.py)
    "edited": ("#e879f9", "edited now (old token struck through)"),
    "remasked": ("#9f1239", "remasked now (back to [MASK])"),
    # another kind's states follow, added by its view (`add_states`)
}
# the states a revising decoder adds: the legend shows them for its runs only
REVISION_STATES = ("edited", "remasked")
PINNED = "pinned"  # the state of a position the request pinned; legends name it for such runs only
PINNED_WORDS = "pinned by the request: the model reads it, no step writes it"  # its hover and details line
# A position where the answer's constraint removed the model's top-1 (dinfer_viz/drawing/constraint.py):
# the grid's corner mark and the raster's markers share this colour
CONSTRAINT_COLOUR = "#0891b2"


class Mark(NamedTuple):
    """A mark drawn on top of a cell's state: its CSS and its legend line."""

    css: str
    label: str


CELL_MARKS: dict[str, Mark] = {
    "blk": Mark("box-shadow: inset 0 3px 0 #2563eb", "current block (blue top edge)"),
    "win": Mark("outline: 1px dashed #7c3aed; outline-offset: -1px", "recomputed this forward (dashed)"),
    "anchor": Mark("text-decoration: underline double #be185d", "anchor of a span"),
    "wrong": Mark("color: #b91c1c !important; font-weight: 700; text-decoration: line-through", "differs from the expected answer"),
    # a dot on the cell's corner (panes/grid.py's `.cell.cut::before`), outside it: the state's colour, the
    # block's top edge and the confidence bar stay visible
    "cut": Mark("overflow: visible", "constraint removed the model's top-1 (teal dot)"),
}
# Characters that mean something to a JS template literal or to Handlebars, as HTML entities
# (the browser shows the character; neither template language sees it).
_TEMPLATE_ENTITIES = str.maketrans({"$": "&#36;", "`": "&#96;", "\\": "&#92;", "{": "&#123;", "}": "&#125;"})


# and Markdown's inline punctuation too, for a Markdown component (a regex `a*b*` is not emphasis);
# not `_`, which inside a word (every setting's name) never is, nor `(` `)`: with `[` `]` escaped
# no link or image can form, and a message (or an API client's string) keeps its parentheses
_MARKDOWN_ENTITIES = {**_TEMPLATE_ENTITIES, **str.maketrans({c: f"&#{ord(c)};" for c in "*[]|~!"})}


def inert(text: str) -> str:
    """`text` as HTML that shows it literally and that no template step can turn into code."""
    return html.escape(text, quote=True).translate(_TEMPLATE_ENTITIES)


# What Markdown reads as a link or emphasis with no punctuation of the set above: a bare address
# (GFM's autolinks: `http://`, `www.`, `a@b.c`) and `_` at a word's edge (`_x_`)
_MARKDOWN_WORDS = re.compile(r"://|www\.|@|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", re.IGNORECASE)


def inert_markdown(text: str) -> str:
    """`text` shown literally by a Markdown component: as `inert` makes it, and Markdown's
    punctuation too; quotes stay (a Markdown text is no attribute), so a message reads as written."""
    escaped = html.escape(text, quote=False).translate(_MARKDOWN_ENTITIES)
    return _MARKDOWN_WORDS.sub(lambda m: "".join(f"&#{ord(c)};" for c in m.group()), escaped)


PROMPT_CELLS_SHOWN = 48  # a long (chat-template) prompt is cut to its tail, with one summary cell


def first_shown(timeline: Timeline) -> int:
    """The first canvas position with a cell of its own; the ones before share a summary cell."""
    return max(0, min(timeline.view_start(), timeline.prompt_length - PROMPT_CELLS_SHOWN))


def summary_tip(first: int) -> str:
    return f"{first} earlier prompt tokens"


def cell_text(timeline: Timeline, token: int) -> str:
    if token == timeline.mask_id:
        return "▒"
    if timeline.is_end(token):
        return "∎"
    piece = timeline.piece(token)
    return piece if is_special(piece) else glyph(timeline.text_of(token))


def add_states(states: dict[str, tuple[str, str]], marks: dict[str, Mark]) -> None:
    """A kind's own cell states (state -> colour, legend label) and marks (mark -> CSS, label), for
    the page's CSS and the frames' palette; its view calls this when it is registered."""
    CELL_COLOURS.update(states)
    CELL_MARKS.update(marks)


def legend_block(states: list[tuple[str, str]], marks: tuple[str, ...], bar: str) -> str:
    """The legend above a grid: the (state, label) pairs, the marks, and what the yellow bar means.
    Labels are ours, never a visitor's string."""
    shown = "".join(f'<span class="cell {k}">{label}</span>' for k, label in states)
    drawn = "".join(f'<span class="cell old {k}">{CELL_MARKS[k].label}</span>' for k in marks)
    return f'<div class="legend">{shown}</div><div class="legend">{drawn}<span class="cell masked blk" style="--c:0.6">yellow bar: {bar}</span></div>'


def expected_at(timeline: Timeline, expected: list[int] | None, p: int) -> int | None:
    """The token `expected` (ids from the prompt's end) wants at position `p`, if any."""
    offset = p - timeline.prompt_length
    return expected[offset] if expected is not None and 0 <= offset < len(expected) else None


def revision_line(timeline: Timeline, revision: Revised) -> str:
    """A revision as a hover or details line: "iteration 7: edited '4' -> '7' (p(new) 0.930 >
    edit threshold 0.9)"."""
    return f"iteration {iteration_number(revision.iteration)}: {timeline.describe_revision(revision)}"


FILL_RUN_COLLAPSE = 3  # this many early-stop fill cells in a row or more show as one


def collapse_fill(cells: list[dict], what: str = "filled with end-of-text by early stop") -> list[dict]:
    """Runs of early-stop fill (often most of a long canvas) become one cell, which keeps the first
    position of its run as `p` (a click on it opens that position's details)."""
    out: list[dict] = []
    run: list[dict] = []

    def flush() -> None:
        if len(run) >= FILL_RUN_COLLAPSE:
            a, b = run[0]["p"], run[-1]["p"]
            out.append({"t": f"∎×{len(run)}", "k": "fill", "tip": f"pos {a}–{b}: {what}", "c": 0.0, "p": a})
        else:
            out.extend(run)
        run.clear()

    for cell in cells:
        if cell["k"].split()[0] == "fill":  # a recomputed-window mark on fill is not worth a cell each
            run.append(cell)
            continue
        flush()
        out.append(cell)
    flush()
    return out
