"""How the page writes counts: every view's words share these (the readouts re-export them)."""

from __future__ import annotations


def plural(n: int, word: str) -> str:
    """`n` and `word`, with an s unless n is 1 ("1 iteration", "2 iterations"): every count the
    page writes goes through here."""
    return f"{n} {word}{'s' * (n != 1)}"
