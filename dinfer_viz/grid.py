"""The token grid: one cell per canvas position at a chosen iteration, as data for a gr.HTML template.

Gradio diffs a component's JSON value between streamed frames, so the grid travels as a list of
small per-cell dicts (`t` text, `k` CSS classes, `tip` hover text, `c` confidence) and the browser
renders them with `GRID_TEMPLATE`: a frame that commits three tokens sends three changed cells,
not the whole HTML.

Every string in the value comes from a tokenizer or a trace file, i.e. from someone else: Gradio
renders the template with Handlebars and then evaluates the result as a JavaScript template
literal, so Handlebars' own escaping (which leaves `${`, backticks and backslashes alone) is not
enough: a token `${alert(1)}` would run. `inert` escapes those too, and the template inserts the
escaped strings raw (`{{{...}}}`) so they are not escaped twice. Colours come from `CELL_COLOURS`, one explicit map shared by the CSS, the
legend and the figures (never hex strings used as labels).
"""

from __future__ import annotations

import html

from .timeline import EXACT_FORWARDS, Timeline
from .tokens import glyph, is_special

# state -> (background colour, legend label). Order is the legend's order.
CELL_COLOURS: dict[str, tuple[str, str]] = {
    "prompt": ("#e5e7eb", "prompt"),
    "masked": ("#374151", "masked"),
    "old": ("#bfdbfe", "committed earlier"),
    "new": ("#4ade80", "committed now, above threshold"),
    "forced": ("#fb923c", "committed now, forced top-1"),
    "fill": ("#f3f4f6", "filled by early stop"),
}
# Marks drawn on top of a state: (CSS, legend label).
CELL_MARKS: dict[str, tuple[str, str]] = {
    "blk": ("box-shadow: inset 0 3px 0 #2563eb", "current block (blue top edge)"),
    "win": ("outline: 1px dashed #7c3aed; outline-offset: -1px", "recomputed this forward (dashed)"),
    "anchor": ("text-decoration: underline double #be185d", "anchor of a span"),
    "wrong": ("color: #b91c1c !important; font-weight: 700; text-decoration: line-through", "differs from the expected answer"),
}
# Characters that mean something to a JS template literal or to Handlebars, as HTML entities
# (the browser shows the character; neither template language sees it).
_TEMPLATE_ENTITIES = str.maketrans({"$": "&#36;", "`": "&#96;", "\\": "&#92;", "{": "&#123;", "}": "&#125;"})


def inert(text: str) -> str:
    """`text` as HTML that shows it literally and that no template step can turn into code."""
    return html.escape(text, quote=True).translate(_TEMPLATE_ENTITIES)


PROMPT_CELLS_SHOWN = 48  # a long (chat-template) prompt is cut to its tail, with one summary cell
FILL_RUN_COLLAPSE = 3  # this many early-stop fill cells in a row or more show as one


def grid_value(timeline: Timeline, iteration: int, expected: list[int] | None = None) -> dict:
    """Cells and a caption for `timeline` after record `iteration` (-1: before the first forward).

    `expected`: token ids the generation should produce (from the prompt's end), to mark the
    committed tokens that differ from it.
    """
    iteration = timeline.clamp(iteration)
    canvas = timeline.canvas_at(iteration)
    rec = timeline.records[iteration] if iteration >= 0 else None
    block = range(*rec.block_range) if rec else range(0)
    confidence = rec.confidence[timeline.row] if rec else []
    recomputed = [range(a, b) for a, b in rec.recomputed] if rec and rec.forward not in EXACT_FORWARDS else []
    extras = timeline.extras_at(iteration) if rec else {}
    anchors = extras.get("anchors")
    start = timeline.view_start()
    first_shown = max(0, min(start, timeline.prompt_length - PROMPT_CELLS_SHOWN))
    cells = []
    if first_shown > 0:
        cells.append({"t": f"…{first_shown}", "k": "prompt", "tip": f"{first_shown} earlier prompt tokens", "c": 0, "p": -1})
    for p in range(first_shown, timeline.canvas_length):
        token = canvas[p]
        commit = timeline.commits.get(p)
        in_block = p in block
        if p < timeline.prompt_length and commit is None:
            kind, tip = "prompt", [f"pos {p} · prompt"]
        elif token == timeline.mask_id:
            kind, tip = "masked", [f"pos {p} · masked"]
        elif commit is None or commit.iteration > iteration:
            kind, tip = "fill", [f"pos {p} · filled with end-of-text by early stop"]
        else:
            kind = ("forced" if commit.forced else "new") if commit.iteration == iteration else "old"
            how = "forced top-1 (below threshold)" if commit.forced else "above threshold"
            tip = [f"pos {p} · committed at iteration {commit.iteration} ({how}) · confidence then {commit.confidence:.3f}"]
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
        if expected is not None and kind in ("old", "new", "forced"):
            offset = p - timeline.prompt_length
            want = expected[offset] if 0 <= offset < len(expected) else None
            if want is not None and want != token:
                classes.append("wrong")
                tip.append(f"expected {timeline.text_of(want)!r} (id {want})")
        cells.append({"t": inert(_cell_text(timeline, token)), "k": " ".join(classes), "tip": inert("\n".join(tip)), "c": round(float(c), 3), "p": p})
    return {"cells": _collapse_fill(cells), "caption": inert(caption(timeline, iteration))}


