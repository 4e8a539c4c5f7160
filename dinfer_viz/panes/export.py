"""Exports for slides and papers, from a finished (or loaded) run's Timeline: the run as an animated
GIF (Pillow only) or an MP4 (through `ffmpeg`, where it is on PATH), and the Compare tab's runs as
CSV. The sweep's table has its own CSV (`SweepState.csv`).

A frame is the token grid after one iteration, drawn as the page's grid draws it (`CELL_COLOURS`:
committed this iteration above the threshold or forced, committed earlier, masked, prompt, and a
revising decoder's edits, the old token struck through beside the new, and remasks), with a
caption (the iteration, numbered as the page numbers it: 0 before the first forward, then 1..N;
the decoder and cache mode; what was left out) and a legend. Sizes are bounded whatever the run:
at most MAX_FRAMES frames (a longer run keeps evenly spaced iterations, the first and the last)
and MAX_CELLS positions. Token strings come from a tokenizer or a trace file: they are drawn as
text by Pillow and written as CSV fields, never read as markup.

Nothing here holds a lock or an engine: every function takes a Timeline and returns bytes, or
writes to the path it is given.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, ImageColor, ImageDraw, ImageFont

from engine import EngineError

from ..drawing.cells import CELL_COLOURS, cell_text, first_shown
from .grid import cell_state
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for

MAX_FRAMES = 120  # a 448-iteration run still fits a slide deck (and a GIF stays a few hundred KB)
MAX_CELLS = 256  # positions drawn; a longer canvas is cut after them, and the caption says so
WIDTH = 820  # pixels: a 16:9 slide's content column at 1280x720
CELL_HEIGHT, CELL_MIN_WIDTH, CELL_MAX_WIDTH, GAP, PAD = 24, 16, 120, 3, 12
FRAME_MS, LAST_FRAME_MS = 500, 2500  # the final canvas stays up long enough to read
TEXT, MUTED, BACKGROUND = "#111827", "#4b5563", "white"
STRUCK, REMASK_INK = "#6b21a8", "#fecdd3"  # an edit's old token (struck through); a remasked cell's glyph
REMASK_GLYPH = "↺"
MAX_FFMPEG_SECONDS = 120


class ExportUnavailable(EngineError):
    """An export this server cannot make (MP4 without ffmpeg); the message says why in one line."""


@dataclass(frozen=True)
class _Cell:
    position: int
    x: int
    y: int
    width: int


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans Mono where the system has it (Debian, most Linux images: box-drawing and
    arrows included), else Pillow's bundled font."""
    try:
        return ImageFont.truetype("DejaVuSansMono.ttf", size)
    except OSError:
        return ImageFont.load_default(size=size)


def frame_iterations(timeline: Timeline, max_frames: int = MAX_FRAMES) -> list[int]:
    """Record indices drawn, -1 (before the first forward) first: all of them, or evenly spaced
    ones with the first and the last when there are more than `max_frames` (at least 2)."""
    if max_frames < 2:
        raise EngineError(f"an animation needs at least 2 frames, got {max_frames}")
    every = list(range(-1, timeline.iterations))
    if len(every) <= max_frames:
        return every
    step = (len(every) - 1) / (max_frames - 1)
    return sorted({every[round(k * step)] for k in range(max_frames)})


@dataclass(frozen=True)
class FramePlan:
    """What an animation of a run draws: the iterations (record indices, -1 first), the canvas
    positions, and the header lines under each frame's iteration line (the settings, then what
    was left out to bound the size, if anything)."""

    iterations: list[int]
    positions: list[int]
    header: list[str]


def frame_plan(timeline: Timeline, max_frames: int = MAX_FRAMES) -> FramePlan:
    """The plan of `timeline`'s animation: positions are the grid's, from its first cell to the
    end of the last block decoded, cut at MAX_CELLS."""
    iterations = frame_iterations(timeline, max_frames)
    every = list(range(first_shown(timeline), timeline.view_end()))
    positions = every[:MAX_CELLS]
    cuts = []
    if len(iterations) < timeline.iterations + 1:
        cuts.append(f"{len(iterations)} of {timeline.iterations + 1} frames shown (evenly spaced iterations)")
    if len(positions) < len(every):
        cuts.append(f"first {len(positions)} of {len(every)} positions shown")
    return FramePlan(iterations, positions, [_settings_line(timeline)] + ([" · ".join(cuts)] if cuts else []))


