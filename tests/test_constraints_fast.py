"""The completability check's fast path (engine/constraints/automaton.py: Region, the open tail's
sets kept per automaton; canvas.py: each row's sets kept between calls) gives exactly what the
whole dense pass gave before it: the forward and backward sets at every position, and every
answer of restrict, admit, draft and restrict_causal, over random canvases of several regexes
and random sequences of steps on one constraint (so the sets kept between calls are exercised);
and a cancel reaches a pass over a long region inside the pass.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from engine.constraints import CanvasConstraint, ConstraintSpec, TokenAutomaton, TokenVocabulary
from engine.constraints.automaton import CANCEL_EVERY, Region
from engine.constraints.canvas import checked_by
from engine.errors import EngineError
from tinymodel.tokenizer import hf_tokenizer, special_ids

SPECIAL = special_ids()
MASK = SPECIAL["mask_token_id"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 4}}, "required": ["n", "ok"]}
REGEXES = [
    r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])",
    r"[a-c]{2,5}(,[0-9])*",
    r"(ab|ba)",
    r"(yes|no|maybe)",
    ConstraintSpec("json_schema", SCHEMA).regex(),
]


@pytest.fixture(scope="module")
def automata() -> list[TokenAutomaton]:
    vocabulary = TokenVocabulary.of(hf_tokenizer(), [SPECIAL["eos_token_id"]], after=(MASK,))
    return [vocabulary.automaton(r) for r in REGEXES]


def dense_sets(a: TokenAutomaton, tokens: np.ndarray, open_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sets as the engine computed them before the fast path: a dense matrix product at every
    open position, a table lookup at every fixed one, the whole region every call."""
    length = len(tokens)
    forward = np.zeros((length + 1, a.states), dtype=bool)
    backward = np.zeros((length + 1, a.states), dtype=bool)
    forward[0, a.initial] = True
    succ = np.zeros((a.states, a.states), dtype=np.float32)  # s' reachable from s on some token
    for c in range(a.classes):
        moves = a.table[c] >= 0
        succ[np.nonzero(moves)[0], a.table[c][moves]] = 1
    for i in range(length):
        forward[i + 1] = forward[i].astype(np.float32) @ succ > 0 if open_[i] else a.step(forward[i], int(tokens[i]))
    backward[length] = a.accepting
    for i in range(length - 1, -1, -1):
        backward[i] = succ @ backward[i + 1].astype(np.float32) > 0 if open_[i] else a.back(backward[i + 1], int(tokens[i]))
    return forward, backward


def dense_allowed(a: TokenAutomaton, forward: np.ndarray, backward: np.ndarray, i: int) -> np.ndarray:
    """`[V]`: the tokens allowed at i, the way the engine spread its classes before."""
    table = a.table[:, forward[i]]
    classes = ((table >= 0) & backward[i + 1][np.maximum(table, 0)]).any(axis=1)
    return np.where(a.class_of >= 0, classes[np.maximum(a.class_of, 0)] if len(classes) else False, False)


def word(a: TokenAutomaton, length: int, rng: np.random.Generator) -> np.ndarray:
    """A random region of `length` tokens the automaton accepts (a random walk kept co-reachable)."""
    _, backward = dense_sets(a, np.zeros(length, dtype=np.int64), np.ones(length, dtype=bool))
    state, out = a.initial, []
    for i in range(length):
        nxt = a.table[a.class_of, state]  # each token's next state from here
        ok = np.flatnonzero((a.class_of >= 0) & (nxt >= 0) & backward[i + 1][np.maximum(nxt, 0)])
        token = int(rng.choice(ok))
        out.append(token)
        state = int(a.table[a.class_of[token], state])
    return np.array(out)


