"""The EB-Sampler decoder (`entropy_bound`): it commits exactly what its rule says, on hand-made
logits and on every masked family's test model."""

from __future__ import annotations

import math

import pytest
import torch

from engine import RunHooks, run_diffusion
from engine.config import GenerationConfig
from engine.decoders import make_decoder
from engine.registry import decoder_class

from .conftest import fill_block, tiny_llada
from .moe_models import tiny_llada2, tiny_llada_moe

MASK_ID = 9


def logits_with_entropies(distributions: list[list[float]]) -> torch.Tensor:
    """`[1, W, 10]` logits whose softmax over the real tokens is each given distribution (the
    [MASK] id, 9, gets any value: the decoder excludes it)."""
    rows = []
    for probs in distributions:
        padded = probs + [0.0] * (9 - len(probs))
        rows.append([math.log(p) if p > 0 else -1e9 for p in padded] + [5.0])
    return torch.tensor([rows])


def entropy_of(probs: list[float]) -> float:
    return -sum(p * math.log(p) for p in probs if p > 0)


DISTRIBUTIONS = [
    [0.5, 0.5],  # H = 0.693
    [0.97, 0.03],  # H = 0.135
    [0.25, 0.25, 0.25, 0.25],  # H = 1.386
    [0.999, 0.001],  # H = 0.008
    [0.9, 0.1],  # H = 0.325
    [0.6, 0.4],  # H = 0.673
]


def expected_commits(masked: list[bool], bound: float) -> set[int]:
    """The rule by hand: masked positions by entropy ascending; take each while the entropies of
    those taken before it sum to <= bound."""
    order = sorted((entropy_of(DISTRIBUTIONS[j]), j) for j in range(len(masked)) if masked[j])
    taken, before = set(), 0.0
    for h, j in order:
        if before > bound:
            break
        taken.add(j)
        before += h
    return taken


@pytest.mark.parametrize("bound", [0.0, 0.1, 0.15, 0.5, 1.2, 100.0])
@pytest.mark.parametrize("masked", [[True] * 6, [True, False, True, False, True, True], [False, False, True, False, False, False]])
def test_commits_exactly_what_the_rule_says(bound, masked):
    config = GenerationConfig(decoder="entropy_bound", decoder_options={"entropy_bound": bound})
    decoder = make_decoder(config, MASK_ID)
    result = decoder.step(logits_with_entropies(DISTRIBUTIONS), fill_block(torch.tensor([masked]), 0.9, MASK_ID))
    committed = set(result.commit[0].nonzero().flatten().tolist())
    assert committed == expected_commits(masked, bound)
    assert committed and not result.forced.any()  # at least one, by the rule itself
    assert result.tokens[0].tolist() == [0] * 6  # the most probable real token, never [MASK]
    for j, is_masked in enumerate(masked):
        h = result.extras["entropy"][0, j].item()
        assert h == pytest.approx(entropy_of(DISTRIBUTIONS[j]) if is_masked else 0.0, abs=1e-5)


def test_no_mask_no_commit():
    decoder = make_decoder(GenerationConfig(decoder="entropy_bound"), MASK_ID)
    result = decoder.step(logits_with_entropies(DISTRIBUTIONS), fill_block(torch.zeros(1, 6, dtype=torch.bool), 0.9, MASK_ID))
    assert not result.commit.any()


def test_declared_for_the_cli_the_app_and_the_sweep():
    from dinfer_viz.settings import numeric_fields, sweep_setting
    from dinfer_viz.studies.sweep_study import sweep_configs

    cls = decoder_class("entropy_bound")
    assert "entropy_bound" in cls.options and cls.row_wise
    assert sweep_setting("entropy_bound") in numeric_fields()  # the sweep's menu offers its knob
    configs = sweep_configs(GenerationConfig(decoder="entropy_bound"), sweep_setting("entropy_bound"), [0.05, 0.5])
    assert [c.decoder_options["entropy_bound"] for c in configs] == [0.05, 0.5]
    assert not cls.uses_threshold and cls.explanation
    with pytest.raises(Exception, match="must be a finite number"):
        GenerationConfig(decoder="entropy_bound", decoder_options={"entropy_bound": "wide"}).validate()


MODELS = {"llada": tiny_llada, "llada-moe": tiny_llada_moe, "llada2": tiny_llada2}


def check_record_follows_rule(rec, masked_before: list[int], bound: float) -> None:
    """The committed positions are the lowest-entropy masked ones, and the rule stopped where it
    must (entropies in the record are rounded to 4 decimals: a small tolerance)."""
    s = rec.block_range[0]
    entropy = {p: rec.extras["entropy"][0][p - s] for p in masked_before}
    committed = sorted(rec.committed[0], key=lambda p: entropy[p])
    rest = sorted((p for p in masked_before if p not in rec.committed[0]), key=lambda p: entropy[p])
    assert committed, "every iteration commits at least one"
    if rest:
        assert entropy[committed[-1]] <= entropy[rest[0]] + 1e-3
        assert sum(entropy[p] for p in committed) > bound - 1e-3  # the next one would have crossed it
    assert sum(entropy[p] for p in committed[:-1]) <= bound + 1e-3


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("bound", [0.0, 4.0, 8.0, 1e6])
def test_runs_by_its_rule_on_every_masked_family(family, bound):
    model = MODELS[family]()
    config = GenerationConfig(decoder="entropy_bound", gen_length=16, block_length=8, early_stop=False, decoder_options={"entropy_bound": bound})
    prompt = [[3, 5, 7, 11, 13]]
    out = run_diffusion(model, prompt, config, stop_ids=[model.eos_token_id], hooks=RunHooks(trace=True))
    canvas = out.trace.initial[0][:]
    for rec in out.trace.iterations:
        s, e = rec.block_range
        masked_before = [p for p in range(s, e) if canvas[p] == model.mask_token_id]
        check_record_follows_rule(rec, masked_before, bound)
        for p in rec.committed[0]:
            canvas[p] = rec.top1[0][p - s]
    assert model.mask_token_id not in out.canvas[0].tolist()
    commits = [len(rec.committed[0]) for rec in out.trace.iterations]
    if bound == 0.0:  # one at a time (no two random predictions share an entropy)
        assert commits == [1] * 16
    if 0.0 < bound < 1e6:  # the bounds were chosen for these models' entropies: the rule took several at once
        assert max(commits) > 1
    if bound == 1e6:  # every mask of a block in its first iteration
        assert all(c == len([p for p in range(*rec.block_range) if out.trace.initial[0][p] == model.mask_token_id]) for c, rec in zip(commits, out.trace.iterations))
