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

from dataclasses import dataclass

import numpy as np

NO_STATE = -1


@dataclass(frozen=True)
class TokenAutomaton:
    """`class_of` `[V]`: each token id's class (-1: never allowed); `table` `[C, S]`: the next
    state on a class (-1: none); `accepting` `[S]`; `succ` `[S, S]`: s' reachable from s on some
    token (an open position's step)."""

    class_of: np.ndarray
    table: np.ndarray
    initial: int
    accepting: np.ndarray
    succ: np.ndarray

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
        succ = np.zeros((states, states), dtype=bool)
        src, dst = np.nonzero(table >= 0)[1], table[table >= 0]
        succ[src, dst] = True
        acc = np.zeros(states, dtype=bool)
        acc[list(accepting)] = True
        return cls(class_of, table, initial, acc, succ)

    @classmethod
    def everything(cls, vocab_size: int) -> "TokenAutomaton":
        """One accepting state that loops on every token: the constraint that allows everything."""
        return cls.from_transitions({0: {t: 0 for t in range(vocab_size)}}, 0, {0}, vocab_size)

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
            frontier = self.succ[frontier].any(axis=0) & ~seen
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

    def sets(self, tokens: np.ndarray, open_: np.ndarray) -> "Sets":
        """Forward and backward state sets over a region (`tokens`, `open_` `[L]`)."""
        length = len(tokens)
        forward = np.zeros((length + 1, self.states), dtype=bool)
        backward = np.zeros((length + 1, self.states), dtype=bool)
        forward[0, self.initial] = True
        succ_f = self.succ.astype(np.float32)
        for i in range(length):
            if open_[i]:
                forward[i + 1] = forward[i].astype(np.float32) @ succ_f > 0
            else:
                forward[i + 1] = self.step(forward[i], int(tokens[i]))
        backward[length] = self.accepting
        for i in range(length - 1, -1, -1):
            if open_[i]:
                backward[i] = succ_f @ backward[i + 1].astype(np.float32) > 0
            else:
                backward[i] = self.back(backward[i + 1], int(tokens[i]))
        return Sets(self, forward, backward)


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
        a = self.automaton
        table = a.table[:, self.forward[i]]  # only the states reachable there matter
        return ((table >= 0) & self.backward[i + 1][np.maximum(table, 0)]).any(axis=1)

    def allowed_tokens(self, i: int) -> np.ndarray:
        """`[V]` bool: the token ids allowed at region position i."""
        classes = self.allowed_classes(i)
        c = self.automaton.class_of
        return np.where(c >= 0, classes[np.maximum(c, 0)] if len(classes) else False, False)
