"""Trajectory distillation (tinymodel/distill.py): recording and rebuilding trajectories, the file,
the pair sampler, the transition loss's positions, and collect -> train -> eval on the shipped model."""

import json
from pathlib import Path

import pytest
import torch

from engine import EngineError, GenerationConfig, RunHooks, load_model, load_tokenizer, run_diffusion
from tinymodel.distill import (
    PairSampler,
    Trajectory,
    load_trajectories,
    main,
    pair_batch,
    record_trajectory,
    revealed_positions,
    sample_steps,
    save_trajectories,
    training_prompts,
    transition_loss,
)
from tinymodel.eval import check_answer
from tinymodel.tasks import TASKS

from .conftest import tiny_llada
from .scripted import EOS, ScriptedLM

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"


def _trajectories(trace, task: str = "add") -> list[Trajectory]:
    return [record_trajectory(trace, row, task=task, setting="s", prompt="p", answer="a") for row in range(len(trace.initial))]


def _committing_records(trace, row: int) -> list[int]:
    return [k for k, rec in enumerate(trace.iterations) if rec.committed[row]]


@pytest.mark.parametrize("decoder", ["threshold", "fixed", "hierarchical", "credit"])
def test_replaying_the_commits_rebuilds_every_canvas_of_the_trace(model, decoder):
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11], [12]]  # different lengths: each row generates from its own end
    config = GenerationConfig(gen_length=16, block_length=8, decoder=decoder, threshold=0.3, early_stop=False)
    trace = run_diffusion(model, prompts, config, hooks=RunHooks(trace=True)).trace
    for row, t in enumerate(_trajectories(trace)):
        assert t.prompt_ids == prompts[row]
        assert t.final() == trace.final[row]
        assert t.canvas(0) == trace.initial[row]
        records = _committing_records(trace, row)
        assert t.n_steps == len(records)
        for step, record in enumerate(records, start=1):  # the row's canvas after each forward that wrote to it
            assert t.canvas(step) == trace.canvas_at(record)[row]
        assert torch.equal(t.states()[-1], torch.tensor(t.final()))


def test_early_stop_fill_is_step_zero_and_joins_only_the_final_canvas():
    # block [0, 8): the prompt, then 5, 6, EOS (confident), 7, 8 (not): several forwards; the EOS
    # makes early stop fill [8, 19) with EOS, which no forward wrote
    script = [1, 2, 3, 5, 6, EOS, 7, 8] + [9] * 11
    strength = [0.0] * 3 + [12.0, 12.0, 12.0, 1.0, 0.5] + [12.0] * 11
    config = GenerationConfig(gen_length=16, block_length=8, threshold=0.9)
    trace = run_diffusion(ScriptedLM(script, strength), [[1, 2, 3]], config, hooks=RunHooks(trace=True)).trace
    (t,) = _trajectories(trace)
    assert t.steps[:5] == [1, 1, 1, 2, 3] and t.steps[5:] == [0] * 11
    assert t.final() == trace.final[0] == [1, 2, 3, 5, 6, EOS, 7, 8] + [EOS] * 11
    assert t.canvas(t.n_steps) == trace.canvas_at(len(trace.iterations) - 1)[0] == [1, 2, 3, 5, 6, EOS, 7, 8] + [19] * 11
    assert Trajectory.from_dict(json.loads(t.to_json())) == t


