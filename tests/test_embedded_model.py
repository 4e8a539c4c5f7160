"""The shipped model folder assets/tiny-llada: layout, loading, and held-out accuracy."""

import json
from pathlib import Path

import pytest

from engine import Engine, GenerationConfig, generate, load_model, load_tokenizer
from engine.models import LLaDAModelLM
from tinymodel.tasks import get_task, held_out_examples

FOLDER = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"

pytestmark = pytest.mark.skipif(
    not (FOLDER / "model.safetensors").is_file(), reason="assets/tiny-llada not trained yet (python -m tinymodel.train)"
)


@pytest.fixture(scope="module")
def model():
    return load_model(FOLDER)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FOLDER)


def test_folder_is_a_small_llada_checkpoint():
    names = {p.name for p in FOLDER.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "README.md"} <= names
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 20 * 2**20
    config = json.loads((FOLDER / "config.json").read_text())
    assert config["model_type"] == "llada" and config["architectures"] == ["LLaDAModelLM"]
    assert config["pad_token_id"] == config["eos_token_id"] != config["mask_token_id"]


def test_loads_through_the_engine_loader_and_auto_tokenizer(model, tokenizer):
    assert isinstance(model, LLaDAModelLM)
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert tokenizer.mask_token_id == model.mask_token_id
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == model.eos_token_id
    assert model.config["vocab_size"] == len(tokenizer)


@pytest.mark.parametrize("task", ["add", "sub"])
def test_threshold_decoder_answers_held_out_prompts(model, tokenizer, task):
    """20 held-out prompts per family, at least 90% right (the shipped model measured 100% on all
    1,618 held-out prompts: assets/tiny-llada/README.md)."""
    examples = held_out_examples([task], limit=20, seed=7)
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    config = GenerationConfig(gen_length=64, block_length=32, decoder="threshold", threshold=0.9)
    out = generate(model, prompts, config, stop_ids=[model.eos_token_id])
    right = [get_task(e.task).check(e, tokenizer.decode(ids, skip_special_tokens=True)) for e, ids in zip(examples, out.token_ids)]
    assert sum(right) >= 18, f"{sum(right)}/20 held-out {task} prompts right"


def test_engine_pipeline_generates_the_answer_sentence():
    engine = Engine(FOLDER)
    result = engine.generate("Q: 48+57=? A:", GenerationConfig(gen_length=32, block_length=32, decoder="fixed"))
    assert result.text.startswith(" The sum is ")
    assert result.text.endswith(".")


def test_eval_tokens_per_forward_do_not_depend_on_the_batch(model, tokenizer):
    from tinymodel.eval import evaluate

    examples = held_out_examples(["sub"], limit=6, seed=3)
    config = GenerationConfig(gen_length=64, block_length=8, decoder="threshold", threshold=0.9)
    alone = evaluate(model, tokenizer, examples, config, batch_size=1)["sub"]
    batched = evaluate(model, tokenizer, examples, config, batch_size=6)["sub"]
    assert (alone.correct, alone.tokens, alone.nfe) == (batched.correct, batched.tokens, batched.nfe)
    assert alone.nfe >= len(examples) * 3  # block 8 after a 13-character prompt: at least 3 blocks each


def test_eval_cli_prints_the_table_and_rejects_bad_input(capsys):
    from tinymodel.eval import main

    assert main(["--model", str(FOLDER), "--limit", "4", "--decoder", "threshold", "--gen-length", "32", "--block-length", "32"]) == 0
    table = capsys.readouterr().out
    assert "thr 0.9" in table and " add " in table and " sub " in table and "confidence" in table
    assert main(["--model", str(FOLDER), "--gen-length", "64", "--block-length", "48"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    for bad in (["--gen-length", "0"], ["--device", "nonsense"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--model", str(FOLDER), *bad])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
