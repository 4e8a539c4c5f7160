"""A tokenizer's vocabulary as outlines-core sees it, and the token automaton of a regex over it.

outlines-core's `Index` matches token *bytes* against a regex's DFA; a tokenizer stores its
tokens as strings in its own encoding (GPT-2's byte-level alphabet, SentencePiece's `▁` and
`<0xNN>` byte fallback, or plain characters), so `token_bytes` undoes that encoding as the
tokenizer's own decoder declares it. Special tokens ([MASK], end-of-text, padding) are never part
of an answer; the stop ids end it (docs/constraints.md §1).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Iterable

from ..errors import EngineError
from . import stored
from .automaton import TokenAutomaton
from .bounded import run_bounded
from .limits import MAX_STATES, MAX_TABLE_ENTRIES
from .spec import JSON_OBJECT, ConstraintSpec, check_regex

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
COMPILED_KEPT = 32  # automata kept per vocabulary (a server sees the same few schemas again and again)
# Vocabularies kept in this process, by content: engines over one tokenizer (the app's shipped
# models, a model loaded again) share one, and with it the automata already compiled; a JSON
# object's automaton takes outlines-core seconds to build even over a 99-token vocabulary.
VOCABULARIES_KEPT = 4
_shared: OrderedDict[tuple, "TokenVocabulary"] = OrderedDict()
_shared_lock = threading.Lock()


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table (transformers' own), inverted: each character of a byte-level
    BPE token is one byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


def _decoders(spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [d for inner in spec.get("decoders", []) for d in _decoders(inner)]
    return [spec]


def token_bytes(tokenizer: Any) -> dict[int, bytes]:
    """id -> the bytes the token writes, for every non-special token of a transformers fast
    tokenizer or a `tokenizers.Tokenizer`, by the tokenizer's decoder: ByteLevel (GPT-2 BPE),
    Metaspace / Replace('▁', ' ') with ByteFallback (SentencePiece), or the string itself."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str"):
        raise EngineError("constraints need a fast tokenizer (tokenizer.json): this one has no token table outlines-core can read")
    spec = json.loads(backend.to_str())
    decoders = _decoders(spec.get("decoder"))
    kinds = {d.get("type") for d in decoders}
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    byte_level = _byte_level_decoder() if "ByteLevel" in kinds else None
    replacements = [(d["pattern"].get("String", ""), d.get("content", "")) for d in decoders if d.get("type") == "Replace" and isinstance(d.get("pattern"), dict)]
    replacements += [(d.get("replacement", "▁"), " ") for d in decoders if d.get("type") == "Metaspace"]
    out: dict[int, bytes] = {}
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i in special:
            continue
        if byte_level is not None:
            if all(ch in byte_level for ch in token):
                out[i] = bytes(byte_level[ch] for ch in token)
            continue
        fallback = _BYTE_FALLBACK.fullmatch(token) if "ByteFallback" in kinds else None
        if fallback:
            out[i] = bytes([int(fallback.group(1), 16)])
            continue
        for old, new in replacements:
            if old:
                token = token.replace(old, new)
        out[i] = token.encode("utf-8")
    return out