def test_the_file_round_trips_and_refuses_bad_lines(tmp_path, model):
    config = GenerationConfig(gen_length=16, block_length=8, threshold=0.3)
    trajectories = _trajectories(run_diffusion(model, [[3, 4], [5, 6, 7]], config, hooks=RunHooks(trace=True)).trace)
    path = tmp_path / "t.jsonl"
    save_trajectories(path, trajectories)
    assert load_trajectories(path) == trajectories
    good = json.loads(trajectories[0].to_json())
    bad = {
        "steps must number every step": {**good, "steps": [s + 1 if s else 0 for s in good["steps"]]},  # no step 1
        "at the end": {**good, "steps": [0] + good["steps"][1:]},
        "must not hold": {**good, "tokens": [good["mask_id"]] + good["tokens"][1:]},
        "one entry per generated position": {**good, "steps": good["steps"][:-1]},
        "version": {**good, "version": 2},
        "exactly": {**good, "extra": 1},
    }
    for message, line in bad.items():
        path.write_text(trajectories[1].to_json() + "\n" + json.dumps(line) + "\n")
        with pytest.raises(EngineError, match=f"t.jsonl:2: trajectory: .*{message}"):
            load_trajectories(path)
    path.write_text("{not json\n")
    with pytest.raises(EngineError, match="t.jsonl:1: not valid JSON"):
        load_trajectories(path)
    with pytest.raises(EngineError, match="collect writes it"):
        load_trajectories(tmp_path / "missing.jsonl")


def test_sample_steps_draws_every_pair_more_than_one_step_apart_and_no_other():
    generator = torch.Generator().manual_seed(0)
    for n in (2, 3, 5):
        drawn = {sample_steps(n, generator) for _ in range(400)}
        assert drawn == {(i, j) for i in range(n + 1) for j in range(n + 1) if j > i + 1}


def test_pairs_target_exactly_what_the_forwards_wrote_between_the_two_states(model):
    config = GenerationConfig(gen_length=24, block_length=8, threshold=0.5)
    trace = run_diffusion(model, [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13]], config, hooks=RunHooks(trace=True)).trace
    trajectories = _trajectories(trace, "add") + [Trajectory("sub", "s", "p", "a", 49, [3], [7, 8], [1, 1])]  # one step: no pair
    assert any(t.n_steps >= 3 for t in trajectories)
    sampler = PairSampler(trajectories, ["add", "sub", "rhyme"], [1.0, 5.0, 1.0])
    batch = sampler.sample(300, torch.Generator().manual_seed(0))
    mask = sampler.mask_id
    assert {t.task for t, _, _ in batch.pairs} == {"add"}  # a one-step trajectory holds no pair; rhyme has none
    for row, (t, i, j) in enumerate(batch.pairs):
        assert 0 <= i and i + 1 < j <= t.n_steps
        x_i, x_j, width = torch.tensor(t.canvas(i)), torch.tensor(t.canvas(j)), len(t.canvas(i))
        assert torch.equal(batch.inputs[row, :width], x_i) and (batch.inputs[row, width:] == mask).all()
        expected = (x_i == mask) & (x_j != mask)
        assert torch.equal(batch.revealed[row, :width], expected) and not batch.revealed[row, width:].any()
        assert torch.equal(batch.targets[row][batch.revealed[row]], torch.tensor(t.final())[expected])
        # exactly the positions whose step is in (i, j]
        assert batch.revealed[row, len(t.prompt_ids) : width].tolist() == [i < s <= j for s in t.steps]
    with pytest.raises(EngineError, match="two or more steps"):
        PairSampler(trajectories, ["sub"], [1.0])


def test_revealed_positions_are_masked_before_and_filled_after():
    m = 9
    x_i = torch.tensor([[1, m, m, m, m]])
    x_j = torch.tensor([[1, 2, m, 3, m]])
    assert revealed_positions(x_i, x_j, m).tolist() == [[False, True, False, True, False]]


def test_the_transition_loss_reads_only_the_revealed_positions():
    torch.manual_seed(0)
    t = Trajectory("add", "s", "p", "a", 49, [3, 4], [10, 11, 12, 13, 48, 48], [1, 2, 2, 3, 4, 0])
    batch = pair_batch([(t, 0, 2), (t, 1, 4)])
    logits = torch.randn(*batch.inputs.shape, 50)
    loss = transition_loss(logits, batch.targets, batch.revealed)
    expected = torch.nn.functional.cross_entropy(logits[batch.revealed], batch.targets[batch.revealed])
    assert loss.item() == pytest.approx(expected.item())
    elsewhere = logits.clone()
    elsewhere[~batch.revealed] = torch.randn_like(elsewhere[~batch.revealed]) * 10
    assert transition_loss(elsewhere, batch.targets, batch.revealed).item() == pytest.approx(loss.item())
    inside = logits.clone()
    row, position = batch.revealed.nonzero()[0].tolist()
    inside[row, position] += torch.randn(50) * 10
    assert transition_loss(inside, batch.targets, batch.revealed).item() != pytest.approx(loss.item())
    assert batch.revealed.sum().item() == 3 + 4  # steps 1-2 of the first pair, 2-4 of the second; never the fill (step 0)


