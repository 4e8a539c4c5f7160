"""The constraint on a run's canvas: the one place a kind's loop asks what the answer may still
be (docs/constraints.md §2-§3).

Each constrained row's region runs from its prompt's end to the canvas's end; positions are
fixed (a token the loop wrote) or open (a [MASK], or a uniform-state canvas being denoised).
Before a decoder sees a step's logits, `restrict` removes at every position the decoder may write
the tokens that would leave no completion of the whole region; after it decides, `admit` keeps
its writes in its own order while the region stays completable (two tokens each allowed alone
may not be allowed together), and `draft` makes a uniform-state argmax draft consistent the same
way. So the canvas is completable after every step, and a finished canvas is a word of the
language. Rows without a constraint are never touched, so their tokens are the unconstrained run's.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np
import torch

from ..errors import EngineError
from .automaton import Region, TokenAutomaton
from .spec import ConstraintSpec


class Compiler(Protocol):
    """What compiles a regex to a region automaton (engine/constraints/vocabulary.py: TokenVocabulary)."""

    def automaton(self, regex: str) -> TokenAutomaton: ...


@dataclass
class Restriction:
    """One step's restriction of a window `[s, e)`: `allowed` `[B, W, V]` (True everywhere in a row
    without a constraint and at positions it did not restrict), `restricted` `[B, W]` the positions
    it restricted, `rows` the constrained rows."""

    allowed: torch.Tensor
    restricted: torch.Tensor
    rows: list[bool]

    def record(self, logits: torch.Tensor, exclude: int | None, dropped: torch.Tensor | None, s: int) -> dict[str, list]:
        """The record's `constraint` (docs/trace.md §3.3) from the model's own logits: per row and
        position the allowed-token count, the probability mass removed, the model's top-1 and its
        probability and whether the constraint removed it; per row the writes `admit` dropped."""
        logits = logits.to(torch.float32, copy=True)
        if exclude is not None:
            logits[..., exclude] = float("-inf")  # the decoder's softmax: [MASK] excluded
        probs = torch.softmax(logits, dim=-1)
        confidence, top1 = probs.max(dim=-1)
        removed = (probs * ~self.allowed[..., : probs.shape[-1]]).sum(dim=-1)
        count = self.allowed.sum(dim=-1)
        top1_removed = ~self.allowed.gather(-1, top1.unsqueeze(-1)).squeeze(-1)
        where = self.restricted.cpu().tolist()

        def per_position(t: torch.Tensor, digits: int | None = None) -> list:
            values = t.cpu().tolist()
            return [
                [(round(v, digits) if digits else v) if here else None for v, here in zip(vs, row_where)] if constrained else None
                for vs, row_where, constrained in zip(values, where, self.rows)
            ]

        dropped_rows = [] if dropped is None else [(row.nonzero().flatten() + s).tolist() for row in dropped.cpu()]
        return {
            "allowed": per_position(count),
            "removed": per_position(removed, 4),
            "model_top1": per_position(top1),
            "model_probability": per_position(confidence, 4),
            "top1_removed": per_position(top1_removed),
            "dropped": [dropped_rows[r] if dropped_rows and c else [] for r, c in enumerate(self.rows)],
        }


_checks = threading.local()  # `.check`: the cancel check of the run on this thread (`checked_by`)


@contextlib.contextmanager
def checked_by(check: Callable[[], None]) -> Iterator[None]:
    """While inside, constraints built on this thread call `check` within their passes over a
    region (it raises to stop the run), so a cancel reaches even one long pass, not only the
    loop's next step (engine/generation.py: run_fitted sets it to the run's cancel)."""
    outer = getattr(_checks, "check", None)
    _checks.check = check
    try:
        yield
    finally:
        _checks.check = outer


class CanvasConstraint:
    """Per row, the automaton its region must be a word of (None: a free row), and where its
    region starts; `length` is the canvas's length. Each row's sets are kept between calls
    (automaton.Region) and recomputed only where the canvas changed since the last call."""

    def __init__(self, automata: list[TokenAutomaton | None], starts: list[int], length: int) -> None:
        self.automata, self.starts, self.length = automata, starts, length
        self._regions: list[Region | None] = [None] * len(automata)
        self._check: Callable[[], None] | None = getattr(_checks, "check", None)

    @classmethod
    def build(cls, specs: list[ConstraintSpec | None], compiler: Compiler | None, starts: list[int], length: int) -> "CanvasConstraint | None":
        """The run's constraint (None when no row has one), refused before any forward when a
        row's region cannot hold any word of its language."""
        if not any(specs):
            return None
        if compiler is None:
            raise EngineError("a constraint needs the model's tokenizer: generate through engine.Engine (or pass run_diffusion a vocabulary)")
        automata = [compiler.automaton(spec.regex()) if spec is not None else None for spec in specs]
        for spec, automaton, start in zip(specs, automata, starts):
            if automaton is None:
                continue
            room, need = length - start, automaton.shortest()
            if need is None:
                raise EngineError(f"the constraint ({spec.describe()}) has no answer this tokenizer can write")
            if need > room:
                raise EngineError(f"the constraint ({spec.describe()}) needs at least {need} tokens and the answer has {room} positions (gen_length); raise gen_length")
        return cls(automata, starts, length)

    def _region(self, row: int, x: np.ndarray, open_: np.ndarray) -> Region:
        """Row `row`'s kept region, brought to its canvas row `x` `[T]` (open where `open_`) and
        checked completable: the invariant every step keeps; a broken one is a bug, said at once."""
        start, region = self.starts[row], self._regions[row]
        tokens, free = x[start:], open_[start:]
        if region is None:
            region = self._regions[row] = Region(self.automata[row], tokens, free, self._check)
        else:
            region.update(tokens, free)
        self._invariant(row, region)
        return region

    @staticmethod
    def _invariant(row: int, region: Region) -> None:
        if not region.completable:
            raise EngineError(f"internal error: row {row}'s canvas can no longer be completed under its constraint")

    def completable(self, x: torch.Tensor, open_: torch.Tensor) -> list[bool]:
        """Per row, whether the canvas `x` (open where `open_`) can still be completed (free rows: True)."""
        xs, os_ = x.cpu().numpy(), open_.cpu().numpy()
        return [a is None or a.sets(xs[r, self.starts[r]:], os_[r, self.starts[r]:]).completable for r, a in enumerate(self.automata)]

    @staticmethod
    def _widened(tokens: np.ndarray, vocab: int) -> np.ndarray:
        """`tokens` `[..., n]` (the automaton's vocabulary) as `[..., vocab]` (the logits' width):
        ids past the automaton's vocabulary are never allowed."""
        out = np.zeros((*tokens.shape[:-1], vocab), dtype=bool)
        n = min(tokens.shape[-1], vocab)
        out[..., :n] = tokens[..., :n]
        return out

    def restrict(self, logits: torch.Tensor, x: torch.Tensor, open_: torch.Tensor, s: int, where: torch.Tensor) -> tuple[torch.Tensor, Restriction]:
        """`logits` `[B, W, V]` of window `[s, s + W)` with the tokens that would leave the canvas
        uncompletable at -inf, at the positions `where` `[B, W]` (the decoder may write there)."""
        rows, width, vocab = logits.shape
        allowed = np.ones((rows, width, vocab), dtype=bool)
        restricted = np.zeros((rows, width), dtype=bool)
        xs, os_, wh = x.cpu().numpy(), open_.cpu().numpy(), where.cpu().numpy()
        for r, automaton in enumerate(self.automata):
            if automaton is None:
                continue
            region = self._region(r, xs[r], os_[r])
            columns = [w for w in range(width) if s + w >= self.starts[r] and wh[r, w]]
            if not columns:
                continue
            # per position the allowed classes, then every position's tokens in one gather
            classes = np.stack([region.allowed_classes(s + w - self.starts[r]) for w in columns])
            allowed[r, columns] = self._widened(automaton.tokens_of(classes), vocab)
            restricted[r, columns] = True
        allowed_t = torch.from_numpy(allowed).to(logits.device)
        out = logits.masked_fill(~allowed_t, float("-inf"))
        return out, Restriction(allowed_t, torch.from_numpy(restricted), [a is not None for a in self.automata])

    def restrict_causal(self, logits: torch.Tensor, x: torch.Tensor, open_: torch.Tensor, s: int, tokens: torch.Tensor) -> torch.Tensor:
        """`logits` `[B, W, V]` of window `[s, s + W)`, where the canvas `x` is open, as an
        autoregressive decode reads them: at each position the tokens that keep the canvas
        completable with `tokens` `[B, W]` written before it in the window and every later open
        position still open (a speculative verify: engine/kinds/speculative.py). `tokens` must be
        jointly completable (a `draft`), so every prefix is."""
        rows, width, vocab = logits.shape
        allowed = np.ones((rows, width, vocab), dtype=bool)
        xs, os_, ts = x.cpu().numpy(), open_.cpu().numpy(), tokens.cpu().numpy()
        for r, automaton in enumerate(self.automata):
            if automaton is None:
                continue
            region = self._region(r, xs[r], os_[r])
            start = self.starts[r]
            for w in range(width):
                i = s + w - start
                if i < 0:
                    continue
                if region.open[i]:
                    self._invariant(r, region)
                    allowed[r, w] = self._widened(region.allowed_tokens(i), vocab)
                region.set(i, int(ts[r, w]))
        return logits.masked_fill(~torch.from_numpy(allowed).to(logits.device), float("-inf"))

    def admit(self, x: torch.Tensor, open_: torch.Tensor, s: int, writes: torch.Tensor, tokens: torch.Tensor, order: torch.Tensor, opened: torch.Tensor | None = None) -> torch.Tensor:
        """`[B, W]`: the `writes` (tokens `tokens` into window `[s, s + W)`) kept, taken in
        descending `order` and each kept only while the canvas stays completable; positions
        `opened` this step (remasks) count as open first (opening never removes a completion)."""
        kept = writes.clone()
        xs, os_ = x.cpu().numpy(), open_.cpu().numpy()
        ws, ts, ords = writes.cpu().numpy(), tokens.cpu().numpy(), order.double().cpu().numpy()
        ops = opened.cpu().numpy() if opened is not None else None
        for r, automaton in enumerate(self.automata):
            if automaton is None or not ws[r].any():
                continue
            start = self.starts[r]
            free = os_[r].copy()
            if ops is not None:
                free[s : s + ops.shape[1]] |= ops[r]
            region = self._region(r, xs[r], free)
            candidates = sorted(np.nonzero(ws[r])[0].tolist(), key=lambda w: (-ords[r, w], w))
            for w in candidates:
                i = s + w - start
                if i < 0:
                    continue
                if not region.allows(i, int(ts[r, w])):
                    kept[r, w] = False
                    continue
                region.set(i, int(ts[r, w]))
        return kept

    def draft(self, logits: torch.Tensor, x: torch.Tensor, open_: torch.Tensor, s: int, order: torch.Tensor) -> torch.Tensor:
        """`[B, W]`: each position's most probable token (argmax of `logits`), in a constrained row
        chosen position by position in descending `order` among the tokens that keep the canvas
        completable with those chosen before it: a uniform-state canvas's output is its draft."""
        draft = logits.argmax(dim=-1)
        xs, os_, ords = x.cpu().numpy(), open_.cpu().numpy(), order.double().cpu().numpy()
        values = None
        for r, automaton in enumerate(self.automata):
            if automaton is None:
                continue
            if values is None:
                values = logits.float().cpu().numpy()
            region = self._region(r, xs[r], os_[r])
            start = self.starts[r]
            for w in sorted(range(logits.shape[1]), key=lambda w: (-ords[r, w], w)):
                i = s + w - start
                if i < 0:
                    continue
                self._invariant(r, region)
                allowed = self._widened(region.allowed_tokens(i), values.shape[-1])
                token = int(np.where(allowed, values[r, w], -np.inf).argmax())
                draft[r, w] = token
                region.set(i, token)
        return draft
