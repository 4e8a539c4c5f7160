"""What one grid cell is, shared by the page's grid (dinfer_viz/grid.py, dinfer_viz/uniform_grid.py)
and the exported frames (dinfer_viz/export.py): the states and their colours, the marks, a token's
text in a cell, the escaping every string gets, and the legend, which shows the states a run's kind
can have (a revising decoder's edits, a uniform-state run's noise) and no others."""

from __future__ import annotations

import html

from engine import EngineError
from engine.registry import decoder_class

from .timeline import Timeline
from .tokens import glyph, is_special

# state -> (background colour, legend label). Order is the legend's order.
CELL_COLOURS: dict[str, tuple[str, str]] = {
    "prompt": ("#e5e7eb", "prompt"),
    "masked": ("#374151", "masked"),
    "old": ("#bfdbfe", "committed earlier"),
    "new": ("#4ade80", "committed now, above threshold"),
    "forced": ("#fb923c", "committed now, forced top-1"),
    "fill": ("#f3f4f6", "filled by early stop"),
    # a revising decoder's changes to committed positions (engine/revising.py)
    "edited": ("#e879f9", "edited now (old token struck through)"),
    "remasked": ("#9f1239", "remasked now (back to [MASK])"),
    # a uniform-state run (engine/kinds/uniform.py): every position holds a token at every step
    "noise": ("#e7e5e4", "noise (a random token: not accepted)"),
    "accepted": ("#4ade80", "accepted this step (entropy sum within the bound)"),
    "output": ("#bfdbfe", "a finished canvas's output"),
}
# the states a revising decoder adds: the legend shows them for its runs only
REVISION_STATES = ("edited", "remasked")
# the states of a uniform-state run, and the masked-run states it has too (with its own labels)
UNIFORM_STATES = ("noise", "accepted", "output")
UNIFORM_LABELS = {"masked": "not generated yet", "fill": "after the row's end"}
# Marks drawn on top of a state: (CSS, legend label).
CELL_MARKS: dict[str, tuple[str, str]] = {
    "blk": ("box-shadow: inset 0 3px 0 #2563eb", "current block (blue top edge)"),
    "win": ("outline: 1px dashed #7c3aed; outline-offset: -1px", "recomputed this forward (dashed)"),
    "anchor": ("text-decoration: underline double #be185d", "anchor of a span"),
    "wrong": ("color: #b91c1c !important; font-weight: 700; text-decoration: line-through", "differs from the expected answer"),
    "chg": ("outline: 2px solid #f59e0b; outline-offset: -2px", "changed since the last step (orange frame)"),
}
MASKED_MARKS = ("blk", "win", "anchor", "wrong")
UNIFORM_MARKS = ("blk", "chg", "wrong")
# Characters that mean something to a JS template literal or to Handlebars, as HTML entities
# (the browser shows the character; neither template language sees it).
_TEMPLATE_ENTITIES = str.maketrans({"$": "&#36;", "`": "&#96;", "\\": "&#92;", "{": "&#123;", "}": "&#125;"})


def inert(text: str) -> str:
    """`text` as HTML that shows it literally and that no template step can turn into code."""
    return html.escape(text, quote=True).translate(_TEMPLATE_ENTITIES)


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


def legend_states(timeline: Timeline | None) -> list[tuple[str, str]]:
    """(state, label) the legend shows for `timeline`'s kind of run (None: before any run, a
    masked run's): a uniform-state run's own states, a masked run's without the revision states
    unless its decoder revises."""
    if timeline is not None and timeline.uniform:
        shown = ("prompt", "masked", *UNIFORM_STATES, "fill")
        return [(k, UNIFORM_LABELS.get(k, CELL_COLOURS[k][1])) for k in shown]
    revises = timeline is not None and (timeline.revises or _declared_revising(timeline))
    return [(k, label) for k, (_, label) in CELL_COLOURS.items() if k not in UNIFORM_STATES and (revises or k not in REVISION_STATES)]


def _declared_revising(timeline: Timeline) -> bool:
    """The run's decoder declares that it revises (known from the header, so a live grid's legend is
    the same from its first frame to its last: a legend that changed mid-run would redraw the grid
    and drop the live renderer's cells)."""
    try:
        return bool(getattr(decoder_class(str((timeline.trace.config or {}).get("decoder"))), "revises", False))
    except EngineError:  # a trace from a plug-in this app has not loaded: its records say
        return False


def legend_html(timeline: Timeline | None) -> str:
    """The legend above a grid, for `timeline`'s kind of run (`legend_states`). Labels are ours."""
    uniform = timeline is not None and timeline.uniform
    states = "".join(f'<span class="cell {k}">{label}</span>' for k, label in legend_states(timeline))
    marks = "".join(f'<span class="cell old {k}">{CELL_MARKS[k][1]}</span>' for k in (UNIFORM_MARKS if uniform else MASKED_MARKS))
    bar = f'<span class="cell masked blk" style="--c:0.6">yellow bar: {"the proposal" + chr(39) + "s probability" if uniform else "confidence now"}</span>'
    return f'<div class="legend">{states}</div><div class="legend">{marks}{bar}</div>'