def test_training_prompts_are_distinct_and_never_held_out():
    examples = training_prompts(list(TASKS), 200, seed=0)
    by_task = {name: [e for e in examples if e.task == name] for name in TASKS}
    assert len(by_task["pairsum"]) == len(TASKS["pairsum"].sums("train")) == 165  # the split has fewer than asked
    assert len(by_task["rhyme"]) == len(TASKS["rhyme"].words("train"))
    assert len(by_task["add"]) == len(by_task["grammar"]) == 200
    assert len({e.prompt for e in examples}) == len(examples)
    assert not {e.answer for e in by_task["pairsum"]} & set(TASKS["pairsum"].sums("held_out"))
    assert not {e.prompt.split()[-2][:-1] for e in by_task["rhyme"]} & set(TASKS["rhyme"].words("held_out"))
    assert not any(TASKS["add"].is_held_out(*map(int, e.prompt[3:-5].split("+"))) for e in by_task["add"])


def test_the_train_stage_refuses_bad_settings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--pairs-per-batch", "0"])
    with pytest.raises(SystemExit):
        main(["train", "--min-gen", "64", "--max-gen", "32"])
    assert main(["train", "--trajectories", "/nonexistent/t.jsonl"]) == 2
    assert "collect writes it" in capsys.readouterr().err


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(), reason="assets/tiny-llada not trained yet")
def test_collect_train_eval_end_to_end_on_the_shipped_model(tmp_path, capsys):
    trajectories, out = tmp_path / "t.jsonl", tmp_path / "model"
    common = ["--threads", "1", "--gen-length", "64", "--block-length", "32"]
    assert main(["collect", "--out", str(trajectories), "--tasks", "add", "grammar", "--per-task", "8", "--settings", "thr 0.9", "fixed x4", *common]) == 0
    kept = load_trajectories(trajectories)
    assert {t.task for t in kept} == {"add", "grammar"} and any(t.n_steps >= 2 for t in kept)
    tokenizer = load_tokenizer(SHIPPED)
    for t in kept:  # only verified answers, and the stored canvas is the answer that was verified
        example = next(e for e in training_prompts(["add", "grammar"], 8, seed=0) if e.prompt == t.prompt)
        assert check_answer(example, t.answer)
        assert tokenizer.decode(t.final()[len(t.prompt_ids) :], skip_special_tokens=True) == t.answer

    tiny = ["--steps", "2", "--max-minutes", "0", "--eval-every", "2", "--eval-per-task", "1", "--warmup", "1", "--lr", "1e-3",
            "--tokens-per-batch", "0", "--batch-size", "4", "--pairs-per-batch", "4", "--min-gen", "40", "--max-gen", "40"]  # fmt: skip
    assert main(["train", "--trajectories", str(trajectories), "--out", str(out), "--run-dir", str(tmp_path / "run"),
                 "--tasks", "add", "grammar", "--threads", "1", *tiny]) == 0  # fmt: skip
    log = capsys.readouterr().out
    assert "pairs from trajectories of two or more steps: add" in log and "transition" in log
    assert json.loads(log.strip().splitlines()[-1])["steps"] == 2
    base, distilled = load_model(SHIPPED), load_model(out)
    assert distilled.config == base.config  # a drop-in checkpoint
    assert any(not torch.equal(p, distilled.state_dict()[k]) for k, p in base.state_dict().items())
    assert load_tokenizer(out).mask_token_id == tokenizer.mask_token_id

    assert main(["eval", "--distilled", str(out), "--tasks", "add", "--limit", "3", "--settings", "thr 0.9", "credit", *common]) == 0
    table = capsys.readouterr().out
    for name in ("base thr 0.9", "TD thr 0.9", "base credit", "TD credit", "TD against base"):
        assert name in table
    assert any(line.startswith("thr 0.9") and " add " in line for line in table.splitlines())


