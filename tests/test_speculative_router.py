"""The speculative kind's cost-aware router (`verify=router`; engine/kinds/speculative.py
`VerifyRouter`, docs/algorithms.md §10.4): S2D2's estimate and hysteresis as published; a draft of
one open position committed without a verify writes the block-length-1 tokens exactly; every
decision is in the trace with its estimate, and a skipped verify costs no forward."""

from __future__ import annotations

import math

import pytest
import torch

from engine import EngineError, GenerationConfig, RunHooks, Trace, run_diffusion
from engine.kinds import ModelTraits, fit
from engine.kinds.speculative import BY_SCORE, EXACT, NOTHING_CONFIDENT, VerifyRouter

from .moe_models import EOS, tiny_llada2
from .test_speculative import prompts


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_llada2(seed=3).eval()


def router(**options) -> VerifyRouter:
    return VerifyRouter(GenerationConfig(kind="speculative", kind_options={"verify": "router", **options}))


def peaked(entropy_of: list[float], vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Distributions over `vocab` tokens of the given normalised entropies (0: one-hot, 1: uniform), and their top-1 probabilities."""
    rows = []
    for h in entropy_of:
        lo, hi = 0.0, 60.0  # the logit gap of one token over the rest sets the entropy: bisect it
        for _ in range(80):
            gap = (lo + hi) / 2
            p = torch.softmax(torch.tensor([gap] + [0.0] * (vocab - 1), dtype=torch.float64), 0)
            lo, hi = (gap, hi) if float(-(p * p.log()).sum() / math.log(vocab)) > h else (lo, gap)
        rows.append(p)
    probs = torch.stack(rows)
    return probs, probs.max(-1).values


def test_the_estimate_is_s2d2s_and_the_hysteresis_holds_its_state():
    probs, top = peaked([0.0, 0.5, 0.2])
    alpha = [1.0, math.exp(-2 * 0.5), math.exp(-2 * 0.2)]
    assert top.tolist()[0] > 0.9 > top.tolist()[1]
    r = router(router_temperature=2.0, router_cost=1.0, router_confidence=0.9, router_on=1.0, router_gap=6.0)
    d = r.decide(probs, top, exact=False)
    expected = alpha[0] + alpha[0] * alpha[1] + alpha[0] * alpha[1] * alpha[2]
    assert d.expected == pytest.approx(expected, abs=1e-6) and d.confident == 1  # the run above 0.9 ends at the second
    assert d.score == pytest.approx(expected - 1.0, abs=1e-6) and d.why == BY_SCORE
    assert d.verify == (expected - 1.0 > 1.0) and not d.verify and r.on is False  # off: it needs more than τ_on
    r.on = True  # on: it stays on while the score is at least τ_off
    assert r.decide(probs, top, exact=False).verify and r.on
    sure, sure_top = peaked([0.0] * 8)
    d = router(router_cost=2.0, router_gap=4.0).decide(sure, sure_top, exact=False)
    assert (d.expected, d.confident, d.score, d.verify) == (pytest.approx(8.0), 8, pytest.approx(-8.0), False)
    unsure, unsure_top = peaked([0.9, 0.9])  # a skip would commit nothing: it verifies whatever the score
    d = router(router_cost=0.0, router_on=50.0).decide(unsure, unsure_top, exact=False)
    assert d.confident == 0 and d.verify and d.why == NOTHING_CONFIDENT
    held = router()
    d = held.decide(unsure[:1], unsure_top[:1], exact=True)
    assert d.why == EXACT and not d.verify and held.on is False  # an exact step leaves the state as it was


def test_its_settings_are_checked_in_one_line(model):
    for message, options in {
        r"router_gap must be in \[0, 200\]": {"router_gap": -1.0},
        r"router_confidence must be in \[0, 1\]": {"router_confidence": 1.5},
        "verify: 'sometimes' is not one of always, auto, router": {"verify": "sometimes"},
    }.items():
        with pytest.raises(EngineError, match=message) as caught:
            fit(GenerationConfig(kind="speculative", kind_options=options), ModelTraits.of(model))
        assert "\n" not in str(caught.value)


def run(model, prompt, **options):
    config = GenerationConfig(kind="speculative", gen_length=16, block_length=8, early_stop=False, kind_options=options)
    return run_diffusion(model, [prompt], config, stop_ids=[EOS], hooks=RunHooks(trace=True))


def test_a_skip_of_one_open_position_is_exact_and_costs_no_forward(model):
    """With τ_r 1 nothing is confident, so the router skips only drafts of one open position: the
    tokens are the block-length-1 decode's on every prompt, in fewer forwards than verify always."""
    exact = 0
    for prompt in prompts(12, seed=11):
        ar = run_diffusion(model, [prompt], GenerationConfig(gen_length=16, block_length=1, early_stop=False), stop_ids=[EOS])
        always, routed = run(model, prompt), run(model, prompt, verify="router", router_confidence=1.0)
        assert routed.token_ids == ar.token_ids == always.token_ids, prompt
        records = routed.trace.iterations
        assert routed.stats.nfe == sum(1 if rec.forward == "draft" else 2 for rec in records) == sum(rec.forwards for rec in records)
        for rec in records:
            decision, c = rec.state["router"][0], rec.state["open_from"][0]
            assert decision is not None and decision["verify"] == rec.state["verified"][0]
            if decision["why"] == EXACT:
                assert rec.block_range[1] - c == 1 and rec.forward == "draft" and rec.committed == [[c]]
                exact += 1
        assert routed.stats.nfe == always.stats.nfe - sum(r.state["router"][0]["why"] == EXACT for r in records)
    assert exact > 0


def test_a_skip_commits_the_confident_run_and_the_trace_keeps_every_decision(model):
    out = run(model, prompts(1, seed=5)[0], verify="router", router_confidence=0.0, router_cost=2.0)  # every draft is confident: skips
    trace = Trace.from_json(out.trace.to_json())  # validated by the kind's own rules on load
    skipped = [rec for rec in trace.iterations if not rec.state["verified"][0]]
    assert skipped and out.stats.to_dict()["skipped_verifies"] == len(skipped)
    for rec in skipped:
        decision, c, s = rec.state["router"][0], rec.state["open_from"][0], rec.block_range[0]
        assert rec.committed[0] == list(range(c, c + decision["confident"])) or decision["why"] == EXACT
        assert all(rec.top1[0][p - s] == rec.state["draft"][0][p - s] for p in rec.committed[0])
    assert trace.canvas_at(len(trace.iterations) - 1) == trace.final
    bad = Trace.from_json(out.trace.to_json()).to_dict()
    bad["iterations"][0]["state"]["router"] = [{"expected": 1.0}]
    with pytest.raises(EngineError, match="state.router must be null or a decision"):
        Trace.from_dict(bad)
    old = Trace.from_json(out.trace.to_json()).to_dict()  # a trace written before the router: no such field
    for rec in old["iterations"]:
        del rec["state"]["router"]
    assert len(Trace.from_dict(old).iterations) == len(trace.iterations)


@pytest.mark.parametrize("verify", ["always", "router"])
def test_an_adaptive_draft_window_follows_what_the_drafts_kept_and_keeps_the_tokens(model, verify):
    """`draft_window=adaptive` (docs/algorithms.md §10.5): each step drafts a window starting at its
    first open position, the block length first, doubled (up to `draft_most`) after a step that
    kept its whole draft, else what the step kept plus one (at least 2); where it verifies, the
    tokens stay the block-length-1 decode's (with τ_r 1 the router skips only exactly)."""
    options = {"draft_window": "adaptive", "draft_most": 16, "verify": verify, "router_confidence": 1.0}
    widths = set()
    for prompt in prompts(10, seed=13):
        ar = run_diffusion(model, [prompt], GenerationConfig(gen_length=32, block_length=1, early_stop=False), stop_ids=[EOS])
        config = GenerationConfig(kind="speculative", gen_length=32, block_length=4, early_stop=False, kind_options=options)
        out = run_diffusion(model, [prompt], config, stop_ids=[EOS], hooks=RunHooks(trace=True))
        assert out.token_ids == ar.token_ids, prompt
        records = Trace.from_json(out.trace.to_json()).iterations
        length, end = 4, out.trace.canvas_length
        for rec in records:
            s, e = rec.block_range
            assert s == rec.state["open_from"][0] and e == min(s + length, end)
            kept = rec.state["accepted"][0] if rec.state["verified"][0] else len(rec.committed[0])
            widths.add(e - s)
            length = min(2 * length, 16) if kept >= e - s else max(2, kept + 1)
        assert out.stats.nfe == sum(rec.forwards for rec in records)
    assert max(widths) > 4  # some drafts grew past the block
