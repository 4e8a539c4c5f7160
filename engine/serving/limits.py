"""The bounds of one request, as the app's (app.py --max-prompt-chars, --max-gen-length)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import GenerationConfig
from ..errors import EngineError

DEFAULT_MAX_PROMPT_CHARS = 4000
DEFAULT_MAX_GEN_LENGTH = 1024


class TooLarge(EngineError):
    """A request over a size limit (HTTP 413, not 400: the request is well formed, only too big)."""


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
    max_gen_length: int = DEFAULT_MAX_GEN_LENGTH
    max_body_bytes: int = 1 << 20  # a request body's bytes, read before any parsing
    max_prompts: int = 16  # prompts in one completions request (each is one batch row)
    body_seconds: float = 30.0  # the whole body must arrive within this (a client that stalls or lies about its length: 408)

    def __post_init__(self) -> None:
        for name in ("max_prompt_chars", "max_gen_length", "max_body_bytes", "max_prompts", "body_seconds"):
            if not getattr(self, name) > 0:
                raise EngineError(f"{name} must be positive, got {getattr(self, name)}")

    def check(self, prompt_chars: int, config: GenerationConfig) -> None:
        """A prompt's characters (all of a chat's messages) and the config's generation length."""
        if prompt_chars > self.max_prompt_chars:
            raise TooLarge(f"the prompt has {prompt_chars} characters; this server takes at most {self.max_prompt_chars}")
        if config.gen_length > self.max_gen_length:
            raise TooLarge(f"generation length {config.gen_length} is above this server's limit of {self.max_gen_length}")
