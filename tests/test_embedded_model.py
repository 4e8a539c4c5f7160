"""The shipped model folder assets/tiny-llada: layout, loading, held-out validity per family, the
speed/accuracy trade-off it exists to show, and the app's first run animating several iterations.

Decoding is greedy, so every figure here is a fixed property of the shipped weights. The shipped
checkpoint does not meet all of the issue's targets yet (assets/tiny-llada/README.md): the floors
below are under what it measured, and the targets it misses are strict xfails, so a checkpoint
that meets them turns them into failures that ask for the floors to be raised.
"""

import functools
import json
from pathlib import Path

import pytest

from engine import Engine, GenerationConfig, RunHooks, load_model, load_tokenizer
from engine.models import LLaDAModelLM
from tinymodel.eval import evaluate, setting_config
from tinymodel.tasks import TASKS, split_examples

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


@pytest.fixture(scope="module")
def valid_rate(model, tokenizer):
    """`valid_rate(family, setting, limit, block_length=32)`: the held-out valid rate, each one
    evaluated once per module (greedy decoding: a fixed property of the weights, which the floors
    and the issue's targets below both read)."""

    @functools.cache  # keyed on the positional arguments, so `rate` passes every one
    def evaluated(family: str, setting: str, limit: int, block_length: int) -> float:
        examples = split_examples([family], "held_out", limit=limit, seed=7)
        scores = evaluate(model, tokenizer, examples, setting_config(setting, 64, block_length), batch_size=len(examples))
        return sum(s.correct for s in scores.values()) / sum(s.n for s in scores.values())

    def rate(family: str, setting: str, limit: int, block_length: int = 32) -> float:
        return evaluated(family, setting, limit, block_length)

    return rate


# The checkpoint's own level (these 30 prompts measured: add 100%, sub 96.7%, pairsum 83.3%, rhyme 83.3%, grammar 76.7%)
@pytest.mark.parametrize("family, floor", [("add", 0.9), ("sub", 0.85), ("pairsum", 0.7), ("rhyme", 0.65), ("grammar", 0.6)])
def test_threshold_decoder_answers_held_out_prompts_of_every_family(valid_rate, family, floor):
    rate = valid_rate(family, "thr 0.9", limit=30)
    assert rate >= floor, f"{family}: {rate:.0%} valid at threshold 0.9"


NOT_YET = pytest.mark.xfail(strict=True, reason="not reached by the shipped checkpoint yet (assets/tiny-llada/README.md)")
ISSUE_TARGETS = [("add", 0.95), ("sub", 0.95), pytest.param("pairsum", 0.9, marks=NOT_YET),
                 pytest.param("rhyme", 0.95, marks=NOT_YET), pytest.param("grammar", 0.95, marks=NOT_YET)]


@pytest.mark.parametrize("family, target", ISSUE_TARGETS)
def test_the_issues_targets_at_threshold_0_9(valid_rate, family, target):
    assert valid_rate(family, "thr 0.9", limit=30) >= target


def test_pair_sum_shows_the_speed_accuracy_trade_off(valid_rate):
    """Committing dependent digits in one forward breaks the sum: the most parallel setting loses
    at least 20 points against the threshold 0.9 decoder, on the same held-out prompts."""
    careful = valid_rate("pairsum", "thr 0.9", limit=40)
    hasty = valid_rate("pairsum", "fixed x4", limit=40)
    assert careful - hasty >= 0.2, (careful, hasty)


def test_blocks_keep_the_eos_march_from_cutting_grammar_short(valid_rate):
    """In one block of 64 the threshold decoder's forced commits march EOS in from the canvas end
    (lesson 4): fewer held-out sentences parse than in blocks of 32 (48 prompts measured 60.4%
    against 83.3%)."""
    one_block = valid_rate("grammar", "thr 0.9", limit=30, block_length=64)
    blocks = valid_rate("grammar", "thr 0.9", limit=30, block_length=32)
    assert blocks - one_block >= 0.1, (one_block, blocks)


