"""The token grid: one cell per canvas position at a chosen iteration, in two forms.

- A finished or loaded run, at any iteration (`grid_value`): a list of small per-cell dicts (`t`
  text, `k` CSS classes, `tip` hover text, `c` confidence) and a caption, which the browser renders
  with `GRID_TEMPLATE`.
- A live run (`LiveGrid`): the commits since the frame the page last painted and the marks of the
  iteration shown, which `GRID_JS`, a small renderer in the page, applies to the cells it holds
  (built once from the canvas): a frame costs the browser the cells that changed, not a whole grid
  rebuilt from HTML.

Every string in either form comes from a tokenizer or a trace file, i.e. from someone else. Gradio
renders the template with Handlebars and then evaluates the result as a JavaScript template
literal, so Handlebars' own escaping (which leaves `${`, backticks and backslashes alone) is not
enough: a token `${alert(1)}` would run. `inert` escapes those too, and the template inserts the
escaped strings raw (`{{{...}}}`) so they are not escaped twice. A live frame's strings never reach
the template (it renders only an empty `.live` box then): the renderer sets them as `textContent`
and `title`, which the browser never parses. Colours come from `CELL_COLOURS`, one explicit map
shared by the CSS, the legend and the figures (never hex strings used as labels).
"""

from __future__ import annotations

from ..drawing.cells import CELL_COLOURS, CELL_MARKS, CONSTRAINT_COLOUR, PINNED, PINNED_WORDS, cell_text, expected_at, first_shown, inert, revision_line, summary_tip
from .readouts import plural
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for

__all__ = ["CELL_COLOURS", "EMPTY_GRID", "GRID_CSS", "GRID_JS", "GRID_TEMPLATE", "LiveGrid", "RASTER_PICK_JS", "caption", "cell_state", "expected_at", "grid_value", "inert", "legend_html", "revision_line"]


def grid_value(timeline: Timeline, iteration: int, expected: list[int] | None = None) -> dict:
    """Cells and a caption for `timeline` after record `iteration` (-1: before the first forward),
    as the run's kind view draws them (dinfer_viz/views/).

    `expected`: token ids the generation should produce (from the prompt's end), to mark the
    committed tokens that differ from it.
    """
    iteration = timeline.clamp(iteration)
    out = view_for(timeline).grid_value(timeline, iteration, expected)
    return {"cells": out["cells"], "caption": inert(caption(timeline, iteration)), "legend": legend_html(timeline)}


def caption(timeline: Timeline, iteration: int, of: int | None = None) -> str:
    """What record `iteration` did, numbered as the page numbers it (`iteration_number`: 0 is the
    canvas before the first forward); `of`: the iterations counted (default: all the timeline's)."""
    total = timeline.iterations if of is None else of
    if iteration < 0:
        return f"iteration 0/{total} · before the first forward · {plural(timeline.canvas_length - timeline.prompt_length, 'position')} to generate"
    return view_for(timeline).caption(timeline, iteration, total)


def cell_state(timeline: Timeline, canvas: list[int], p: int, iteration: int) -> str:
    """Position `p`'s state after record `iteration` (-1: before the first forward), as the grid
    colours it (a cells.CELL_COLOURS key: the run's kind view decides)."""
    return view_for(timeline).cell_state(timeline, canvas, p, iteration)


def legend_html(timeline: Timeline | None) -> str:
    """The legend above a grid: the states `timeline`'s kind of run can have (a masked run's
    revision states only for a decoder that revises) and its marks (None: before any run)."""
    return view_for(timeline).legend_html(timeline)


