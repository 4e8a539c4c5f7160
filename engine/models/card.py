"""What a model's card says that the engine reads: the metadata block at the top of its folder's
README.md (Hugging Face's model-card format, YAML between `---` lines, read by huggingface_hub).

`answer_length`: the generation length (positions after the prompt) the model was trained to
answer in. Below it a masked-diffusion model's answers change and go wrong (tiny-llada's `14+5` at
threshold 0.9 in blocks of 8 on a 16-position canvas: `10`), so the server keeps its canvas at least that long whatever
`max_tokens` a client sends, and cuts the text instead (docs/serving.md §1). Each embedded model's
card gives it (assets/*/README.md); a card without it, or a folder without a card, gives None.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from huggingface_hub import metadata_load

from ..errors import EngineError

CARD = "README.md"
MAX_ANSWER_LENGTH = 1 << 20  # far beyond any model's positions: a card's typo is refused, not run


def answer_length(folder: str | Path) -> int | None:
    """The card's `answer_length` in `folder` (module docstring); EngineError in one line when the
    card's metadata cannot be read or the value is not a positive integer."""
    card = Path(folder) / CARD
    if not card.is_file():
        return None
    try:
        metadata = metadata_load(card) or {}
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise EngineError(f"model card {card}: its metadata cannot be read ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})") from None
    value = metadata.get("answer_length")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_ANSWER_LENGTH:
        raise EngineError(f"model card {card}: answer_length must be a positive integer, got {str(value)[:40]!r}")
    return value
