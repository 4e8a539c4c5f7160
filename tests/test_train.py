"""Training the embedded model: batches, masking, schedule, a few steps that lower the loss, resume."""

import json

import pytest
import torch

from engine import load_model, load_tokenizer
from engine.models import LLaDAModelLM
from tinymodel.tasks import TASKS, get_task
from tinymodel.tokenizer import build_tokenizer, special_ids
from tinymodel.train import (
    RESUME_FILE,
    TrainConfig,
    diffusion_loss,
    init_weights,
    learning_rate,
    make_batch,
    mask_responses,
    model_config,
    parse_args,
    schedule_progress,
    train,
)

IDS = special_ids()
TINY = dict(d_model=32, n_layers=2, n_heads=2, mlp_hidden_size=64, batch_size=16, tokens_per_batch=0, min_gen=40, max_gen=48, eval_per_task=3, threads=1)
UNTIMED = dict(TINY, max_minutes=0.0)  # steps only, not the recipe's time budget


def test_make_batch_pads_responses_with_eos_and_marks_the_prompt():
    examples = [get_task("add").example(48, 57), get_task("sub").example(100, 99)]
    ids, response = make_batch(examples, build_tokenizer(), 24, IDS["eos_token_id"])
    assert ids.shape == response.shape == (2, 14 + 24)  # the longer prompt sets the width
    tok = build_tokenizer()
    assert tok.decode(ids[0, :13].tolist()) == "Q: 48+57=? A:"
    assert tok.decode(ids[0, 13:26].tolist()) == "  48+ 57= 105"
    assert (ids[0, 26:] == IDS["eos_token_id"]).all()
    # a shorter prompt gets a longer response region, as the engine's canvas gives it
    assert not response[0, :13].any() and response[0, 13:].all()
    assert not response[1, :14].any() and response[1, 14:].all()


def test_a_batch_whose_longest_response_leaves_no_room_for_an_eos_gets_a_wider_canvas():
    # the example a training run crashed on at step 740 with --min-gen 36: 36 characters of response
    example = get_task("grammar").example("one grey bridge followed every hungry table".split(), 2)
    ids, response = make_batch([example], build_tokenizer(), 36, IDS["eos_token_id"])
    assert ids.shape == (1, 8 + 37) and ids[0, -1] == IDS["eos_token_id"] and response[0, 8:].all()



    ids = torch.randint(3, 90, (400, 60))
    response = torch.zeros_like(ids, dtype=torch.bool)
    response[:, 20:] = True
    noisy, masked, p_mask = mask_responses(ids, response, IDS["mask_token_id"], 1e-3, torch.Generator().manual_seed(0))
    assert not masked[:, :20].any()
    assert torch.equal(noisy[:, :20], ids[:, :20])
    assert (noisy[masked] == IDS["mask_token_id"]).all() and torch.equal(noisy[~masked], ids[~masked])
    # the masked fraction of each row's response tracks that row's t
    fraction = masked[:, 20:].float().mean(dim=1)
    assert torch.corrcoef(torch.stack([fraction, p_mask[:, 0]]))[0, 1] > 0.95


def test_learning_rate_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(lr=1e-3, warmup=10, steps=100, min_lr_ratio=0.1)
    assert learning_rate(cfg, 0, 0.0) == pytest.approx(1e-4)
    assert learning_rate(cfg, 9, 0.0) == pytest.approx(1e-3)
    assert learning_rate(cfg, 50, 0.5) == pytest.approx(0.55e-3)
    assert learning_rate(cfg, 99, 1.0) == pytest.approx(1e-4)


def test_progress_follows_steps_or_the_time_budget_whichever_is_further():
    assert schedule_progress(TrainConfig(steps=100, max_minutes=0.0), 25, minutes=99.0) == 0.25  # no budget: steps only
    budget = TrainConfig(steps=100, max_minutes=10.0)
    assert schedule_progress(budget, 25, minutes=5.0) == 0.5
    assert schedule_progress(budget, 75, minutes=5.0) == 0.75
    assert schedule_progress(budget, 10, minutes=12.0) == 1.0


def test_time_budget_stops_the_run(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), steps=10_000, max_minutes=0.02, eval_every=10_000, **TINY)
    summary = train(cfg, log=lambda _: None)
    assert 0 < summary["steps"] < 10_000
    assert (tmp_path / "m" / "model.safetensors").is_file()  # the final save happens on a time stop too