class LiveGrid:
    """A live run's grid as `GRID_JS` takes it: while the run streams, the grid component's value
    is `{"live": {...}}` with

    - `run`, `frame`: the run's id and the frame's number, which the renderer reports back once it
      painted the frame (runner.acknowledge: the server's pacing);
    - `canvas` (for a page that holds nothing of the run yet, and every frame of a kind whose step
      may change every position): the cells, `[position, text, kind, tip]` (position -1: the
      summary cell of a long prompt's head; kind `pinned` for text the request pinned);
    - `commits`: the commits since the records the page holds, `[position, text, iteration,
      forced, confidence, wrong, cut]` (all of them for a page that holds nothing; `cut`: the
      answer's constraint had removed the model's top-1 there, dinfer_viz/drawing/constraint.py);
    - `revisions`: likewise a revising decoder's edits and remasks, `[position, text, iteration,
      kind, old text, hover line, wrong]`, applied after the same iteration's commits;
    - `at`, `caption`, `stats`: the iteration shown (-1: none yet), its caption, the speed line;
    - `block`, `top1`, `conf`: the current block and its tokens and bar values now;
    - `win`: what a partial forward recomputed (nothing for forwards over the whole canvas).

    The run's kind view fills the kind's fields (`KindView.live_fields`). A frame is complete
    relative to a state the page reported it holds, so a renderer that skipped frames (the browser
    applied two at once) still applies everything. Strings are plain text (never HTML): the
    renderer sets them as text."""

    def __init__(self, timeline: Timeline, run: str, expected: list[int] | None = None) -> None:
        self.timeline, self.run, self.expected = timeline, run, expected
        self.view = view_for(timeline)
        first = first_shown(timeline)
        self.canvas: list[list] = [[-1, f"…{first}", "prompt", summary_tip(first)]] if first > 0 else []
        for p in range(first, timeline.canvas_length):
            token = timeline.initial[p]
            if token == timeline.mask_id:
                self.canvas.append([p, cell_text(timeline, token), "masked", f"pos {p} · masked"])
            elif p in timeline.pinned:
                self.canvas.append([p, cell_text(timeline, token), PINNED, f"pos {p} · {PINNED_WORDS}\ntoken {timeline.text_of(token)!r} (id {token})"])
            else:
                self.canvas.append([p, cell_text(timeline, token), "prompt", f"pos {p} · prompt\ntoken {timeline.text_of(token)!r} (id {token})"])

    def value(self, shown: int, frame: int, since: int, stats: str) -> dict:
        """The frame showing the timeline's first `shown` records to a page that holds the first
        `since` (-1: nothing, not even the canvas)."""
        tl = self.timeline
        at = shown - 1
        live: dict = {"run": self.run, "frame": frame, "commits": [], "revisions": [], "at": at, "caption": caption(tl, at, of=shown), "stats": stats}
        live.update(block=[0, 0], top1=[], conf=[], win=[])
        live.update(self.view.live_fields(tl, shown, since, self.expected, self.canvas))
        return {"live": live, "legend": legend_html(tl)}


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
        f".cell.cut::before{{content:'';position:absolute;top:-4px;right:-4px;width:9px;height:9px;border-radius:50%;"
        f"background:{CONSTRAINT_COLOUR};border:1.5px solid #ffffff;z-index:1}}",
        ".cell.masked{color:#9ca3af}",
        ".cell.remasked{color:#fecdd3}",
        ".cell.noise{color:#78716c;font-style:italic}",
        ".cell s.was{color:#6b21a8;opacity:0.75;margin-right:3px}",
        ".stats{font-size:12px;color:#6b7280;margin:0 0 4px;font-variant-numeric:tabular-nums}",
    ]
    rules += [f".cell.{k}{{background:{colour}}}" for k, (colour, _) in CELL_COLOURS.items()]
    rules += [f".cell.{k}{{{css}}}" for k, (css, _) in CELL_MARKS.items()]
    return "\n".join(rules)


