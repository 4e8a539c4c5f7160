"""Text a request pins inside its answer (docs/algorithms.md §11): a suffix after the hole the model
fills, or a template of several holes with text between and after them.

A masked diffusion model predicts every masked position from the whole canvas, both sides, so a
hole between fixed text is filled by the same loop that writes an answer: the pinned positions are
committed tokens from the start, which no decoder may change. A row's answer area (`Layout`) is a
sequence of holes (runs of [MASK], `gen_length` positions in all) and pinned pieces (token ids);
blocks are laid over the area up to the last hole's end, and pinned text after it is context only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Union

import torch

from .errors import EngineError

# A hole in a template: `{{hole:N}}`, N positions for the model to fill. Braces twice, so JSON and
# code templates (one brace) read as pinned text.
HOLE = re.compile(r"\{\{hole:(\d+)\}\}")
HOLE_EXAMPLE = "{{hole:3}}"
MAX_HOLES = 64  # a template's holes: each costs a check per step on the page; more is no longer a template

Piece = Union[int, tuple[int, ...]]  # a hole's length, or pinned token ids


def template_pieces(template: str) -> list[int | str]:
    """`template` split into pinned texts and hole lengths, in order (empty texts left out);
    EngineError in one line for a template without a hole or with an empty one."""
    pieces: list[int | str] = []
    at = 0
    for match in HOLE.finditer(template):
        if match.start() > at:
            pieces.append(template[at : match.start()])
        length = int(match.group(1))
        if length < 1:
            raise EngineError(f"template: a hole needs at least one position, got {match.group(0)}")
        pieces.append(length)
        at = match.end()
    if at < len(template):
        pieces.append(template[at:])
    holes = [p for p in pieces if isinstance(p, int)]
    if not holes:
        raise EngineError(f"template: no hole in it; mark each hole with its length, e.g. {HOLE_EXAMPLE}")
    if len(holes) > MAX_HOLES:
        raise EngineError(f"template: {len(holes)} holes; at most {MAX_HOLES}")
    return pieces


def template_holes(template: str) -> list[int]:
    """The hole lengths of `template`, in order."""
    return [p for p in template_pieces(template) if isinstance(p, int)]


@dataclass(frozen=True)
class Layout:
    """One row's answer area: holes (their lengths) and pinned pieces (token ids), in order."""

    pieces: tuple[Piece, ...]

    @classmethod
    def of(cls, suffix: str | None, template: str | None, gen_length: int, encode: Callable[[str], list[int]]) -> "Layout | None":
        """The layout a config's `suffix` or `template` asks for (None: neither), its pinned text
        tokenised by `encode` (no special tokens) piece by piece."""
        if template:
            return cls(tuple(p if isinstance(p, int) else tuple(encode(p)) for p in template_pieces(template)))
        if suffix:
            return cls((gen_length, tuple(encode(suffix))))
        return None

    @property
    def length(self) -> int:
        """Positions of the whole area: holes and pinned text."""
        return sum(p if isinstance(p, int) else len(p) for p in self.pieces)

    @property
    def holes(self) -> list[tuple[int, int]]:
        """Each hole's `[start, end)`, offsets from the area's start."""
        spans, at = [], 0
        for p in self.pieces:
            width = p if isinstance(p, int) else len(p)
            if isinstance(p, int):
                spans.append((at, at + width))
            at += width
        return spans

    @property
    def decoded_end(self) -> int:
        """The offset where the last hole ends: blocks are laid up to here; what follows is context."""
        return self.holes[-1][1]

    def area(self, mask_id: int) -> list[int]:
        """The area's ids: [MASK] in the holes, the pinned ids elsewhere."""
        ids: list[int] = []
        for p in self.pieces:
            ids.extend([mask_id] * p if isinstance(p, int) else p)
        return ids


Layouts = tuple[Union[Layout, None], ...]  # per row; None where a row fills plain masks


def row_layouts(layouts: "Layouts | None", rows: int) -> Layouts:
    """Per row, its layout (None: plain masks); EngineError when `layouts` does not fit the rows."""
    if layouts is None:
        return (None,) * rows
    if len(layouts) != rows:
        raise EngineError(f"{len(layouts)} answer layouts for {rows} rows")
    return tuple(layouts)


def answer_length(layout: Layout | None, gen_length: int) -> int:
    """Positions after a prompt: the layout's area, or `gen_length` masks."""
    return layout.length if layout is not None else gen_length



def decoded_end(prompt_lengths: list[int], layouts: "Layouts | None", canvas_length: int) -> int:
    """Where the run's last block ends: past every row's last hole (the canvas's end for a row
    without a layout); pinned text after it is context only."""
    ends = [canvas_length if layout is None else length + layout.decoded_end for length, layout in zip(prompt_lengths, row_layouts(layouts, len(prompt_lengths)))]
    return max(ends)


def last_hole_starts(prompt_lengths: list[int], layouts: "Layouts | None") -> list[int]:
    """Per row, where its last hole starts (its prompt's end without a layout): early stop may end
    a row only once its blocks reach it, so no later hole is filled with end-of-text."""
    return [length + (layout.holes[-1][0] if layout is not None else 0) for length, layout in zip(prompt_lengths, row_layouts(layouts, len(prompt_lengths)))]


def pinned_mask(canvas: torch.Tensor, prompt_lengths: list[int], layouts: "Layouts | None") -> torch.Tensor:
    """`[B, N]` True at the positions a request pinned (each row's pinned pieces, and the end-of-text
    that pads a row with a layout to the canvas's width: engine/run.py `masked_canvas`); all False without layouts."""
    pinned = torch.zeros(canvas.shape, dtype=torch.bool)
    for row, layout in enumerate(layouts or ()):
        if layout is None:
            continue
        start = prompt_lengths[row]
        pinned[row, start:] = True
        for a, b in layout.holes:
            pinned[row, start + a : start + b] = False
    return pinned.to(canvas.device)
