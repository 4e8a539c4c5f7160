"""The embedded model's character-level tokenizer, built with the `tokenizers` library.

Every printable ASCII character and the newline is one token; anything else maps to `<|unk|>`.
A BPE model with no merges splits text into single characters, and the Fuse decoder joins them
back without spaces. Saved as tokenizer.json + tokenizer_config.json + special_tokens_map.json,
so `transformers.AutoTokenizer.from_pretrained(folder)` loads it like a real checkpoint's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models

EOS_TOKEN = "<|endoftext|>"  # also the pad token: responses are padded with EOS (LLaDA SFT)
MASK_TOKEN = "<|mdm_mask|>"  # LLaDA's mask token string
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN, UNK_TOKEN)
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))


def build_tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def special_ids(tokenizer: Tokenizer | None = None) -> dict[str, int]:
    """`eos_token_id`, `pad_token_id`, `mask_token_id` as config.json names them."""
    tokenizer = tokenizer or build_tokenizer()
    eos = tokenizer.token_to_id(EOS_TOKEN)
    return {"eos_token_id": eos, "pad_token_id": eos, "mask_token_id": tokenizer.token_to_id(MASK_TOKEN)}


def hf_tokenizer():
    """The tokenizer as `transformers` serves it (what AutoTokenizer returns for a saved folder)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(folder: str | os.PathLike) -> Path:
    """Write the three tokenizer files a Hugging Face model folder carries."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    special = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "mask_token": MASK_TOKEN, "unk_token": UNK_TOKEN}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        # Characters are tokens: no spaces are inserted or removed on decode.
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return folder