def test_config_json_uses_llada_field_names():
    cfg = model_config(TrainConfig())
    assert cfg["model_type"] == "llada" and cfg["architectures"] == ["LLaDAModelLM"]
    assert cfg["vocab_size"] == build_tokenizer().get_vocab_size()
    assert {k: cfg[k] for k in IDS} == IDS


def _fixed_batch_loss(model) -> float:
    examples = [get_task("add").example(a, 31) for a in range(20, 36)]
    ids, response = make_batch(examples, build_tokenizer(), 40, IDS["eos_token_id"])
    with torch.no_grad():
        return diffusion_loss(model, ids, response, IDS["mask_token_id"], 1e-3, torch.Generator().manual_seed(0)).item()


def test_a_few_steps_lower_the_loss_and_write_a_loadable_folder(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "model"), run_dir=str(tmp_path / "run"), steps=30, warmup=5, lr=1e-2, eval_every=30, **UNTIMED)
    start = LLaDAModelLM(model_config(cfg))
    init_weights(start, cfg.seed)
    summary = train(cfg, log=lambda _: None)
    trained = load_model(cfg.out)
    assert _fixed_batch_loss(trained) < 0.7 * _fixed_batch_loss(start)
    assert {name.split()[0] for name in summary["held_out_accuracy"]} == set(TASKS)
    assert load_tokenizer(cfg.out).mask_token_id == IDS["mask_token_id"]
    assert (tmp_path / "run" / RESUME_FILE).is_file()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 30


def test_resume_continues_from_the_saved_step(tmp_path):
    common = dict(out=str(tmp_path / "model"), run_dir=str(tmp_path / "run"), eval_every=4, **UNTIMED)
    train(TrainConfig(steps=4, **common), log=lambda _: None)
    logs: list[str] = []
    train(TrainConfig(steps=8, resume=True, **common), log=logs.append)
    assert any("resumed" in line and "step 4" in line for line in logs)
    assert any(line.startswith("step 8 ") for line in logs)
    assert not any(line.startswith("step 4 ") for line in logs)


def test_resume_without_a_checkpoint_is_an_engine_error(tmp_path):
    from engine import EngineError

    with pytest.raises(EngineError, match="resume"):
        train(TrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), steps=2, resume=True, **UNTIMED), log=lambda _: None)


def test_cli_rejects_bad_lengths():
    with pytest.raises(SystemExit):
        parse_args(["--min-gen", "64", "--max-gen", "32"])
    assert parse_args(["--steps", "7", "--tasks", "add"]).tasks == ("add",)


def test_default_task_weights_follow_the_chosen_families():
    from tinymodel.train import DEFAULT_TASK_WEIGHTS, task_weights

    assert task_weights(parse_args([])) == [DEFAULT_TASK_WEIGHTS[name] for name in TASKS]
    assert task_weights(parse_args(["--tasks", "sub", "rhyme"])) == [DEFAULT_TASK_WEIGHTS["sub"], DEFAULT_TASK_WEIGHTS["rhyme"]]


def test_token_budget_batches_hold_more_examples_on_short_canvases():
    from tinymodel.train import batch_size

    fixed = TrainConfig(batch_size=48, tokens_per_batch=0)
    assert batch_size(fixed, 32) == batch_size(fixed, 128) == 48
    budget = TrainConfig(batch_size=48, tokens_per_batch=8000)
    assert batch_size(budget, 32) == 8000 // (16 + 32) == 166
    assert batch_size(budget, 128) == 55
    assert batch_size(TrainConfig(batch_size=48, tokens_per_batch=100), 128) == 16  # the floor


def test_task_weights_set_the_family_mix():
    from tinymodel.tasks import ExampleSampler

    only_sub = ExampleSampler(["add", "sub"], seed=0, weights=[0.0, 1.0]).batch(200)
    assert {e.task for e in only_sub} == {"sub"}
    mixed = ExampleSampler(["add", "sub"], seed=0, weights=[1.0, 3.0]).batch(4000)
    assert sum(e.task == "sub" for e in mixed) / 4000 == pytest.approx(0.75, abs=0.03)
    uniform = ExampleSampler(["add", "sub"], seed=0).batch(4000)
    assert sum(e.task == "sub" for e in uniform) / 4000 == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize("weights", [[1.0], [0.0, 0.0], [1.0, -1.0]])
def test_bad_task_weights_are_refused(weights):
    from engine import EngineError
    from tinymodel.tasks import ExampleSampler

    with pytest.raises(EngineError, match="one non-negative weight per task"):
        ExampleSampler(["add", "sub"], seed=0, weights=weights)
    with pytest.raises(SystemExit):
        parse_args(["--tasks", "add", "sub", "--task-weights", *map(str, weights)])


