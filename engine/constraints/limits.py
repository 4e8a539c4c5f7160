"""Bounds on what a request may ask, like every other request input: the text, and the automaton it
builds (docs/constraints.md §1). Apart from spec.py, which checks them, because a kept automaton's
name carries them too (stored.py): one built under other bounds is never read as passing these."""

MAX_REGEX_CHARS = 16_384
MAX_SCHEMA_CHARS = 16_384
MAX_CHOICES = 256
MAX_CHOICE_CHARS = 1_024
MAX_REPEAT = 1_024  # the largest count a `{n}` / `{n,m}` may ask (each count is that many DFA states)
MAX_STATES = 4_096
MAX_TABLE_ENTRIES = 8_000_000  # token classes x states