def _layout(timeline: Timeline, positions: list[int], font, top: int) -> tuple[list[_Cell], int]:
    """Cells placed left to right, wrapping like the page's grid; each as wide as the token it
    ends with (the final canvas), or as an edit of it drawn old and new side by side when wider,
    so no cell moves between frames. Returns (cells, bottom)."""
    final = timeline.canvas_at(timeline.iterations - 1)
    x, y, cells = PAD, top, []
    for p in positions:
        texts = [cell_text(timeline, final[p])] + [_edit_texts(timeline, r)[0] + " " + _edit_texts(timeline, r)[1] for r in timeline.revisions.get(p, [])]
        width = int(min(CELL_MAX_WIDTH, max(CELL_MIN_WIDTH, max(font.getlength(t) for t in texts) + 8)))
        if x + width > WIDTH - PAD and x > PAD:
            x, y = PAD, y + CELL_HEIGHT + GAP
        cells.append(_Cell(p, x, y, width))
        x += width + GAP
    return cells, y + CELL_HEIGHT


def _fit(text: str, font, width: int) -> str:
    """`text` cut with an ellipsis to `width` pixels."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def _settings_line(timeline: Timeline) -> str:
    cfg = timeline.trace.config if isinstance(timeline.trace.config, dict) else {}
    decoder = str(cfg.get("decoder", "?"))
    threshold = next((r.threshold for r in timeline.records if r.threshold is not None), None)
    tau = f" (τ {threshold:.2f})" if threshold is not None else ""
    extras = "".join(f" · {name}" for name in ("smoothing", "unroll") if cfg.get(name) is True)
    return f"{timeline.trace.model or 'model'} · decoder {decoder}{tau} · cache {cfg.get('cache', '?')} · block {timeline.trace.block_length}{extras}"


def frame_title(timeline: Timeline, index: int) -> str:
    """A frame's first line: the iteration as the page numbers it (0: before the first forward)
    and what record `index` did, in the words of the run's kind view."""
    if index < 0:
        return f"iteration 0/{timeline.iterations} · before the first forward"
    return view_for(timeline).frame_title(timeline, index)


LEGEND_ROW = 20


def legend_states(timeline: Timeline) -> tuple[str, ...]:
    """The states a frame's legend names: the run's kind's (a revising decoder's runs add edited
    and remasked)."""
    return view_for(timeline).frame_legend_states(timeline)


def _edit_texts(timeline: Timeline, revision) -> tuple[str, str]:
    return cell_text(timeline, revision.old), cell_text(timeline, revision.new)