def test_lesson_4_shows_the_eos_march_and_the_blocks_that_stop_it():
    from dinfer_viz.studies.lessons import LESSONS

    lesson, engine = LESSONS[3], Engine(FOLDER)
    example = TASKS["grammar"].parse(lesson.prompt)
    runs = [engine.generate(lesson.prompt, lesson.config(i), hooks=RunHooks(trace=True)) for i in range(2)]
    trace = runs[0].output.trace
    eos, start = engine.tokenizer.eos_token_id, trace.prompt_lengths[0]
    # step 1: iterations forcing one EOS each, every one just left of the one before, down into the answer's room
    march = [rec.forced[0][0] for rec in trace.iterations if len(rec.forced[0]) == 1 and trace.final[0][rec.forced[0][0]] == eos]
    steps_left = sum(1 for a, b in zip(march, march[1:]) if b == a - 1)
    assert steps_left >= 10 and min(march) - start < len(example.response), march
    assert not TASKS["grammar"].check(example, runs[0].text)
    assert TASKS["grammar"].check(example, runs[1].text), runs[1].text  # step 2: the sentence parses


def test_the_apps_default_sweep_draws_the_curve():
    """The Threshold sweep tab's defaults (every held-out pair-sum prompt, its default values), run
    as the tab runs them: several TPF regimes and an accuracy spread (measured 74 points; the floor
    sits well below it, as every floor here does)."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.studies.sweep_study import parse_values, run_sweep, sweep_examples
    from dinfer_viz.tabs.sweep import SWEEP_DEFAULT_PER_SET, SWEEP_DEFAULT_SETS, SWEEP_DEFAULT_VALUES

    host = EngineHost(ModelSpec(str(FOLDER)))
    host.preload()
    examples = sweep_examples(list(SWEEP_DEFAULT_SETS), SWEEP_DEFAULT_PER_SET)
    *_, state = run_sweep(host, host.default, GenerationConfig(), "threshold", parse_values(SWEEP_DEFAULT_VALUES), examples)
    points = state.points()
    accuracy = [p["accuracy"] for p in points]
    assert len({round(p["tpf"], 1) for p in points}) >= 3 and max(accuracy) - min(accuracy) >= 0.5, points


def test_the_apps_first_run_animates_several_iterations():
    from dinfer_viz.tabs.run import DEFAULT_PROMPT

    result = Engine(FOLDER).generate(DEFAULT_PROMPT, GenerationConfig(), hooks=RunHooks(trace=True))
    assert len(result.output.trace.iterations) >= 3
    assert any(rec.forced[0] for rec in result.output.trace.iterations)  # the digits are not certain: forced commits
    example = TASKS["pairsum"].parse(DEFAULT_PROMPT)
    assert example is not None and TASKS["pairsum"].check(example, result.text)  # the first impression is a right answer


def test_eval_tokens_per_forward_do_not_depend_on_the_batch(model, tokenizer):
    examples = split_examples(["sub"], "held_out", limit=6, seed=3)
    config = GenerationConfig(gen_length=64, block_length=8, decoder="threshold", threshold=0.9)
    alone = evaluate(model, tokenizer, examples, config, batch_size=1)
    batched = evaluate(model, tokenizer, examples, config, batch_size=6)
    assert {k: (s.correct, s.tokens, s.nfe) for k, s in alone.items()} == {k: (s.correct, s.tokens, s.nfe) for k, s in batched.items()}


def test_eval_cli_prints_the_table_and_rejects_bad_input(capsys):
    from tinymodel.eval import main

    assert main(["--model", str(FOLDER), "--limit", "3", "--settings", "thr 0.9", "credit", "--tasks", "add", "pairsum", "--gen-length", "32", "--block-length", "32"]) == 0
    table = capsys.readouterr().out
    assert "thr 0.9" in table and "credit" in table and "add 1-digit" in table and "pairsum" in table and "confidence" in table
    # --show-wrong lists each wrong answer; four tokens a forward gets pair-sums wrong (14.7% valid)
    assert main(["--model", str(FOLDER), "--limit", "4", "--settings", "fixed x4", "--tasks", "pairsum", "--show-wrong"]) == 0
    table, wrong = capsys.readouterr().out.split("wrong answers", 1)
    shown = [line for line in wrong.splitlines() if line.startswith("fixed x4 | pairsum | 'Q: ?+?=")]
    assert shown and all(" -> '" in line for line in shown)
    row = next(line for line in table.splitlines() if line.startswith("fixed x4") and "pairsum" in line)
    assert float(row.split()[4]) == 100 * (4 - len(shown)) / 4  # as many as the valid rate leaves
    assert main(["--model", str(FOLDER), "--gen-length", "64", "--block-length", "48"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    for bad in (["--gen-length", "0"], ["--device", "nonsense"], ["--settings", "psychic"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--model", str(FOLDER), *bad])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1
