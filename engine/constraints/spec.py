"""What a request asks its answer to be: a regex, a JSON schema or one of a list of choices
(GenerationConfig's `regex`, `json_schema`, `choice`; at most one), checked and bounded before any
model work, and turned into the one regex the automaton is built from (docs/constraints.md §1).

The schema's regex is outlines-core's (`json_schema.build_regex_from_schema`); the regex syntax
is outlines-core's (Rust's `regex` crate), checked by building its byte-level DFA.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import EngineError
from .limits import MAX_CHOICE_CHARS, MAX_CHOICES, MAX_REGEX_CHARS, MAX_REPEAT, MAX_SCHEMA_CHARS, MAX_STATES
from .stored import BYTE_LEVEL, built_once, load_byte_states, save_byte_states

CONSTRAINT_FIELDS = ("regex", "json_schema", "choice")
# response_format {"type": "json_object"}: any JSON object (its generic grammar is the costly one to build)
JSON_OBJECT = {"type": "object"}
# Rust regex's meta characters (regex_syntax::is_meta_character): what a literal choice escapes
_META = set("\\.+*?()|[]{}^$#&-~")
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


@dataclass(frozen=True)
class ConstraintSpec:
    """One answer's constraint: `kind` one of CONSTRAINT_FIELDS, `value` its setting."""

    kind: str
    value: Any

    def regex(self) -> str:
        """The regex of the answer's language."""
        if self.kind == "regex":
            return self.value
        if self.kind == "choice":
            return "|".join("(" + escape(c) + ")" for c in self.value)
        from outlines_core.json_schema import build_regex_from_schema

        try:
            return build_regex_from_schema(json.dumps(self.value))
        except (ValueError, RuntimeError, TypeError) as exc:
            raise EngineError(f"json_schema: outlines-core cannot turn it into a regex: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None

    def describe(self) -> str:
        """A short label (the trace's and the benchmark's)."""
        text = json.dumps(self.value) if self.kind != "regex" else self.value
        return f"{self.kind} {text[:60]}{'...' if len(text) > 60 else ''}"


def escape(text: str) -> str:
    """`text` as a literal in Rust's regex syntax."""
    return "".join("\\" + ch if ch in _META else ch for ch in text)


def spec_of(config: Any) -> ConstraintSpec | None:
    """The config's constraint (None: the answer is free)."""
    for kind in CONSTRAINT_FIELDS:
        value = getattr(config, kind)
        if value is not None:
            return ConstraintSpec(kind, tuple(value) if kind == "choice" else value)
    return None


def check_config(config: Any) -> None:
    """At most one constraint, each of its type and within the bounds, its regex well formed:
    EngineError in one line naming the setting."""
    given = [kind for kind in CONSTRAINT_FIELDS if getattr(config, kind) is not None]
    if len(given) > 1:
        raise EngineError(f"give at most one of regex, json_schema and choice, not {' and '.join(given)}")
    if not given:
        return
    spec = spec_of(config)
    if spec.kind == "regex":
        if len(spec.value) > MAX_REGEX_CHARS:
            raise EngineError(f"regex: {len(spec.value)} characters; at most {MAX_REGEX_CHARS}")
    elif spec.kind == "choice":
        if not spec.value or len(spec.value) > MAX_CHOICES:
            raise EngineError(f"choice: give 1 to {MAX_CHOICES} choices, got {len(spec.value)}")
        bad = [c for c in spec.value if not isinstance(c, str) or not c or len(c) > MAX_CHOICE_CHARS]
        if bad:
            raise EngineError(f"choice: every choice must be a non-empty text of at most {MAX_CHOICE_CHARS} characters, got {str(bad[0])[:40]!r}")
    else:
        check_schema(spec.value)
    check_regex(spec.regex())


def check_schema(schema: Any) -> None:
    """A JSON Schema object (jsonschema's meta-schema check), within the size bound."""
    import jsonschema

    if not isinstance(schema, dict):
        raise EngineError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise EngineError(f"json_schema: {len(text)} characters of JSON; at most {MAX_SCHEMA_CHARS}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise EngineError(f"json_schema is not a valid JSON Schema: {exc.message[:200]}") from None


def check_regex(regex: str) -> None:
    """Syntax, repetition counts and DFA size, on the byte-level DFA outlines-core builds (cached;
    in a child within a deadline and a memory bound: bounded.py), after a bound read off the
    regex's structure that refuses, at once, what could not fit (`(a{1000}){1000}`)."""
    if len(regex) > MAX_REGEX_CHARS:
        raise EngineError(f"the constraint's regex has {len(regex)} characters; at most {MAX_REGEX_CHARS}")
    for m in _REPEAT.finditer(regex):
        counts = [int(g) for g in m.groups() if g]
        if max(counts) > MAX_REPEAT:
            raise EngineError(f"regex: the repetition {m.group(0)} asks for more than {MAX_REPEAT}")
    bound = structural_bound(regex)
    if bound is not None and bound > MAX_STATES:
        raise EngineError(f"regex: its automaton would need about {bound:,} states (repetitions multiply what they repeat); at most {MAX_STATES:,}")
    _byte_states(regex)


# a character outside ASCII is up to 4 bytes, so a class or `.` that admits one is up to 4 states of
# the byte-level DFA per character
_WIDE = 4


@lru_cache(maxsize=256)  # json_object's 6,900-character regex takes Python's parser ~0.1 s, which no request should pay again
def structural_bound(regex: str) -> int | None:
    """An estimate, read off the regex's parse (Python's, whose syntax this shares for what it
    bounds), of the byte-level DFA's states a counted repetition forces: a literal byte 1, a class
    or `.` that admits non-ASCII characters 4, a concatenation or an alternation the sum of its
    parts, `X{m,n}` n times X (an unbounded one m + 1 times). None where Python cannot parse it
    (outlines-core's own build then checks it)."""
    import re._constants as c
    import re._parser as parser

    try:
        parsed = parser.parse(regex)
    except (re.error, RecursionError, OverflowError):
        return None

    def wide(items: list) -> bool:  # a class (its items) admitting a character outside ASCII
        if any(op is c.NEGATE for op, _ in items):
            return True
        return any((op is c.LITERAL and av > 0x7F) or (op is c.RANGE and av[1] > 0x7F) or op is c.CATEGORY for op, av in items)

    def size(pattern: Any) -> int:
        total = 0
        for op, av in pattern:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                low, high, sub = av
                total += (high if high != c.MAXREPEAT else low + 1) * size(sub)
            elif op is c.SUBPATTERN or op is c.ATOMIC_GROUP:
                total += size(av[-1])
            elif op is c.BRANCH:
                total += sum(size(branch) for branch in av[1])
            elif op is c.IN:
                total += _WIDE if wide(av) else 1
            elif op is c.ANY:
                total += _WIDE
            elif op is c.LITERAL or op is c.NOT_LITERAL:
                total += 1 if op is c.LITERAL and av <= 0x7F else _WIDE
        return total

    return size(parsed)


@lru_cache(maxsize=256)
def _byte_states(regex: str) -> int:
    """byte_states, counted once on the machine (kept on disk: stored.py)."""
    from .bounded import run_bounded

    return built_once(BYTE_LEVEL, regex, lambda: load_byte_states(regex), lambda: run_bounded(f"regex {regex[:60]!r}", byte_states, regex), lambda states: save_byte_states(regex, states))


def byte_states(regex: str) -> int:
    """The states of the regex's byte-level DFA, built by outlines-core (in a bounded child:
    bounded.py); EngineError when it is invalid, too large or matches no text."""
    from outlines_core import Index

    try:
        index = Index(regex, _byte_vocabulary())
    except (ValueError, RuntimeError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "incompatible" in message:  # every byte is a token here: the regex itself matches nothing
            raise EngineError(f"regex {regex[:60]!r} matches no text") from None
        raise EngineError(f"invalid regex {regex[:60]!r}: {message[:200]}") from None
    states = len(index.get_transitions())
    if states > MAX_STATES:
        raise EngineError(f"regex: its automaton has {states} states; at most {MAX_STATES}")
    if not index.get_final_states():
        raise EngineError(f"regex {regex[:60]!r} matches no text")
    return states


@lru_cache(maxsize=1)
def _byte_vocabulary() -> Any:
    """Every single byte as a token (id = byte + 1; 0 is the end of text): the regex's own DFA."""
    from outlines_core import Vocabulary

    return Vocabulary(0, {bytes([b]): [b + 1] for b in range(256)})