GRID_CSS = _css()
GRID_TEMPLATE = (
    "{{{value.legend}}}"  # the run's kind's legend (legend_html: our labels, no visitor's string)
    + "{{#if value.live}}<div class=\"live\"></div>{{else}}"  # a live frame: GRID_JS fills the box
    + '<div class="caption">{{{value.caption}}}</div>'
    + '<div class="cells">{{#each value.cells}}<span class="cell {{k}}" data-p="{{p}}" title="{{{tip}}}" style="--c:{{c}}">{{{t}}}</span>{{/each}}</div>'
    + "{{/if}}"
)
EMPTY_GRID = {"cells": [], "caption": "no run yet: press Run, or load a trace", "legend": legend_html(None)}
# The Run tab's raster (#raster) pins a position too: a click on a point sends its position and
# iteration (the page's number, the raster's y) through the grid's select event. Plotly's click
# event lives on the figure's div, which Gradio makes anew when the plot first draws (and after a
# tab's re-render), so the listener is attached to whichever div is there, once per div.
RASTER_PICK_JS = r"""
setInterval(() => {
  const plot = document.querySelector('#raster .js-plotly-plot');
  if (!plot || plot.dataset.pick || typeof plot.on !== 'function') return;
  plot.dataset.pick = '1';
  plot.on('plotly_click', ev => {
    const pt = ev && ev.points && ev.points[0];
    if (pt && Number.isFinite(+pt.x) && Number.isFinite(+pt.y)) trigger('select', {index: Math.round(+pt.x), value: Math.round(+pt.y)});
  });
}, 500);
"""
# The live renderer (gr.HTML's js_on_load: `element`, `props`, `watch`, `server`). It keeps the
# cells of the run it shows by position and, per frame, applies its commits, moves the block and
# recomputed-window marks, sets the caption and speed line, and on the next animation frame (the
# browser is about to paint) reports the frame painted through the grid's server function, a
# plain request that costs the page nothing else (a Gradio event would update its loading state).
# A frame it cannot apply (its cells were redrawn by another view, and the frame brings no canvas)
# is reported as -1: the next one brings everything. Text goes in only through textContent and title.
GRID_JS = r"""
let view = null;
const cell = (kind, text, tip) => {
  const s = document.createElement('span');
  s.className = 'cell ' + kind;
  s.textContent = text;
  s.title = tip;
  return s;
};
const start = (root, live) => {
  const parts = ['caption', 'stats', 'cells'].map(name => {
    const d = document.createElement('div');
    d.className = name;
    return d;
  });
  const at = new Map(), tips = new Map();
  for (const [p, text, kind, tip] of live.canvas) {
    const s = cell(kind, text, tip);
    s.dataset.p = p;
    parts[2].append(s);
    if (p >= 0) { at.set(p, s); tips.set(p, tip); }
  }
  root.replaceChildren(...parts);
  return {root, run: live.run, caption: parts[0], stats: parts[1], at, tips, fresh: [], marked: []};
};
const paint = live => {
  const root = element.querySelector('.live');
  if (!root) return;
  if (live.canvas) view = start(root, live);
  else if (!view || view.root !== root || view.run !== live.run) {
    server.painted({run: live.run, frame: -1});
    return;
  }
  // cells marked by the iteration shown before become what they are after it: committed earlier,
  // the edited token alone (its struck-through old one dropped), or a plain mask
  for (const [s, kind, text] of view.fresh) {
    s.classList.remove('new', 'forced', 'edited', 'remasked');
    s.classList.add(kind);
    s.textContent = text;
  }
  view.fresh = [];
  // commits and revisions in the order the engine applied them: by iteration, commits first
  const events = [...live.commits.map(c => [c[2], 0, c]), ...(live.revisions || []).map(r => [r[2], 1, r])];
  events.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  for (const [it, isRevision, e] of events) {
    const p = e[0], text = e[1], now = it === live.at;
    const s = view.at.get(p);
    if (!s) continue;
    if (isRevision) {
      const [, , , kind, oldText, line, wrong] = e;
      const after = kind === 'edit' ? 'old' : 'masked';
      s.className = 'cell ' + (now ? (kind === 'edit' ? 'edited' : 'remasked') : after) + (wrong ? ' wrong' : '');
      if (now && kind === 'edit') {
        const was = document.createElement('s');
        was.className = 'was';
        was.textContent = oldText;
        s.replaceChildren(was, document.createTextNode(text));
      } else s.textContent = text;
      view.tips.set(p, view.tips.get(p) + '\n' + line);
      s.title = view.tips.get(p);
      if (now) view.fresh.push([s, after, text]);
      continue;
    }
    const [, , , forced, conf, wrong, cut] = e;
    s.className = 'cell ' + (now ? (forced ? 'forced' : 'new') : 'old') + (wrong ? ' wrong' : '') + (cut ? ' cut' : '');
    s.textContent = text;
    // `it` is a record index (0-based); the page numbers iterations 1..N (timeline.iteration_number)
    view.tips.set(p, `pos ${p} · committed at iteration ${it + 1} (${forced ? 'forced top-1 (below threshold)' : 'above threshold'}) · confidence then ${conf.toFixed(3)}` + (cut ? "\nthe constraint had removed the model's top-1 here" : ''));
    s.title = view.tips.get(p);
    if (now) view.fresh.push([s, 'old', text]);
  }
  for (const s of view.marked) {
    s.classList.remove('blk', 'win');
    s.style.removeProperty('--c');
    s.title = view.tips.get(+s.dataset.p);
  }
  view.marked = [];
  const mark = (p, name) => {
    const s = view.at.get(p);
    if (!s) return null;
    s.classList.add(name);
    view.marked.push(s);
    return s;
  };
  const [a, b] = live.block;
  for (let p = a; p < b; p++) {
    const s = mark(p, 'blk');
    if (!s) continue;
    s.style.setProperty('--c', live.conf[p - a]);
    s.title = view.tips.get(p) + `\nnow: top-1 ${JSON.stringify(live.top1[p - a])} confidence ${live.conf[p - a]}`;
  }
  for (const [x, y] of live.win) for (let p = x; p < y; p++) mark(p, 'win');
  view.caption.textContent = live.caption;
  view.stats.textContent = live.stats;
  requestAnimationFrame(() => server.painted({run: live.run, frame: live.frame}));
};
watch('value', () => {
  const v = props.value;
  if (v && v.live) paint(v.live);
});
// A click on a cell pins its position in the details panel (the grid's select event, index =
// position; -1 is the summary cell of a long prompt's head, which the server answers in one line).
element.addEventListener('click', e => {
  const s = e.target.closest('.cell[data-p]');
  if (s && element.contains(s) && !s.closest('.legend')) trigger('select', {index: +s.dataset.p, value: null});
});
"""