def _draw_cell(draw: ImageDraw.ImageDraw, timeline: Timeline, cell: _Cell, state: str, token: int, index: int, font) -> None:
    """One cell as the grid draws it: its colour, its token (none for a mask), an edit's old token
    struck through beside the new one, a remasked cell's glyph."""
    box = (cell.x, cell.y, cell.x + cell.width - 1, cell.y + CELL_HEIGHT - 1)
    draw.rounded_rectangle(box, radius=3, fill=CELL_COLOURS[state][0])
    middle = cell.y + CELL_HEIGHT / 2
    if state == "masked":  # a mask is its colour; its glyph would only add noise
        return
    if state == "remasked":
        draw.text((cell.x + cell.width / 2, middle), REMASK_GLYPH, font=font, fill=REMASK_INK, anchor="mm")
        return
    if state == "edited":
        old, new = _edit_texts(timeline, timeline.revision_at(cell.position, index))
        old = _fit(old, font, (cell.width - 8) // 2)
        x = cell.x + 3
        draw.text((x, middle), old, font=font, fill=STRUCK, anchor="lm")
        end = x + font.getlength(old)
        draw.line((x, middle, end, middle), fill=STRUCK, width=2)
        draw.text((end + 4, middle), _fit(new, font, int(cell.x + cell.width - end - 6)), font=font, fill=TEXT, anchor="lm")
        return
    text = _fit(cell_text(timeline, token), font, cell.width - 4)
    draw.text((cell.x + cell.width / 2, middle), text, font=font, fill=TEXT, anchor="mm")


def render_frames(timeline: Timeline, max_frames: int = MAX_FRAMES) -> list[Image.Image]:
    """The run as RGB images, one per iteration of its `frame_plan`, all the same size."""
    if timeline.iterations == 0:
        raise EngineError("this run has no iterations to animate")
    big, small = _font(15), _font(12)
    plan = frame_plan(timeline, max_frames)
    header = plan.header
    top = PAD + 22 + 18 * len(header) + 6
    cells, bottom = _layout(timeline, plan.positions, big, top)
    legend = _legend_rows(small, legend_states(timeline))
    height = bottom + 14 + LEGEND_ROW * len(legend) + PAD
    frames = []
    for index in plan.iterations:
        image = Image.new("RGB", (WIDTH, height), BACKGROUND)
        draw = ImageDraw.Draw(image)
        draw.text((PAD, PAD), _fit(frame_title(timeline, index), big, WIDTH - 2 * PAD), font=big, fill=TEXT)
        for k, line in enumerate(header):
            draw.text((PAD, PAD + 22 + 18 * k), _fit(line, small, WIDTH - 2 * PAD), font=small, fill=MUTED)
        canvas = timeline.canvas_at(index)
        for cell in cells:
            _draw_cell(draw, timeline, cell, cell_state(timeline, canvas, cell.position, index), canvas[cell.position], index, big)
        _legend(draw, small, bottom + 14, legend)
        frames.append(image)
    return frames


def _legend_rows(font, states: Sequence[str]) -> list[list[str]]:
    """The legend's entries wrapped into rows that fit the frame's width."""
    rows: list[list[str]] = [[]]
    x = PAD
    for state in states:
        width = 18 + int(font.getlength(CELL_COLOURS[state][1])) + 14
        if x + width > WIDTH - PAD and rows[-1]:
            rows.append([])
            x = PAD
        rows[-1].append(state)
        x += width
    return rows


def _legend(draw: ImageDraw.ImageDraw, font, y: int, rows: list[list[str]]) -> None:
    for k, row in enumerate(rows):
        x, top = PAD, y + LEGEND_ROW * k
        for state in row:
            label = CELL_COLOURS[state][1]
            draw.rounded_rectangle((x, top + 2, x + 14, top + 16), radius=2, fill=CELL_COLOURS[state][0])
            draw.text((x + 18, top + 1), label, font=font, fill=MUTED)
            x += 18 + int(font.getlength(label)) + 14


def _palette() -> np.ndarray:
    """One fixed palette for every frame, `[colours, 3]`: the cell colours, the text colours and
    the blends antialiased text makes between them. A palette quantized from one frame would map
    a colour that frame lacks (forced orange, when the last iteration forced nothing) to a grey."""
    grounds = [ImageColor.getrgb(c) for c in (BACKGROUND, *(colour for colour, _ in CELL_COLOURS.values()))]
    inks = [ImageColor.getrgb(c) for c in (TEXT, MUTED, STRUCK, REMASK_INK)]
    steps = 6
    blends = {tuple(round(g + (i - g) * k / steps) for g, i in zip(ground, ink)) for ground in grounds for ink in inks for k in range(steps + 1)}
    return np.array(sorted(blends), dtype=np.int32)


def _indexed(frame: Image.Image, palette: np.ndarray) -> Image.Image:
    """`frame` as a "P" image over `palette`, each pixel its nearest palette colour exactly (Pillow's
    own mapping looks colours up at 5-6 bits a channel, which moved the prompt grey to a blend)."""
    rgb = np.asarray(frame, dtype=np.int32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]  # one int a pixel: a fast 1-D unique
    codes, inverse = np.unique(packed, return_inverse=True)  # a few hundred colours a frame
    colours = np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], axis=1)
    nearest = ((colours[:, None, :] - palette[None, :, :]) ** 2).sum(-1).argmin(1).astype(np.uint8)
    out = Image.frombytes("P", frame.size, nearest[inverse.reshape(-1)].tobytes())
    out.putpalette(palette.astype(np.uint8).flatten().tolist())
    return out


def _durations(count: int, frame_ms: int) -> list[int]:
    return [frame_ms] * (count - 1) + [LAST_FRAME_MS]


def run_gif(timeline: Timeline, path: str | Path | None = None, frame_ms: int = FRAME_MS, max_frames: int = MAX_FRAMES) -> bytes:
    """The run as an animated GIF (looping); written to `path` too when given."""
    palette = _palette()
    indexed = [_indexed(frame, palette) for frame in render_frames(timeline, max_frames)]
    out = io.BytesIO()
    indexed[0].save(out, format="GIF", save_all=True, append_images=indexed[1:], duration=_durations(len(indexed), frame_ms), loop=0, optimize=False)
    data = out.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data


MP4_MISSING = "MP4 export needs ffmpeg on the server's PATH, and it has none: download the GIF instead"


def mp4_unavailable() -> str | None:
    """Why an MP4 cannot be made here (a one-line message), or None when ffmpeg is on PATH."""
    return None if shutil.which("ffmpeg") else MP4_MISSING