def test_init_from_starts_from_the_saved_weights(tmp_path):
    from tinymodel.train import warm_start

    first = TrainConfig(out=str(tmp_path / "first"), run_dir=str(tmp_path / "r1"), steps=10, warmup=1, lr=1e-2, eval_every=10, **UNTIMED)
    train(first, log=lambda _: None)
    saved = load_model(first.out).state_dict()
    fresh = LLaDAModelLM(model_config(first))
    init_weights(fresh, seed=1)
    warm_start(fresh, first.out)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    # a continued run (one step at a negligible learning rate) ends next to the weights it started from,
    # far from the same seed's fresh initialisation
    logs: list[str] = []
    cont = TrainConfig(out=str(tmp_path / "cont"), run_dir=str(tmp_path / "r2"), steps=1, lr=1e-7, eval_every=1, init_from=first.out, **UNTIMED)
    train(cont, log=logs.append)
    assert any(line == f"weights from {first.out}" for line in logs)
    continued = load_model(cont.out).state_dict()
    initial = LLaDAModelLM(model_config(first))
    init_weights(initial, first.seed)
    name = "model.transformer.wte.weight"
    assert (continued[name] - saved[name]).abs().max() < 1e-4 < (saved[name] - initial.state_dict()[name]).abs().max()


def test_init_from_a_different_architecture_names_the_flags(tmp_path):
    from engine import EngineError

    folder = tmp_path / "m"
    train(TrainConfig(out=str(folder), run_dir=str(tmp_path / "r"), steps=1, eval_every=1, **UNTIMED), log=lambda _: None)
    wider = dict(UNTIMED, d_model=64)
    with pytest.raises(EngineError, match="architecture flags"):
        train(TrainConfig(out=str(tmp_path / "o"), run_dir=str(tmp_path / "r2"), steps=1, init_from=str(folder), **wider), log=lambda _: None)


def test_training_on_an_explicit_device_writes_a_cpu_loadable_folder(tmp_path):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = TrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), steps=2, eval_every=2, device=device, **UNTIMED)
    summary = train(cfg, log=lambda _: None)
    assert summary["steps"] == 2
    assert load_model(cfg.out).device.type == "cpu"
    assert parse_args(["--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        parse_args(["--device", "nonsense"])


def test_the_default_output_is_not_the_shipped_model():
    assert "assets" not in parse_args([]).out


def test_the_average_moves_each_weight_a_decay_step_towards_the_model():
    from tinymodel.train import average_decay, update_average

    model, average = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = average.weight.detach().clone()
    update_average(average, model, 0.75)
    assert torch.allclose(average.weight, 0.75 * before + 0.25 * model.weight)
    # early updates follow the weights more closely; later ones use the decay asked for
    assert average_decay(0.999, 0) == pytest.approx(0.1) and average_decay(0.999, 10**6) == 0.999


def test_a_run_with_an_average_writes_scores_and_resumes_the_average(tmp_path):
    from tinymodel.train import average_decay

    common = dict(out=str(tmp_path / "model"), run_dir=str(tmp_path / "run"), warmup=1, lr=1e-2, ema_decay=0.9, eval_every=6, **UNTIMED)
    logs: list[str] = []
    train(TrainConfig(steps=6, **common), log=logs.append)
    state = torch.load(tmp_path / "run" / RESUME_FILE, weights_only=True)
    written = load_model(common["out"]).state_dict()
    name = "model.transformer.wte.weight"
    assert torch.equal(written[name], state["averaged"][name])  # the folder holds the average ...
    assert not torch.equal(written[name], state["model"][name])  # ... not the weights as stepped
    assert any(line.startswith("step 6 weights as stepped") for line in logs)
    # resumed at a negligible learning rate, the average goes on from the saved one, not the raw weights
    train(TrainConfig(**{**common, "steps": 7, "lr": 1e-9, "eval_every": 1, "resume": True}), log=lambda _: None)
    resumed = load_model(common["out"]).state_dict()[name]
    expected = state["averaged"][name].lerp(state["model"][name], 1 - average_decay(0.9, 6))
    assert torch.allclose(resumed, expected, atol=1e-6)


def test_cli_rejects_an_average_decay_outside_0_1():
    with pytest.raises(SystemExit):
        parse_args(["--ema-decay", "1"])