def _collapse_fill(cells: list[dict]) -> list[dict]:
    """Runs of early-stop fill (often most of a long canvas) become one cell; drops the `p` keys."""
    out: list[dict] = []
    run: list[dict] = []

    def flush() -> None:
        if len(run) >= FILL_RUN_COLLAPSE:
            a, b = run[0]["p"], run[-1]["p"]
            out.append({"t": f"∎×{len(run)}", "k": "fill", "tip": f"pos {a}–{b}: filled with end-of-text by early stop", "c": 0.0})
        else:
            out.extend({k: v for k, v in c.items() if k != "p"} for c in run)
        run.clear()

    for cell in cells:
        if cell["k"].split()[0] == "fill":  # a recomputed-window mark on fill is not worth a cell each
            run.append(cell)
            continue
        flush()
        out.append({k: v for k, v in cell.items() if k != "p"})
    flush()
    return out


def caption(timeline: Timeline, iteration: int) -> str:
    if iteration < 0:
        return f"before the first forward · {timeline.canvas_length - timeline.prompt_length} positions to generate"
    rec = timeline.records[iteration]
    s, e = rec.block_range
    where = ", ".join(f"[{a}, {b})" for a, b in rec.recomputed)
    threshold = "" if rec.threshold is None else f" · threshold {rec.threshold:.2f}"
    return (
        f"iteration {iteration + 1}/{timeline.iterations} · block {rec.block} [{s}, {e}) · "
        f"{rec.forward} forward over {where}{threshold} · committed {len(rec.committed[timeline.row])}"
    )


def _cell_text(timeline: Timeline, token: int) -> str:
    if token == timeline.mask_id:
        return "▒"
    if timeline.is_end(token):
        return "∎"
    piece = timeline.piece(token)
    return piece if is_special(piece) else glyph(timeline.text_of(token))


def _short(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _legend_html() -> str:
    states = "".join(f'<span class="cell {k}">{label}</span>' for k, (_, label) in CELL_COLOURS.items())
    marks = "".join(f'<span class="cell old {k}">{label}</span>' for k, (_, label) in CELL_MARKS.items())
    bar = '<span class="cell masked blk" style="--c:0.6">yellow bar: confidence now</span>'
    return f'<div class="legend">{states}</div><div class="legend">{marks}{bar}</div>'


def _css() -> str:
    rules = [
        ".legend{display:flex;flex-wrap:wrap;gap:3px;margin-bottom:4px}",
        ".legend .cell{font-size:11px;padding:0 4px 2px;font-family:inherit}",
        ".caption{font-size:12px;color:#4b5563;margin:4px 0}",
        ".cells{display:flex;flex-wrap:wrap;gap:2px;align-items:stretch}",
        ".cell{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:14px;line-height:1.3;"
        "padding:3px 4px 4px;border-radius:3px;position:relative;white-space:pre;color:#111827;min-width:0.8em;text-align:center}",
        ".cell.blk::after{content:'';position:absolute;left:0;bottom:0;height:3px;"
        "width:calc(var(--c,0)*100%);background:#facc15}",
        ".cell.masked{color:#9ca3af}",
    ]
    rules += [f".cell.{k}{{background:{colour}}}" for k, (colour, _) in CELL_COLOURS.items()]
    rules += [f".cell.{k}{{{css}}}" for k, (css, _) in CELL_MARKS.items()]
    return "\n".join(rules)


GRID_CSS = _css()
GRID_TEMPLATE = (
    _legend_html()
    + '<div class="caption">{{{value.caption}}}</div>'
    + '<div class="cells">{{#each value.cells}}<span class="cell {{k}}" title="{{{tip}}}" style="--c:{{c}}">{{{t}}}</span>{{/each}}</div>'
)
EMPTY_GRID = {"cells": [], "caption": "no run yet: press Run, or load a trace"}