def run_mp4(timeline: Timeline, path: str | Path | None = None, frame_ms: int = FRAME_MS, max_frames: int = MAX_FRAMES) -> bytes:
    """The run as an H.264 MP4 (ffmpeg); written to `path` too when given. ExportUnavailable with
    a one-line message when ffmpeg is not on PATH, or when it fails."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ExportUnavailable(MP4_MISSING)
    frames = render_frames(timeline, max_frames)
    with tempfile.TemporaryDirectory(prefix="dinfer-viz-mp4-") as folder:
        # Frames at the video's rate: the last one repeated to hold the final canvas as the GIF does
        repeats = [1] * (len(frames) - 1) + [max(1, round(LAST_FRAME_MS / frame_ms))]
        k = 0
        for frame, n in zip(frames, repeats):
            for _ in range(n):
                frame.save(Path(folder) / f"{k:05d}.png")
                k += 1
        target = Path(folder) / "run.mp4"
        command = [
            ffmpeg, "-hide_banner", "-loglevel", "error", "-y", "-framerate", f"{1000 / frame_ms:g}", "-i", str(Path(folder) / "%05d.png"),
            # H.264 in yuv420p wants even sides; players on slides expect yuv420p
            "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2:color=white", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(target),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=MAX_FFMPEG_SECONDS)
        except subprocess.TimeoutExpired:
            raise ExportUnavailable(f"ffmpeg took more than {MAX_FFMPEG_SECONDS} s to encode the MP4; download the GIF instead") from None
        if done.returncode != 0 or not target.is_file():
            reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
            raise ExportUnavailable(f"ffmpeg could not encode the MP4 ({reason}); download the GIF instead")
        data = target.read_bytes()
    if path is not None:
        Path(path).write_bytes(data)
    return data


COMPARE_COLUMNS = (
    "run", "settings", "model", "decoder", "threshold", "cache", "block_length", "iterations", "nfe", "tokens", "edits", "remasks", "tpf", "tps",
    "forwards_per_second", "engine_seconds", "trace_seconds", "wall_seconds", "passes", "text",
)
# a decoder's own option, as a column of its own (`decoder_options.edit_threshold`)
OPTION_COLUMN = "decoder_options."


def differing_settings(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The settings (trace `config` keys; a decoder's options one by one, as `decoder_options.NAME`)
    whose values are not the same in every config, a setting one config lacks included; those
    COMPARE_COLUMNS already has left out."""
    flat = [_flat(c) for c in configs]
    names = dict.fromkeys(k for f in flat for k in f)
    return [k for k in names if k not in COMPARE_COLUMNS and len({json.dumps(f.get(k), sort_keys=True) for f in flat}) > 1]


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    options = config.get("decoder_options") or {}
    return {**{k: v for k, v in config.items() if k != "decoder_options"}, **{OPTION_COLUMN + k: v for k, v in options.items()}}


def compare_csv(
    timelines: Sequence[Timeline], labels: Sequence[str], wall_seconds: Sequence[float | None] | None = None, stats: Sequence[dict | None] | None = None
) -> str:
    """The Compare tab's runs as CSV, one row per run, from what the tab draws (the timelines and
    labels `compare_figure` takes; `wall_seconds` as its readouts show, when kept): the settings,
    the engine's stats (the readout's figures, unrounded: `stats`, the median of several passes
    (readouts.median_stats), when given, else the trace's), the iterations and the answer text.
    Threshold is empty for a decoder without one (fixed, factor). After the fixed columns, one per
    setting whose value differs between the runs (`differing_settings`), a decoder's options too."""
    walls = list(wall_seconds) if wall_seconds is not None else [None] * len(timelines)
    figures = list(stats) if stats is not None else [None] * len(timelines)
    differ = differing_settings([tl.trace.config or {} for tl in timelines])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COMPARE_COLUMNS, *differ])
    for k, (tl, label, wall, measured) in enumerate(zip(timelines, labels, walls, figures)):
        cfg, stats = tl.trace.config or {}, measured or tl.trace.stats or {}
        threshold = next((r.threshold for r in tl.records if r.threshold is not None), None)
        flat = _flat(cfg)
        writer.writerow(
            [
                chr(ord("A") + k) if k < 26 else str(k + 1),
                _cell(label),
                _cell(tl.trace.model or ""),
                _cell(str(cfg.get("decoder", ""))),
                "" if threshold is None else f"{threshold:g}",
                _cell(str(cfg.get("cache", ""))),
                tl.trace.block_length,
                tl.iterations,
                stats.get("nfe", ""),
                stats.get("tokens", ""),
                stats.get("edits", 0),  # a revising decoder's (the sweep's CSV has them too); 0 for the others
                stats.get("remasks", 0),
                _number(stats.get("tpf")),
                _number(stats.get("tps")),
                _number(stats.get("forwards_per_second")),
                _number(stats.get("seconds")),
                _number(stats.get("trace_seconds", tl.trace.trace_seconds)),
                _number(wall),
                stats.get("passes", 1),
                _cell(tl.text_at(tl.iterations - 1)),
                *(_cell(_setting_text(flat.get(name))) for name in differ),
            ]
        )
    return out.getvalue()


def _setting_text(value: Any) -> str:
    """A setting's value in a cell: text as it is, a number or switch as JSON writes it, empty for
    a setting the run lacks."""
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def _number(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value:.6g}"
    return ""


def _cell(text: str) -> str:
    """A text field as data: a spreadsheet runs a cell starting with = + - @ (or a tab or CR) as a
    formula, so such a cell gets a leading apostrophe (OWASP's advice for CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
