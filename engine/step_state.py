"""A diffusion kind's own per-step state in the trace (`IterationRecord.state`, docs/trace.md §3.2):
its shape check, the canvas writes a replay applies, the token ids it names, and how the analyses
read a step (engine/analysis.py: what a position holds, which are open, whether a run converged).
The trace and the analyses know only this contract; each kind's file registers its rules
(`register_step_state`), so a new kind's record needs no edit of engine/trace.py, its schema or
its readers.

The base rules are masked diffusion's, which keeps no state of its own: a record writes its
commits (`top1` at `committed`) and then its revisions; a position is written once it holds a
token other than [MASK].
"""

from __future__ import annotations

from typing import Any, Callable

# (position, token) pairs a record writes into one row's canvas, in the order they apply
Writes = list[tuple[int, int]]


class StepState:
    """The rules of one kind's `state` (None for a kind that keeps none)."""

    def check(self, state: dict[str, Any], rows: int, s: int, e: int, need: Callable[[bool, str], None]) -> None:
        """Raise through `need(ok, message)` when `state` cannot be replayed: the lists a replay
        reads, one per row, of the block's width `e - s`."""
        need(False, "this kind records no step state")

    def writes(self, rec: Any, row: int) -> Writes:
        """What record `rec` wrote into row `row`'s canvas: its commits, then its revisions (an edit
        writes `new`, a remask [MASK])."""
        s = rec.block_range[0]
        writes = [(p, rec.top1[row][p - s]) for p in rec.committed[row]]
        return writes + [(r["position"], r["new"]) for r in (rec.revisions[row] if rec.revisions else [])]

    def ids(self, state: dict[str, Any]) -> set[int]:
        """Every token id `state` names (the trace's `tokens` carries their strings)."""
        return set()

    # ---- how the analyses read a record (engine/analysis.py, docs/analysis.md §3) ----

    def current(self, rec: Any, row: int, canvas: list[int], mask: int) -> list[int | None]:
        """Per canvas position, the token the run held or predicted there after `rec` (`canvas`: the
        row's canvas after it; None: nothing recorded): written tokens, `top1` at the block's open
        positions."""
        s, e = rec.block_range
        return [canvas[p] if canvas[p] != mask else rec.top1[row][p - s] if s <= p < e else None for p in range(len(canvas))]

    def written(self, rec: Any, canvas: list[int], p: int, mask: int) -> bool:
        """Whether position `p` holds a written token (not a belief) after `rec`."""
        return canvas[p] != mask

    def open_positions(self, rec: Any, before: list[int], mask: int) -> list[int]:
        """The positions whose confidences `rec` weighed (`before`: the canvas before it): its
        block's positions still [MASK]."""
        s, e = rec.block_range
        return [p for p in range(s, e) if before[p] == mask]

    def converged(self, records: list[Any], last: list[Any], row: int, open_left: bool) -> bool | None:
        """Whether row `row` converged (`last`: each block's last record; `open_left`: a [MASK] is
        left in the final answer): nothing masked left and, for a decoder that revises, no block's
        last step changed anything. None: the trace cannot say."""
        if open_left:
            return False
        if not any(r.revisions is not None for r in records):
            return True
        return all(not rec.committed[row] and not (rec.revisions and rec.revisions[row]) for rec in last)


def id_lists(state: dict[str, Any], *names: str) -> set[int]:
    """The ids in `state`'s per-row lists `names` (None entries and absent lists skipped)."""
    return {i for name in names for row in (state.get(name) or []) for i in row or [] if i is not None}


def per_position(state: dict[str, Any], name: str, rows: int, width: int, ok: Callable[[Any], bool], need: Callable[[bool, str], None], nullable: bool = False) -> None:
    """`state[name]`: one list per row of `width` values that pass `ok` (each may be None when
    `nullable`)."""
    lists = state.get(name)
    need(isinstance(lists, list) and len(lists) == rows, f"state.{name} needs one list per row")
    for row in lists:
        need(isinstance(row, list) and len(row) == width and all((v is None and nullable) or ok(v) for v in row), f"state.{name} needs one value per block position per row")


_RULES: dict[str, StepState] = {}
_NONE = StepState()


def register_step_state(kind: str, rules: StepState) -> None:
    """Kind `kind`'s records carry `state` by these rules."""
    _RULES[kind] = rules


def has_step_state(kind: str) -> bool:
    """Whether `kind` registered rules of its own (its records carry `state`)."""
    return kind in _RULES


def step_state(kind: str) -> StepState:
    """The rules of `kind`'s state; a kind that registered none keeps none (masked diffusion's)."""
    return _RULES.get(kind, _NONE)
