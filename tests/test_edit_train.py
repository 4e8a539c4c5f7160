"""tinymodel/edit.py: LLaDA2.1's mixed objective (the corruption it trains on, the loss, the
command's train and eval stages)."""

from __future__ import annotations

import json

import pytest
import torch

from engine import load_model
from tinymodel.edit import EditLoss, EditTrainConfig, corrupt_visible, main, targets, train_edit
from tinymodel.eval import TaskScore
from tinymodel.tokenizer import special_ids
from tinymodel.train import Trainer

from .conftest import tiny_llada

TINY = dict(d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=32, steps=3, max_minutes=0.0, eval_every=3, eval_per_task=1,
            tokens_per_batch=0, batch_size=4, min_gen=24, max_gen=24, threads=1, init_from="", tasks=("add",), warmup=1)  # fmt: skip


def _corrupt(cfg: EditTrainConfig, seed: int = 0):
    ids = special_ids()
    model = tiny_llada(vocab_size=99, embedding_size=99, mask_token_id=ids["mask_token_id"], eos_token_id=ids["eos_token_id"])
    torch.manual_seed(seed)
    original = torch.randint(5, 90, (8, 30))
    visible = torch.rand(8, 30) < 0.6
    noisy = torch.where(visible, original, torch.full_like(original, ids["mask_token_id"]))
    vocabulary = torch.arange(3, 99)
    vocabulary = vocabulary[vocabulary != ids["mask_token_id"]]
    out = corrupt_visible(model, original, noisy, visible, cfg, ids["mask_token_id"], vocabulary, torch.Generator().manual_seed(seed))
    return original, noisy, visible, out


@pytest.mark.parametrize("plausible_share", [0.0, 0.5, 1.0])
def test_corruption_replaces_only_visible_tokens_and_always_with_a_wrong_one(plausible_share):
    original, noisy, visible, out = _corrupt(EditTrainConfig(corrupt_max=1.0, clean_share=0.0, plausible_share=plausible_share))
    changed = out != noisy
    assert changed.any() and not (changed & ~visible).any()  # masks and the rest untouched
    assert (out[changed] != original[changed]).all()  # a corruption is never the original
    assert (out[changed] != special_ids()["mask_token_id"]).all()


def test_no_corruption_at_share_zero():
    _, noisy, _, out = _corrupt(EditTrainConfig(corrupt_max=0.0))
    assert torch.equal(out, noisy)


def test_the_loss_covers_masked_and_visible_positions_and_a_tiny_run_trains(tmp_path):
    cfg = EditTrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), **TINY)
    trainer = Trainer(cfg, log=lambda _: None)
    loss = EditLoss(trainer)
    value = loss(trainer.model)
    assert value.requires_grad and loss.m2t > 0 and loss.t2t > 0
    summary = train_edit(cfg, log=lambda _: None)
    assert summary["steps"] == 3
    assert load_model(cfg.out).config["d_model"] == 32  # a loadable model folder


def test_resume_continues_the_run(tmp_path):
    cfg = EditTrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), **TINY)
    train_edit(cfg, log=lambda _: None)
    more = EditTrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), resume=True, **{**TINY, "steps": 6})
    lines: list[str] = []
    assert train_edit(more, log=lines.append)["steps"] == 6
    assert any("resumed from" in line and "at step 3" in line for line in lines)


def test_the_command_refuses_bad_settings_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--corrupt-max", "1.5"])
    assert "corrupt-max" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--limit", "0"])


def _score(correct: int, n: int, tpf: float) -> TaskScore:
    return TaskScore(n=n, correct=correct, tokens=int(tpf * 10 * n), nfe=10 * n, seconds=1.0)


def test_targets_read_the_rows():
    """The pair-sum target at the thresholds where the base loses 15 points, grammar in one block,
    arithmetic: met and missed, from hand-made rows."""
    from tinymodel.edit import EVAL_THRESHOLDS

    rows = []
    for t in EVAL_THRESHOLDS:
        base_pairsum = 85 if t >= 0.5 else 60  # loses 25 points from 0.3 on
        rows.append((f"base thr {t:g}", None, {"pairsum": _score(base_pairsum, 100, 1.0 + (0.9 - t)), "add": _score(100, 100, 1), "sub": _score(90, 100, 1), "grammar": _score(80, 100, 1)}))
        rows.append((f"edit edit {t:g}", None, {"pairsum": _score(82 if t == 0.3 else 40, 100, 1.5), "add": _score(99, 100, 1), "sub": _score(80, 100, 1), "grammar": _score(70, 100, 1)}))
        rows.append((f"edit edit {t:g}/64", None, {"grammar": _score(81 if t == 0.5 else 50, 100, 2)}))
    report = targets(rows).splitlines()
    assert report[0].startswith("pair-sum, first") and "(0.3)" in report[0] and report[0].endswith("met")
    assert report[1].startswith("pair-sum, most parallel") and "(0.05)" in report[1] and report[1].endswith("missed")
    assert "edit τ 0.5" in report[2] and report[2].endswith("met")
    assert report[3].startswith("add") and report[3].endswith("met") and report[4].startswith("sub") and report[4].endswith("missed")


@pytest.mark.parametrize("decoder, options", [("edit", {"edit_threshold": 0.5}), ("threshold", {})])
def test_eval_counts_a_batched_rows_forwards_as_its_solo_run(decoder, options):
    """tinymodel.eval's TPF does not depend on the batch: a row's forwards read off a batched trace
    (commits, revisions, the settling forward) equal its solo run's NFE; the base model edits a lot."""
    from engine import Engine, GenerationConfig, RunHooks
    from tinymodel.eval import per_row_commits

    engine = Engine("assets/tiny-llada")
    config = GenerationConfig(gen_length=64, block_length=32, decoder=decoder, threshold=0.3, decoder_options=options, use_chat_template=False)
    encoded = [engine.encode(p, False) for p in ("Q: ?+?=38 A:", "Q: 12+35=? A:", "Q: 7-3=? A:", "the slow")]
    out = engine.generate_ids(encoded, config, RunHooks(trace=True))
    assert [f for _, f in per_row_commits(out, engine.stop_ids, engine.model.mask_token_id)] == [engine.generate_ids([ids], config).stats.nfe for ids in encoded]
    if decoder == "edit":
        assert out.stats.edits > 0
