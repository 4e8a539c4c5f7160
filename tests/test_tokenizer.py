"""The embedded model's character-level tokenizer, saved and loaded like a real checkpoint's."""

import json
import random

import pytest
from transformers import AutoTokenizer

from tinymodel.tasks import TASKS
from tinymodel.tokenizer import EOS_TOKEN, MASK_TOKEN, UNK_TOKEN, hf_tokenizer, save_tokenizer, special_ids


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_tokenizer(tmp_path_factory.mktemp("tok"))
    return folder, AutoTokenizer.from_pretrained(str(folder))


def test_folder_has_the_three_files_and_special_tokens(saved):
    folder, tok = saved
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (folder / name).is_file()
    ids = special_ids()
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == EOS_TOKEN and tok.mask_token == MASK_TOKEN
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (ids["eos_token_id"], ids["pad_token_id"], ids["mask_token_id"])
    assert ids["eos_token_id"] != ids["mask_token_id"]
    assert json.loads((folder / "special_tokens_map.json").read_text())["mask_token"] == MASK_TOKEN


def test_every_task_string_round_trips_one_token_per_character(saved):
    _, tok = saved
    rng = random.Random(0)
    texts = [e.prompt + e.response for task in TASKS.values() for split in ("train", "held_out") for e in (task.sample(rng, split) for _ in range(200))]
    encoded = tok(texts, add_special_tokens=False)["input_ids"]
    assert [len(ids) for ids in encoded] == [len(text) for text in texts]
    assert tok.backend_tokenizer.decode_batch(encoded) == texts
    # the transformers decode path (no space clean-up) agrees on a sample
    assert [tok.decode(ids) for ids in encoded[::97]] == texts[::97]
    assert tok.unk_token_id not in {i for ids in encoded for i in ids}


def test_decode_skips_eos_and_mask_and_maps_unknown_characters(saved):
    _, tok = saved
    ids = tok(" The sum is 105.", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids + [tok.eos_token_id] * 3 + [tok.mask_token_id], skip_special_tokens=True) == " The sum is 105."
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(UNK_TOKEN)]


def test_in_memory_tokenizer_matches_the_saved_one(saved):
    _, tok = saved
    memory = hf_tokenizer()
    text = "Q: 48+57=? A: The sum is 105.\nxyz"
    assert memory(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert memory.get_vocab() == tok.get_vocab()
