"""The token automaton a constraint compiles to, and the dynamic programme over a canvas
(docs/constraints.md §2).

A `TokenAutomaton` reads a whole answer region token by token: the answer (a word of the
constraint's language, written in the tokenizer's tokens), then end-of-text to the region's end.
Tokens that act alike in every state share a class, so the transition table is `[classes,
states]` rather than `[vocabulary, states]` (a 32k BPE vocabulary under a JSON schema has a few
hundred classes). A canvas row is a region of tokens some of which are open; `Sets` holds, per
region position, the states reachable from the left (`forward`) and the states from which the
rest can still be completed (`backward`). A token is allowed at position i when some state
reachable before i goes, on it, to a state co-reachable after i.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

NO_STATE = -1


@dataclass(frozen=True)
class TokenAutomaton:
    """`class_of` `[V]`: each token id's class (-1: never allowed); `table` `[C, S]`: the next
    state on a class (-1: none); `accepting` `[S]`. What it derives (the step relation's edges,
    the open tail's sets) is derived where it is used, never sent or kept: the relation as a
    matrix was S^2 bytes (4 MB at 2,000 states, twenty times the table), which a build's child
    sent and the store wrote, digested and read back for every new constraint."""

    class_of: np.ndarray
    table: np.ndarray
    initial: int
    accepting: np.ndarray

    @classmethod
    def from_transitions(cls, transitions: dict[int, dict[int, int]], initial: int, accepting: set[int], vocab_size: int) -> "TokenAutomaton":
        """From `state -> {token: next}` (dense states 0..S-1), grouping tokens whose columns are equal."""
        states = len(transitions)
        columns: dict[int, list[tuple[int, int]]] = {}
        for s, moves in transitions.items():
            for token, nxt in moves.items():
                columns.setdefault(token, []).append((s, nxt))
        class_of = np.full(vocab_size, NO_STATE, dtype=np.int64)
        signatures: dict[tuple[tuple[int, int], ...], int] = {}
        rows: list[np.ndarray] = []
        for token, column in columns.items():
            key = tuple(sorted(column))
            c = signatures.get(key)
            if c is None:
                c = signatures[key] = len(rows)
                row = np.full(states, NO_STATE, dtype=np.int64)
                for s, nxt in key:
                    row[s] = nxt
                rows.append(row)
            if token < vocab_size:
                class_of[token] = c
        table = np.stack(rows) if rows else np.full((0, states), NO_STATE, dtype=np.int64)
        acc = np.zeros(states, dtype=bool)
        acc[list(accepting)] = True
        return cls(class_of, table, initial, acc)

    @classmethod
    def everything(cls, vocab_size: int) -> "TokenAutomaton":
        """One accepting state that loops on every token: the constraint that allows everything."""
        return cls.from_transitions({0: {t: 0 for t in range(vocab_size)}}, 0, {0}, vocab_size)

    def __post_init__(self) -> None:
        # the open tail's backward sets (`open_backward`), grown on use by any request's thread
        object.__setattr__(self, "_tail", [self.accepting.copy()])
        object.__setattr__(self, "_tail_lock", threading.Lock())

    def __getstate__(self) -> dict[str, object]:
        """Its arrays only: what it derives on use (`_edges`, the open tail's sets) is
        derived again wherever it is sent (a worker rank, from a build's child)."""
        return {name: self.__dict__[name] for name in ("class_of", "table", "initial", "accepting")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def states(self) -> int:
        return self.table.shape[1]

    @property
    def classes(self) -> int:
        return self.table.shape[0]

    def shortest(self) -> int | None:
        """The fewest tokens that take the initial state to an accepting one (None: none do)."""
        frontier = np.zeros(self.states, dtype=bool)
        frontier[self.initial] = True
        seen = frontier.copy()
        for length in range(self.states + 1):
            if (frontier & self.accepting).any():
                return length
            frontier = self.step_open(frontier) & ~seen
            if not frontier.any():
                return None
            seen |= frontier
        return None

    def step(self, states: np.ndarray, token: int) -> np.ndarray:
        """The states after reading `token` (a fixed position) from the set `states`."""
        out = np.zeros(self.states, dtype=bool)
        c = self.class_of[token] if 0 <= token < len(self.class_of) else NO_STATE
        if c != NO_STATE:
            nxt = self.table[c, states]
            out[nxt[nxt >= 0]] = True
        return out

    def back(self, after: np.ndarray, token: int) -> np.ndarray:
        """The states from which reading `token` lands in `after`."""
        c = self.class_of[token] if 0 <= token < len(self.class_of) else NO_STATE
        if c == NO_STATE:
            return np.zeros(self.states, dtype=bool)
        nxt = self.table[c]
        return (nxt >= 0) & after[np.maximum(nxt, 0)]

    @cached_property
    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The pairs (source, destination) with some token leading from one to the other, sorted
        and each once, read off the table: an open position's step in O(edges), not the O(S^2) of
        a matrix product (a JSON object's 1,112 states over a 99-token vocabulary have 2,700)."""
        moves = self.table >= 0
        step = np.zeros((self.states, self.states), dtype=bool)  # at most 16 MB, for this call only: a sort of the
        step[np.nonzero(moves)[1], self.table[moves]] = True  # table's 8M entries would take seconds
        return np.nonzero(step)

    def step_open(self, states: np.ndarray) -> np.ndarray:
        """The states after an open position (any token) from the set `states`."""
        src, dst = self._edges
        out = np.zeros(self.states, dtype=bool)
        out[dst[states[src]]] = True
        return out

    def back_open(self, after: np.ndarray) -> np.ndarray:
        """The states from which an open position (some token) lands in `after`."""
        src, dst = self._edges
        out = np.zeros(self.states, dtype=bool)
        out[src[after[dst]]] = True
        return out

    def open_backward(self, n: int) -> np.ndarray:
        """`[n + 1, S]`: row k, the states from which k open positions can reach acceptance: the
        backward sets of a region's open tail (every request's canvas ends in one), computed once
        per automaton, not at every step of every run."""
        with self._tail_lock:
            tail = self._tail
            while len(tail) <= n:
                nxt = self.back_open(tail[-1])
                if np.array_equal(nxt, tail[-1]):  # a fixed point: every longer tail is the same set
                    tail.extend([nxt] * (n + 1 - len(tail)))
                    break
                tail.append(nxt)
            return np.stack(tail[: n + 1])

    def allowed_classes(self, forward: np.ndarray, backward_next: np.ndarray) -> np.ndarray:
        """`[C]`: the classes that take some state of `forward` (the set before a position) into
        `backward_next` (the set after it)."""
        table = self.table[:, forward]  # only the states reachable there matter
        return ((table >= 0) & backward_next[np.maximum(table, 0)]).any(axis=1)

    def tokens_of(self, classes: np.ndarray) -> np.ndarray:
        """`[..., V]` bool: the token ids whose class is allowed in `classes` `[..., C]`."""
        c = self.class_of
        if not classes.shape[-1]:
            return np.zeros((*classes.shape[:-1], len(c)), dtype=bool)
        return classes[..., np.maximum(c, 0)] & (c >= 0)

    def sets(self, tokens: np.ndarray, open_: np.ndarray) -> "Sets":
        """Forward and backward state sets over a region (`tokens`, `open_` `[L]`), every position."""
        region = Region(self, tokens, open_)
        region.forward_at(len(tokens))
        region.backward_at(0)
        return Sets(self, region.forward, region.backward)


CANCEL_EVERY = 64  # positions between two looks at the run's cancel inside one pass over a region


class Region:
    """A row's region and its forward and backward sets, kept across a run's steps and computed
    lazily: `forward[: self.fv + 1]` and `backward[self.bv :]` are valid for the region as it is;
    a change at position i invalidates only `forward` after i and `backward` up to i, so a step
    that writes a few positions of its block pays for that span, not for the whole canvas (the
    sets are the ones a whole pass gives: `TokenAutomaton.sets` is this, computed everywhere).
    `check`: called every CANCEL_EVERY positions of a pass (it raises to stop the run)."""

    def __init__(self, automaton: TokenAutomaton, tokens: np.ndarray, open_: np.ndarray, check: Callable[[], None] | None = None) -> None:
        self.automaton, self.check = automaton, check
        self.tokens, self.open = np.asarray(tokens, dtype=np.int64).copy(), np.asarray(open_, dtype=bool).copy()
        length, states = len(self.tokens), automaton.states
        self.forward = np.zeros((length + 1, states), dtype=bool)
        self.backward = np.zeros((length + 1, states), dtype=bool)
        self.forward[0, automaton.initial] = True
        self.backward[length] = automaton.accepting
        self.fv, self.bv = 0, length

    @property
    def length(self) -> int:
        return len(self.tokens)

    def update(self, tokens: np.ndarray, open_: np.ndarray) -> None:
        """The region is now `tokens` (open where `open_`): the sets stay valid where no position
        before (forward) or after (backward) changed. An open position's token does not count."""
        changed = np.flatnonzero((open_ != self.open) | (~open_ & (tokens != self.tokens)))
        if len(changed):
            self.tokens[:], self.open[:] = tokens, open_
            self.fv, self.bv = min(self.fv, int(changed[0])), max(self.bv, int(changed[-1]) + 1)

    def set(self, i: int, token: int, open_: bool = False) -> None:
        """Position i becomes `token` (or open)."""
        if self.open[i] == open_ and (open_ or self.tokens[i] == token):
            return
        self.tokens[i], self.open[i] = token, open_
        self.fv, self.bv = min(self.fv, i), max(self.bv, i + 1)

    def forward_at(self, i: int) -> np.ndarray:
        """The states reachable after the first i tokens."""
        a = self.automaton
        bottom = self.fv
        for p in range(bottom, i):
            if self.check is not None and (p - bottom) % CANCEL_EVERY == CANCEL_EVERY - 1:
                self.check()
            self.forward[p + 1] = a.step_open(self.forward[p]) if self.open[p] else a.step(self.forward[p], int(self.tokens[p]))
            self.fv = p + 1  # kept as it goes: a pass a cancel stopped resumes where it stopped
        return self.forward[i]

    def backward_at(self, i: int) -> np.ndarray:
        """The states from which tokens i.. can still reach acceptance."""
        if i >= self.bv:
            return self.backward[i]
        a, length = self.automaton, self.length
        fixed = np.flatnonzero(~self.open)
        tail = int(fixed[-1]) + 1 if len(fixed) else 0  # positions tail.. are open through to the end
        low = max(i, tail)
        if low < self.bv:  # the open tail's sets: the automaton's, computed once
            self.backward[low : self.bv] = a.open_backward(length - low)[length - self.bv + 1 :][::-1]
            self.bv = low
        top = self.bv
        for p in range(top - 1, i - 1, -1):
            if self.check is not None and (top - 1 - p) % CANCEL_EVERY == CANCEL_EVERY - 1:
                self.check()
            self.backward[p] = a.back_open(self.backward[p + 1]) if self.open[p] else a.back(self.backward[p + 1], int(self.tokens[p]))
            self.bv = p
        return self.backward[i]

    @property
    def completable(self) -> bool:
        """Whether some completion of the region is a word: a state both reachable and co-reachable
        at any one position (the same answer at every position), taken where both are known."""
        i = min(self.fv, self.bv)
        return bool((self.forward_at(i) & self.backward_at(i)).any())

    def allows(self, i: int, token: int) -> bool:
        """Whether `token` at position i keeps the region completable (every other position as it is)."""
        return bool((self.automaton.step(self.forward_at(i), token) & self.backward_at(i + 1)).any())

    def allowed_classes(self, i: int) -> np.ndarray:
        """`[C]`: the classes allowed at position i."""
        return self.automaton.allowed_classes(self.forward_at(i), self.backward_at(i + 1))

    def allowed_tokens(self, i: int) -> np.ndarray:
        """`[V]` bool: the token ids allowed at position i."""
        return self.automaton.tokens_of(self.allowed_classes(i))


@dataclass(frozen=True)
class Sets:
    """Per region position i: `forward[i]` the states reachable after the first i tokens,
    `backward[i]` the states from which tokens i.. can still reach acceptance."""

    automaton: TokenAutomaton
    forward: np.ndarray
    backward: np.ndarray

    @property
    def completable(self) -> bool:
        return bool((self.forward[0] & self.backward[0]).any())

    def allows(self, i: int, token: int) -> bool:
        """Whether `token` at region position i keeps the region completable (every other
        position as it is)."""
        return bool((self.automaton.step(self.forward[i], token) & self.backward[i + 1]).any())

    def allowed_classes(self, i: int) -> np.ndarray:
        """`[C]`: the classes allowed at region position i."""
        return self.automaton.allowed_classes(self.forward[i], self.backward[i + 1])

    def allowed_tokens(self, i: int) -> np.ndarray:
        """`[V]` bool: the token ids allowed at region position i."""
        return self.automaton.tokens_of(self.allowed_classes(i))
