"""Text in, text out: a model folder's model and tokenizer, with its special ids and chat template."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .config import GenerationConfig
from .errors import EngineError
from .iteration import GenerationOutput, generate
from .models import DiffusionLM, load_model
from .models.loader import resolve_model_path
from .trace import IterationRecord, Trace

# Token strings that end a turn in the supported families' tokenizers (LLaDA-8B's EoT, Ling's role end).
_END_OF_TURN_TOKENS = ("<|eot_id|>", "<|role_end|>")
# Any of these makes a folder's tokenizer loadable by AutoTokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | os.PathLike):
    """The folder's tokenizer through transformers.AutoTokenizer (tokenizer.json and friends)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = resolve_model_path(path)
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise EngineError(f"missing file: {folder / 'tokenizer.json'} (the model folder has no tokenizer files)")
    # AutoTokenizer reads config.json and warns that `llada` is not a transformers model type;
    # true but irrelevant (only the tokenizer is loaded through it), so keep it off the console.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EngineError(f"cannot load the tokenizer from {folder}: {first_line}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)


def stop_ids_for(model: DiffusionLM, tokenizer) -> list[int]:
    """EOS first (it pads finished rows), then EoT and the tokenizer's own EOS when they differ."""
    ids = [model.eos_token_id]
    candidates = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in _END_OF_TURN_TOKENS if t in tokenizer.get_vocab()]
    for i in candidates:
        if i is not None and i not in ids and i != model.mask_token_id:
            ids.append(int(i))
    return ids


@dataclass
class TextResult:
    texts: list[str]
    output: GenerationOutput

    @property
    def text(self) -> str:
        return self.texts[0]


class Engine:
    """A loaded model with its tokenizer: `Engine(path).generate("Q: 48+57=? A:", config)`."""

    def __init__(self, path: str | os.PathLike, device: str = "cpu", dtype: torch.dtype | None = None, max_tokens: int | None = None) -> None:
        """`max_tokens`: refuse canvases (prompt + gen_length) longer than this, besides the model's own limit."""
        self.path = str(path)
        self.max_tokens = max_tokens
        self.model = load_model(path, device=device, dtype=dtype)
        self.tokenizer = load_tokenizer(path)
        self.stop_ids = stop_ids_for(self.model, self.tokenizer)

    @property
    def name(self) -> str:
        return Path(self.path).name or self.path

    def encode(self, prompt: str, use_chat_template: bool = True) -> list[int]:
        if not prompt or not prompt.strip():
            raise EngineError("empty prompt")
        if use_chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            return list(ids)
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def unencodable(self, prompt: str, use_chat_template: bool = True) -> list[str]:
        """The pieces of `prompt` the tokenizer can only write as its unknown token (in order)."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None or not prompt:
            return []
        try:
            encoded = self.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # slow tokenizers have no offsets
            return []
        return [prompt[a:b] for i, (a, b) in zip(encoded["input_ids"], encoded["offset_mapping"]) if i == unk]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_strings(self, ids: set[int]) -> dict[str, str]:
        """id -> displayable string, for the trace's `tokens` (the engine asks as ids appear)."""
        return {str(i): self.tokenizer.convert_ids_to_tokens(i) or "" for i in sorted(ids)}

    def generate(
        self,
        prompts: str | list[str],
        config: GenerationConfig,
        *,
        trace: bool = False,
        on_start: Callable[[Trace], None] | None = None,
        on_iteration: Callable[[IterationRecord], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> TextResult:
        """Encode (once), generate (which validates `config`), decode. `on_start` gets the trace
        header, named and with token strings, before the first forward; see engine.generate."""
        batch = [prompts] if isinstance(prompts, str) else list(prompts)
        encoded = [self.encode(p, config.use_chat_template) for p in batch]
        out = generate(
            self.model, encoded, config, stop_ids=self.stop_ids, trace=trace, on_start=on_start, on_iteration=on_iteration,
            cancel=cancel, max_tokens=self.max_tokens, model_name=self.name, token_strings=self.token_strings,
        )
        return TextResult([self.decode(ids) for ids in out.token_ids], out)