class TokenVocabulary:
    """A tokenizer's tokens as outlines-core's `Vocabulary`, with the automata compiled over it
    (the last `COMPILED_KEPT` regexes). `after`: ids a loop itself writes after a row's
    end-of-text besides the stop ids (a uniform-state row pads with the model's [MASK]/pad id; a
    masked loop never fixes a [MASK], so allowing it there changes nothing)."""

    def __init__(self, tokens: dict[int, bytes], stop_ids: list[int], vocab_size: int, after: tuple[int, ...] = ()) -> None:
        from outlines_core import Vocabulary

        self.stop_ids, self.vocab_size, self.after = list(stop_ids), vocab_size, tuple(after)
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in tokens.items():
            if b and i not in self.stop_ids:  # an empty token writes nothing: never useful in an answer
                by_bytes.setdefault(b, []).append(i)
        self.vocabulary = Vocabulary(self.stop_ids[0], by_bytes)
        self.digest = stored.vocabulary_digest(tokens, self.stop_ids, self.after, vocab_size)  # its automata's name on disk
        self._compiled: OrderedDict[str, TokenAutomaton] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, Future] = {}  # regex -> its build under way

    @classmethod
    def of(cls, tokenizer: Any, stop_ids: list[int], after: tuple[int, ...] = ()) -> "TokenVocabulary":
        """The vocabulary of `tokenizer`: the one already built for the same tokens, stop ids and
        `after` in this process, else a new one (kept, the last `VOCABULARIES_KEPT`)."""
        tokens = token_bytes(tokenizer)
        key = (tuple(sorted(tokens.items())), tuple(stop_ids), tuple(after))
        with _shared_lock:
            if key in _shared:
                _shared.move_to_end(key)
                return _shared[key]
        vocabulary = cls(tokens, stop_ids, max(max(tokens, default=0), *stop_ids, *after) + 1, after)
        with _shared_lock:
            vocabulary = _shared.setdefault(key, vocabulary)
            while len(_shared) > VOCABULARIES_KEPT:
                _shared.popitem(last=False)
        return vocabulary

    def automaton(self, regex: str) -> TokenAutomaton:
        """The region automaton of `regex`: an answer in the regex's language, then end-of-text
        (any stop id, and `after` once the answer has ended) to the region's end, built in a
        bounded child (bounded.py). EngineError in one line when the tokenizer cannot write what
        the regex needs. A regex being built already for another caller is waited for, not built
        twice; one another process built is read from disk (stored.py), and one built here is kept there."""
        with self._lock:
            if regex in self._compiled:
                self._compiled.move_to_end(regex)
                return self._compiled[regex]
            building = self._building.get(regex)
            if building is None:
                building = self._building[regex] = Future()
                owner = True
            else:
                owner = False
        if not owner:
            return building.result()
        try:
            # a kept automaton passed check_regex's bounds when it was kept (they name its file)
            automaton = stored.built_once(self.digest, regex, lambda: stored.load(self.digest, regex, self.vocab_size), lambda: self._build(regex), lambda built: stored.save(self.digest, regex, built))
        except BaseException as exc:
            building.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._building[regex]
        self.adopt({regex: automaton})
        building.set_result(automaton)
        return automaton

    def _build(self, regex: str) -> TokenAutomaton:
        check_regex(regex)  # syntax and size on the byte-level DFA, before the token-level index
        return run_bounded(f"the constraint {regex[:60]!r}", region_automaton, regex, self.vocabulary, tuple(self.stop_ids), self.after, self.vocab_size)

    def kept(self, regex: str) -> bool:
        """Whether the automaton of `regex` is in this process's memory or in the store on disk
        (asking for it reads it, in milliseconds, and builds nothing)."""
        with self._lock:
            if regex in self._compiled:
                return True
        return stored.kept(self.digest, regex)

    def adopt(self, automata: dict[str, TokenAutomaton]) -> None:
        """Keep automata built over this same vocabulary elsewhere: a parallel engine's caller
        builds a request's constraints once, in its bounded child, and its worker ranks adopt them
        (a worker is a daemonic process, which may start no build child of its own)."""
        with self._lock:  # engines on other threads may share this vocabulary
            for regex, automaton in automata.items():
                self._compiled[regex] = automaton
                self._compiled.move_to_end(regex)
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)


def region_automaton(regex: str, vocabulary: Any, stop_ids: tuple[int, ...], after: tuple[int, ...], vocab_size: int) -> TokenAutomaton:
    """outlines-core's token-level index of `regex` over `vocabulary`, as the region automaton
    (TokenVocabulary.automaton; run in its bounded child)."""
    from outlines_core import Index

    try:
        index = Index(regex, vocabulary)
    except (ValueError, RuntimeError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "incompatible" in message:
            missing = message.rsplit(":", 1)[-1].strip().rstrip(".")
            raise EngineError(f"the constraint needs a character this tokenizer cannot write (outlines-core finds no token for one of {missing[:120]})") from None
        raise EngineError(f"the constraint cannot be compiled over this vocabulary: {message[:200]}") from None
    eos = stop_ids[0]
    raw = index.get_transitions()
    finals = set(index.get_final_states())
    dense = {s: k for k, s in enumerate(sorted(set(raw) | finals | {index.get_initial_state()}))}
    done = len(dense)  # the answer has ended: only end-of-text (and `after`) from here
    if done + 1 > MAX_STATES:
        raise EngineError(f"the constraint's automaton has {done + 1} states over this vocabulary; at most {MAX_STATES}")
    transitions: dict[int, dict[int, int]] = {k: {} for k in range(done + 1)}
    for s, moves in raw.items():
        transitions[dense[s]] = {t: dense[n] for t, n in moves.items() if t != eos}
    for s in finals:
        transitions[dense[s]].update({t: done for t in stop_ids})
    transitions[done] = {t: done for t in (*stop_ids, *after)}
    automaton = TokenAutomaton.from_transitions(transitions, dense[index.get_initial_state()], {dense[s] for s in finals} | {done}, vocab_size)
    if automaton.classes * automaton.states > MAX_TABLE_ENTRIES:
        raise EngineError(f"the constraint's automaton needs {automaton.classes} token classes x {automaton.states} states over this vocabulary; at most {MAX_TABLE_ENTRIES} entries")
    return automaton


def compile_in_background(vocabulary: Callable[[], TokenVocabulary], specs: Iterable[ConstraintSpec] = (ConstraintSpec("json_schema", JSON_OBJECT),)) -> threading.Thread:
    """Compile `specs` over `vocabulary()` in a daemon thread (a server's start-up: json_object's
    generic grammar takes 12-30 s, which no first request should pay). A request for one while it
    builds waits for this build; one that fails here is left for the request that asks to report."""

    def build() -> None:
        for spec in specs:
            try:
                check_regex(spec.regex())  # a request's checks count the byte-level DFA's states too
                vocabulary().automaton(spec.regex())
            except EngineError:
                pass

    thread = threading.Thread(target=build, name="constraint-warm", daemon=True)
    thread.start()
    return thread
