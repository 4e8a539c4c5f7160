"""Readable text for the token pieces a trace carries (`Trace.tokens`: id -> tokenizer piece).

Pieces come from `convert_ids_to_tokens`, so byte-level BPE pieces (LLaDA, Llama 3, GPT-2) spell
a leading space as 'Ġ' and a newline as 'Ċ', and SentencePiece pieces spell a space as '▁'.
Mapping them back here lets an uploaded trace render with no tokenizer at hand.
"""

from __future__ import annotations

import re


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the rest to 256+."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_OF = _byte_level_decoder()
_SPECIAL = re.compile(r"^<\|?[^<>]*\|?>$|^\[[A-Z_]+\]$")


def is_special(piece: str) -> bool:
    """`<|endoftext|>`, `<|mdm_mask|>`, `</s>`, `[MASK]`: markup, not text."""
    return bool(_SPECIAL.match(piece))


def readable(piece: str) -> str:
    """The text a piece stands for ('Ġthe' -> ' the', '▁the' -> ' the'); specials unchanged."""
    if not piece or is_special(piece):
        return piece
    if "▁" in piece:
        return piece.replace("▁", " ")
    if piece.isascii() or not all(ch in _BYTE_OF for ch in piece):
        return piece
    try:  # byte-level only if the bytes are valid UTF-8; a plain 'é' piece stays as it is
        return bytes(_BYTE_OF[ch] for ch in piece).decode("utf-8")
    except UnicodeDecodeError:
        return piece


def glyph(text: str) -> str:
    """Whitespace made visible for a grid cell: a space is '·', a newline '↵', a tab '→'."""
    if text == "":
        return "∅"
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "→")