def canvas(a: TokenAutomaton, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A completable region: a word with a random part opened (some of it as a run, as a block's is)."""
    tokens = word(a, length, rng)
    open_ = rng.random(length) < rng.uniform(0.1, 0.9)
    cut = int(rng.integers(0, length))
    open_[cut:] |= rng.random() < 0.5  # often an open tail, as every canvas has
    return np.where(open_, MASK, tokens), open_


@pytest.mark.parametrize("which", range(len(REGEXES)))
def test_the_region_gives_the_dense_sets_after_any_sequence_of_changes(automata, which):
    a, rng = automata[which], np.random.default_rng(which)
    length = 40
    tokens, open_ = canvas(a, length, rng)
    region = Region(a, tokens, open_)
    for trial in range(30):
        if trial % 3 == 0:  # a new canvas: the kept sets must follow whatever changed
            tokens, open_ = canvas(a, length, rng)
            region.update(tokens, open_)
        else:  # single positions written or opened, as admit and draft do (anything: completable or not)
            for i in rng.choice(length, size=int(rng.integers(1, 5)), replace=False):
                if rng.random() < 0.3:
                    open_[i], tokens[i] = True, MASK
                else:
                    open_[i], tokens[i] = False, int(rng.integers(0, len(a.class_of)))
                region.set(int(i), int(tokens[i]), bool(open_[i]))
        forward, backward = dense_sets(a, tokens, open_)
        probe = int(rng.integers(0, length))  # a lazy query first, then everything
        assert (region.forward_at(probe) == forward[probe]).all() and (region.backward_at(probe + 1) == backward[probe + 1]).all()
        assert region.completable == bool((forward[0] & backward[0]).any())
        assert (region.allowed_tokens(probe) == dense_allowed(a, forward, backward, probe)).all()
        region.forward_at(length)
        region.backward_at(0)
        assert (region.forward == forward).all() and (region.backward == backward).all(), f"trial {trial}"
        whole = a.sets(tokens, open_)
        assert (whole.forward == forward).all() and (whole.backward == backward).all()


def dense_restrict(a: TokenAutomaton, start: int, x: np.ndarray, open_: np.ndarray, s: int, where: np.ndarray, vocab: int) -> np.ndarray:
    forward, backward = dense_sets(a, x[start:], open_[start:])
    allowed = np.ones((len(where), vocab), dtype=bool)
    for w in np.flatnonzero(where):
        if s + w >= start:
            allowed[w] = False
            tokens = dense_allowed(a, forward, backward, s + w - start)
            allowed[w, : min(len(tokens), vocab)] = tokens[:vocab]
    return allowed


def dense_admit(a: TokenAutomaton, start: int, x: np.ndarray, open_: np.ndarray, s: int, writes: np.ndarray, tokens: np.ndarray, order: np.ndarray) -> np.ndarray:
    region, free, kept = x[start:].copy(), open_[start:].copy(), writes.copy()
    for w in sorted(np.flatnonzero(writes).tolist(), key=lambda w: (-order[w], w)):
        i = s + w - start
        if i < 0:
            continue
        forward, backward = dense_sets(a, region, free)
        if not (a.step(forward[i], int(tokens[w])) & backward[i + 1]).any():
            kept[w] = False
            continue
        region[i], free[i] = tokens[w], False
    return kept


def dense_draft(a: TokenAutomaton, start: int, x: np.ndarray, open_: np.ndarray, s: int, values: np.ndarray, order: np.ndarray) -> np.ndarray:
    region, free, draft = x[start:].copy(), open_[start:].copy(), values.argmax(-1)
    for w in sorted(range(len(values)), key=lambda w: (-order[w], w)):
        i = s + w - start
        if i < 0:
            continue
        forward, backward = dense_sets(a, region, free)
        allowed = dense_allowed(a, forward, backward, i)[: values.shape[-1]]
        draft[w] = int(np.where(allowed, values[w, : len(allowed)], -np.inf).argmax())
        region[i], free[i] = draft[w], False
    return draft


def dense_causal(a: TokenAutomaton, start: int, x: np.ndarray, open_: np.ndarray, s: int, tokens: np.ndarray, vocab: int) -> np.ndarray:
    region, free = x[start:].copy(), open_[start:].copy()
    allowed = np.ones((len(tokens), vocab), dtype=bool)
    for w in range(len(tokens)):
        i = s + w - start
        if i < 0:
            continue
        if free[i]:
            forward, backward = dense_sets(a, region, free)
            allowed[w] = False
            found = dense_allowed(a, forward, backward, i)
            allowed[w, : min(len(found), vocab)] = found[:vocab]
        region[i], free[i] = tokens[w], False
    return allowed


@pytest.mark.parametrize("which", range(len(REGEXES)))
def test_restrict_admit_draft_and_restrict_causal_answer_what_the_dense_pass_answered(automata, which):
    """Steps of a decoding on one constraint (its sets kept between calls): every call's answer
    equals the dense pass's on the same canvas, a free row beside it untouched."""
    a, rng = automata[which], np.random.default_rng(100 + which)
    prompt, length, width = 3, 3 + 36, 8
    vocab = len(a.class_of) + 2  # logits a little wider than the automaton's vocabulary, as a model's may be
    region_tokens, region_open = canvas(a, length - prompt, rng)
    x = np.concatenate([np.full((2, prompt), 7), np.stack([region_tokens, np.full(length - prompt, MASK)])], axis=1)
    x[1, prompt:] = MASK
    check = CanvasConstraint([a, None], [prompt, prompt], length)
    for step in range(24):
        open_ = x == MASK
        open_[:, :prompt] = False
        s = int(rng.integers(0, length - width + 1))
        kind = step % 3
        where = np.ones((2, width), dtype=bool)
        # a masked step may restrict fixed positions too (a revising decoder's); a draft's logits are
        # restricted where it may write, and its tokens at fixed positions come from unrestricted ones
        where[0] = open_[0, s : s + width] | ((rng.random(width) < 0.2) if kind == 0 else False)
        logits = torch.from_numpy(rng.standard_normal((2, width, vocab)).astype(np.float32))
        xt, ot = torch.from_numpy(x), torch.from_numpy(open_)
        restricted, restriction = check.restrict(logits, xt, ot, s, torch.from_numpy(where))
        expected = dense_restrict(a, prompt, x[0], open_[0], s, where[0], vocab)
        assert (restriction.allowed[0].numpy() == expected).all(), f"step {step}: restrict"
        assert restriction.allowed[1].all() and torch.equal(restricted[1], logits[1])
        order = torch.from_numpy(rng.random((2, width)))
        if kind == 0:  # a masked step: the decoder's writes, each admitted in its order
            tokens = torch.from_numpy(np.where(rng.random((2, width)) < 0.7, restricted.argmax(-1).numpy(), rng.integers(0, vocab - 2, (2, width))))
            writes = ot[:, s : s + width] & torch.from_numpy(rng.random((2, width)) < 0.6)
            kept = check.admit(xt, ot, s, writes, tokens, order)
            assert (kept[0].numpy() == dense_admit(a, prompt, x[0], open_[0], s, writes[0].numpy(), tokens[0].numpy(), order[0].numpy())).all(), f"step {step}: admit"
            x[:, s : s + width] = np.where(kept.numpy(), tokens.numpy(), x[:, s : s + width])
        elif kind == 1:  # a uniform step's draft
            draft = check.draft(restricted, xt, ot, s, order)
            assert (draft[0].numpy() == dense_draft(a, prompt, x[0], open_[0], s, restricted[0].numpy(), order[0].numpy())).all(), f"step {step}: draft"
            assert torch.equal(draft[1], restricted[1].argmax(-1))
            # the draft is completable as a whole (its fixed positions' tokens with it): written
            # there, and at some of its open positions
            keep_open = open_[0, s : s + width] & (rng.random(width) < 0.5)
            x[0, s : s + width] = np.where(keep_open, x[0, s : s + width], draft[0].numpy())
        else:  # a speculative verify over a jointly completable draft
            draft = check.draft(restricted, xt, ot, s, torch.arange(width, 0, -1).expand(2, width).double())
            causal = check.restrict_causal(logits, xt, ot, s, draft)
            expected = dense_causal(a, prompt, x[0], open_[0], s, draft[0].numpy(), vocab)
            assert (torch.isfinite(causal[0]).numpy() == expected).all(), f"step {step}: restrict_causal"
        if rng.random() < 0.15:  # a remask: positions opened again
            opened = rng.choice(np.flatnonzero(~open_[0]), size=min(2, int((~open_[0]).sum())), replace=False)
            x[0, opened] = MASK
        assert check.completable(torch.from_numpy(x), torch.from_numpy(x == MASK))[0]


def test_a_cancel_reaches_a_pass_over_a_long_region_inside_the_pass(automata):
    """A run's cancel check is called within a pass (every CANCEL_EVERY positions), not only
    between steps: the pass stops there, and the constraint is usable again afterwards."""
    a = automata[1]
    length = 8 * CANCEL_EVERY
    x = torch.full((1, length), MASK)
    x[0, 8::3] = SPECIAL["eos_token_id"]  # the answer within the first 8 positions; no open tail to take whole
    cancel, calls = threading.Event(), []

    def check() -> None:
        calls.append(1)
        if cancel.is_set():
            raise EngineError("generation cancelled")

    with checked_by(check):
        constraint = CanvasConstraint([a], [0], length)
    cancel.set()
    logits = torch.zeros((1, 4, len(a.class_of)))
    with pytest.raises(EngineError, match="cancelled"):
        constraint.restrict(logits, x, x == MASK, 0, torch.ones((1, 4), dtype=torch.bool))
    assert len(calls) == 1  # it stopped at the first look, CANCEL_EVERY positions in
    cancel.clear()
    _, restriction = constraint.restrict(logits, x, x == MASK, 0, torch.ones((1, 4), dtype=torch.bool))
    letters = {int(hf_tokenizer().convert_tokens_to_ids(c)) for c in "abc"}
    assert set(np.flatnonzero(restriction.allowed[0, 0].numpy()).tolist()) == letters