def test_a_tiny_run_without_the_shipped_model_changes_the_weights(tmp_path):
    """The train stage on trajectories of a tiny random model of the embedded vocabulary, from a
    fresh initialisation: the loop runs, the weights move, the folder loads."""
    from engine.models import LLaDAModelLM
    from tinymodel.distill import DistillConfig, distill
    from tinymodel.tokenizer import special_ids
    from tinymodel.train import init_weights, model_config

    ids = special_ids()
    random_model = tiny_llada(vocab_size=99, embedding_size=99, mask_token_id=ids["mask_token_id"], eos_token_id=ids["eos_token_id"])
    trace = run_diffusion(random_model, [[40, 41, 42], [43, 44]], GenerationConfig(gen_length=16, block_length=8, threshold=0.2), hooks=RunHooks(trace=True)).trace
    path = tmp_path / "t.jsonl"
    save_trajectories(path, _trajectories(trace))
    assert any(t.n_steps >= 2 for t in load_trajectories(path))
    cfg = DistillConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), trajectories=str(path), init_from="", tasks=("add",),
                        d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=32, steps=2, max_minutes=0.0, eval_every=2, eval_per_task=1,
                        tokens_per_batch=0, batch_size=2, pairs_per_batch=2, min_gen=24, max_gen=24, threads=1)  # fmt: skip
    assert distill(cfg, log=lambda _: None)["steps"] == 2
    start = LLaDAModelLM(model_config(cfg))
    init_weights(start, cfg.seed)
    trained = load_model(cfg.out).state_dict()
    assert trained.keys() == start.state_dict().keys()
    assert any(not torch.equal(p, trained[k]) for k, p in start.state_dict().items())


def test_the_train_stage_defaults_are_the_shipped_runs_settings():
    """`python -m tinymodel.distill train` with no flags repeats the run that made assets/tiny-llada-td
    (docs/distillation.md §5): its learning rate and the base model's last family mix, kept per family
    when --tasks picks some."""
    from tinymodel.distill import DistillConfig, build_parser
    from tinymodel.train import config_from_args, task_weights

    _, train_parser = build_parser()
    cfg = config_from_args(train_parser, vars(train_parser.parse_args([])), DistillConfig)
    assert cfg.lr == 2e-4 and cfg.max_minutes == 25.0
    assert task_weights(cfg) == [1.0, 1.5, 2.5, 0.5, 1.0] and list(cfg.tasks) == list(TASKS)
    picked = config_from_args(train_parser, vars(train_parser.parse_args(["--tasks", "pairsum", "rhyme"])), DistillConfig)
    assert task_weights(picked) == [2.5, 0.5]


DISTILLED = SHIPPED.parent / "tiny-llada-td"


@pytest.mark.skipif(not (DISTILLED / "model.safetensors").is_file() or not (SHIPPED / "model.safetensors").is_file(), reason="embedded models not shipped")
def test_the_shipped_distilled_model_is_a_drop_in_copy_of_the_base():
    base, distilled = load_model(SHIPPED), load_model(DISTILLED)
    assert distilled.config == base.config
    assert any(not torch.equal(p, distilled.state_dict()[k]) for k, p in base.state_dict().items())
    assert (DISTILLED / "tokenizer.json").read_bytes() == (SHIPPED / "tokenizer.json").read_bytes()
    from engine import Engine

    with Engine(str(DISTILLED)) as engine:  # answers a held-in-range prompt through the engine
        assert "19" in engine.generate("Q: 12+7=? A:", GenerationConfig(gen_length=32, block_length=32, threshold=0.9)).text
