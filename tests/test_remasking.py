"""Decoders that remask their commits (engine/decoders/remasking.py): ReMDM's scheduled, seeded remasking and
WINO's wide-in / narrow-out rule with its leave-one-out shadow forward (the model change it needs:
an index-tensor `replace` without a past gives the query tokens' positions, models/layers.py)."""

from __future__ import annotations

import math

import pytest
import torch

from engine import EngineError, GenerationConfig, RunHooks, Trace, run_diffusion
from engine.decoders import Block, apply_decode, make_decoder
from engine.decoders.remasking import (
    REMDM_CONF_RULE,
    REMDM_RULE,
    WINO_RULE,
    RemdmDecoder,
    WinoDecoder,
    committed_after,
    remdm_sigma_max,
    wide_in_narrow_out,
)
from engine.decoders.shadow import check_shadow_support, shadow_attention_mask, shadow_forward

from .conftest import tiny_llada
from .moe_models import tiny_llada2, tiny_llada_moe
from .scripted import EOS, MASK, VOCAB, ScriptedLM

PROMPT = [1, 2, 3, 4]


def p_of(strength: float) -> float:
    """The probability of a scripted token with logit `strength` (the others 0, [MASK] excluded)."""
    return math.exp(strength) / (math.exp(strength) + VOCAB - 2)


def remdm_config(schedule: str = "cap", eta: float = 1.0, **changes) -> GenerationConfig:
    settings = dict(gen_length=4, block_length=4, steps=4, decoder="remdm", seed=7, early_stop=False)
    return GenerationConfig(**{**settings, **changes, "decoder_options": {"remdm_schedule": schedule, "remdm_eta": eta}})


def draws(seed: int, steps: int, width: int) -> list[torch.Tensor]:
    """The uniform draws the run's generator gives ReMDM, one `[1, width]` per step (greedy
    decoding draws nothing else from it)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.rand((1, width), generator=generator)[0] for _ in range(steps)]


# ---- ReMDM: the schedule's numbers -------------------------------------------------------------

def test_sigma_max_follows_the_linear_schedule_and_is_zero_at_the_last_step():
    # steps 4: alpha_t = i/4, alpha_s = (i+1)/4; (1 - alpha_s) / alpha_t = inf, 2, 0.5, then the last
    assert [remdm_sigma_max(i, 4) for i in range(5)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert remdm_sigma_max(1, 8) == 1.0 and remdm_sigma_max(5, 8) == pytest.approx((1 - 6 / 8) / (5 / 8))


def test_the_commit_schedule_is_the_fixed_decoders():
    n = torch.tensor([10, 3, 0])
    # 10 masks over 4 steps: 3, 3, 2, 2; 3 masks: 1, 1, 1, 0
    assert [committed_after(n, i, 4).tolist() for i in range(4)] == [[3, 1, 0], [6, 2, 0], [8, 3, 0], [10, 3, 0]]


# ---- ReMDM on a scripted model: exactly what the rule says ------------------------------------

STRENGTH = [0.0] * 4 + [9.0, 7.0, 5.0, 3.0]  # position 4 the most confident, then 5, 6, 7
SCRIPT = PROMPT + [5, 6, 7, EOS]


@pytest.mark.parametrize("schedule", ["cap", "rescale"])
def test_remdm_remasks_where_the_draw_falls_below_sigma_and_refills_on_schedule(schedule):
    eta = 0.6
    out = run_diffusion(ScriptedLM(SCRIPT, STRENGTH), [PROMPT], remdm_config(schedule, eta), stop_ids=[EOS], hooks=RunHooks(trace=True))
    u = draws(7, 4, 4)
    sigma = [min(eta, remdm_sigma_max(i, 4)) if schedule == "cap" else eta * remdm_sigma_max(i, 4) for i in range(4)]
    records = out.trace.iterations
    assert len(records) == 4 == out.stats.nfe  # exactly steps / blocks iterations
    committed: set[int] = set()
    for i, rec in enumerate(records):
        expected = sorted(p for p in committed if u[i][p - 4] < sigma[i])
        assert [r["position"] for r in rec.revisions[0]] == expected
        for r in rec.revisions[0]:
            assert (r["kind"], r["rule"], r["old"], r["new"]) == ("remask", REMDM_RULE, SCRIPT[r["position"]], MASK)
            assert r["score"] == round(float(u[i][r["position"] - 4]), 4) and r["bound"] == pytest.approx(sigma[i])
        masks_before = 4 - len(committed)
        # the most confident masks fill the block back to the schedule's count (4 - (i + 1) masks)
        take = min(masks_before, masks_before - (4 - (i + 1)) + len(expected))
        free = sorted(set(range(4, 8)) - committed)
        assert rec.committed[0] == sorted(free[:take])
        committed = (committed - set(expected)) | set(free[:take])
    assert not records[-1].revisions[0] and out.token_ids == [[5, 6, 7]]
    assert any(rec.revisions[0] for rec in records)  # eta 0.6 with this seed: the case has remasks


def test_remdm_conf_shares_sigma_max_by_low_confidence_at_commit():
    out = run_diffusion(ScriptedLM(SCRIPT, STRENGTH), [PROMPT], remdm_config("conf", steps=4), stop_ids=[EOS], hooks=RunHooks(trace=True))
    u = draws(7, 4, 4)
    p = {4 + j: p_of(s) for j, s in enumerate(STRENGTH[4:])}
    committed: set[int] = set()
    for i, rec in enumerate(out.trace.iterations):
        share = torch.softmax(torch.tensor([-p[q] for q in sorted(committed)], dtype=torch.float32), dim=0) if committed else torch.zeros(0)
        shares = dict(zip(sorted(committed), share.tolist()))
        expected = sorted(q for q in committed if u[i][q - 4] < remdm_sigma_max(i, 4) * shares[q])
        assert [r["position"] for r in rec.revisions[0]] == expected
        for r in rec.revisions[0]:
            assert r["rule"] == REMDM_CONF_RULE and r["bound"] == remdm_sigma_max(i, 4)
            assert r["score"] == pytest.approx(float(u[i][r["position"] - 4]) / shares[r["position"]], abs=1e-4)
        committed = (committed - set(expected)) | set(rec.committed[0])
    extras = out.trace.iterations[1].extras["remask_probability"][0]
    assert extras[0] == pytest.approx(remdm_sigma_max(1, 4))  # one token committed: it has all of sigma_max


def test_remdm_blocks_end_on_schedule_at_the_most_remasking_eta():
    """eta 1: every committed token goes back while the bound allows; each block still takes
    exactly its steps, the last remasks nothing and leaves no mask."""
    model = tiny_llada()
    for schedule in ("cap", "rescale", "conf"):
        config = remdm_config(schedule, 1.0, gen_length=16, block_length=8, steps=8)
        out = run_diffusion(model, [list(range(1, 9))], config, hooks=RunHooks(trace=True))  # blocks [8, 16), [16, 24)
        assert out.stats.nfe == 8 and model.mask_token_id not in out.canvas.tolist()[0]
        by_block = [[r for r in out.trace.iterations if r.block == b] for b in (0, 1)]
        assert [len(b) for b in by_block] == [4, 4]
        assert all(not b[-1].revisions[0] for b in by_block)
        trace = Trace.from_json(out.trace.to_json())  # remasks survive the file and its checks
        assert trace.canvas_at(len(trace.iterations) - 1) == trace.final == out.canvas.tolist()
        for i, rec in enumerate(trace.iterations):  # a remasked position is [MASK] after its record
            canvas = trace.canvas_at(i)[0]
            assert all(canvas[r["position"]] == model.mask_token_id for r in rec.revisions[0])


def test_remdm_at_eta_zero_is_the_fixed_decoder():
    model = tiny_llada()
    prompts = [list(range(1, 9)), [5, 6, 7]]
    for steps in (16, 8, 4):
        fixed = GenerationConfig(gen_length=16, block_length=8, steps=steps, decoder="fixed", early_stop=False)
        remdm = remdm_config("cap", 0.0, gen_length=16, block_length=8, steps=steps)
        assert run_diffusion(model, prompts, remdm).token_ids == run_diffusion(model, prompts, fixed).token_ids


def test_remdm_is_seeded():
    model = tiny_llada()
    config = remdm_config("cap", 0.5, gen_length=16, block_length=8, steps=8)

    def remasks(seed: int) -> list:
        out = run_diffusion(model, [[5, 6, 7]], config.replace(seed=seed), hooks=RunHooks(trace=True))
        return [out.token_ids, [r.revisions for r in out.trace.iterations]]

    first = remasks(1)
    assert remasks(1) == first
    assert remasks(2) != first  # another seed, other draws


def test_remdm_with_the_block_causal_prefix_cache_gives_the_uncached_run():
    """A remask is inside the current block, which every forward computes fresh; the store keeps
    the block only once final (the cache manager's `revised`)."""
    model = tiny_llada2()
    config = remdm_config("cap", 0.5, gen_length=16, block_length=4, steps=16)
    plain = run_diffusion(model, [[5, 6, 7]], config.replace(cache="none"), hooks=RunHooks(trace=True))
    cached = run_diffusion(model, [[5, 6, 7]], config.replace(cache="prefix"), hooks=RunHooks(trace=True))
    assert cached.token_ids == plain.token_ids
    assert [r.revisions for r in cached.trace.iterations] == [r.revisions for r in plain.trace.iterations]
    assert any(r.revisions[0] for r in plain.trace.iterations)


def test_remdm_refuses_bad_settings_in_one_line():
    with pytest.raises(EngineError, match=r"remdm_eta must be in \[0, 1\], got 1.5") as err:  # with the config, before any worker or weight
        remdm_config(eta=1.5).validate()
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="remdm_schedule: 'loop' is not one of cap, rescale, conf"):
        remdm_config("loop").validate()
    assert not RemdmDecoder.row_wise and RemdmDecoder.revises


# ---- WINO: the rule on hand-made numbers -------------------------------------------------------

def test_wide_in_takes_the_masks_above_the_threshold_within_the_published_caps():
    def wide_in(confidence: list[float], threshold: float = 0.6) -> tuple[list[int], list[int]]:
        conf = torch.tensor([confidence])
        masked = torch.ones_like(conf, dtype=torch.bool)
        commit, forced, _ = wide_in_narrow_out(conf, masked, torch.zeros_like(conf), ~masked, threshold, 0.9)
        return commit[0].nonzero().flatten().tolist(), forced[0].nonzero().flatten().tolist()

    assert wide_in([0.5, 0.7, 0.6, 0.9]) == ([1, 3], [])  # strictly above
    assert wide_in([0.5, 0.2, 0.4]) == ([0], [0])  # none above: the most confident, forced
    # 30 masks all above: the cap is clamp(int(0.7 * 30), 5, 20) = 20, the most confident
    conf = [0.95 - 0.01 * j for j in range(30)]
    assert wide_in(conf) == (list(range(20)), [])
    # 8 masks all above: int(5.6) = 5; 3 masks: the cap 5 exceeds them, all 3 go
    assert wide_in([0.99] * 8) == ([0, 1, 2, 3, 4], [])
    assert wide_in([0.99] * 3) == ([0, 1, 2], [])


def test_narrow_out_remasks_the_doubted_tokens_fewer_than_it_commits():
    def narrow_out(n_commit: int, loo: list[float]) -> list[int]:
        w = len(loo)
        masked = torch.zeros(1, w + n_commit, dtype=torch.bool)
        masked[0, w:] = True
        conf = torch.where(masked, 0.99, 0.0)
        loo_t = torch.tensor([loo + [0.0] * n_commit])
        commit, _, remask = wide_in_narrow_out(conf, masked, loo_t, ~masked, 0.6, 0.9)
        assert int(commit.sum()) == n_commit
        return remask[0].nonzero().flatten().tolist()

    doubted = [0.5, 0.95, 0.2, 0.9, 0.85, 0.3]  # below 0.9: positions 0, 2, 4, 5 (0.9 itself stays)
    assert narrow_out(5, doubted) == [0, 2, 4, 5]  # room for 4
    assert narrow_out(3, doubted) == [2, 5]  # room for 2: the two lowest
    assert narrow_out(1, doubted) == []  # one commit: nothing may go back


# ---- WINO's shadow forward ---------------------------------------------------------------------

def test_shadow_attention_mask_is_leave_one_out_and_unseen():
    mask = shadow_attention_mask(5, 2, 4, torch.device("cpu")).int().tolist()
    assert mask == [
        [1, 1, 1, 1, 1, 0, 0],  # the canvas sees the canvas only
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 1, 1],  # shadow 0 (position 2): all but real 2, and the shadow block
        [1, 1, 1, 0, 1, 1, 1],  # shadow 1 (position 3): all but real 3
    ]


def _canvas(model, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.mask_token_id, (2, 12), generator=generator)
    ids[:, 7:10] = model.mask_token_id  # the block [4, 10) part decoded, part masked
    return ids


@pytest.mark.parametrize("family", [tiny_llada, tiny_llada_moe])
def test_nothing_attends_to_the_shadow(family):
    model = family().double()
    ids = _canvas(model)
    out = shadow_forward(model, {"input_ids": ids}, 4, 10)
    shadow = out.shadow_logits
    assert shadow.shape == (2, 6, out.logits.shape[-1])
    torch.testing.assert_close(out.logits, model(input_ids=ids).logits, rtol=0, atol=1e-10)
    embeds = model.embed(ids)  # the smoothing loop's input form gives the same forward
    out_e = shadow_forward(model, {"inputs_embeds": embeds}, 4, 10)
    shadow_e = out_e.shadow_logits
    torch.testing.assert_close(shadow_e, shadow, rtol=0, atol=1e-10)


def test_a_shadow_position_never_reads_its_own_real_token():
    """In one layer, shadow j's attention is its whole input: changing the real token at s + j
    leaves shadow j's logits as they were and moves every other shadow position's."""
    model = tiny_llada(n_layers=1).double()
    ids = _canvas(model)
    before = shadow_forward(model, {"input_ids": ids}, 4, 10).shadow_logits
    changed = ids.clone()
    changed[:, 5] = (ids[:, 5] + 1) % model.mask_token_id
    after = shadow_forward(model, {"input_ids": changed}, 4, 10).shadow_logits
    torch.testing.assert_close(after[:, 1], before[:, 1], rtol=0, atol=1e-10)
    others = [j for j in range(6) if j != 1]
    assert (after[:, others] - before[:, others]).abs().amax(dim=-1).min() > 1e-6


def test_a_one_position_shadow_is_the_forward_with_that_position_masked():
    """The exact leave-one-out: with a block of one and one layer, the shadow sees what the masked
    position of a real forward sees (the canvas less its token, and a [MASK] at its position).
    Deeper, the other positions still read the real token, as in the authors' construction."""
    model = tiny_llada(n_layers=1).double()
    ids = _canvas(model)
    shadow = shadow_forward(model, {"input_ids": ids}, 5, 6).shadow_logits
    masked = ids.clone()
    masked[:, 5] = model.mask_token_id
    torch.testing.assert_close(shadow[:, 0], model(input_ids=masked).logits[:, 5], rtol=0, atol=1e-10)
    deep = tiny_llada(n_layers=2).double()
    shadow = shadow_forward(deep, {"input_ids": ids}, 5, 6).shadow_logits
    assert not torch.allclose(shadow[:, 0], deep(input_ids=masked).logits[:, 5], atol=1e-6)


# ---- WINO's decoder ------------------------------------------------------------------------------

def wino_config(**changes) -> GenerationConfig:
    return GenerationConfig(**{"gen_length": 16, "block_length": 8, "decoder": "wino", "threshold": 0.1, "decoder_options": {"wino_threshold_out": 0.95}, **changes})


def test_wino_decodes_a_block_from_its_shadow_forward():
    """The decoder's part of each iteration, as the loop runs it (forward, revise, apply): every
    remask is a committed token whose leave-one-out probability is below τ_out, fewer than that
    step's commits, and the block fills within one forward per position."""
    model = tiny_llada()
    decoder = make_decoder(wino_config(), model.mask_token_id)
    x = torch.full((1, 20), model.mask_token_id)
    x[0, :4] = torch.tensor(PROMPT)
    s, e = 4, 12
    decoder.block_init(x[:, s:e] == model.mask_token_id, 0)
    forwards, remasked = 0, 0
    while bool((x[:, s:e] == model.mask_token_id).any()):
        out = shadow_forward(model, {"input_ids": x}, s, e)  # what the cache manager runs for a shadow_block decoder
        shadow = out.shadow_logits
        current, masked = x[:, s:e].clone(), x[:, s:e] == model.mask_token_id
        result = decoder.step(out.logits[:, s:e], Block(masked, current, ~masked, 0.1, shadow))
        probs = torch.softmax(shadow.float().index_fill(-1, torch.tensor([model.mask_token_id]), float("-inf")), -1)
        loo = probs.gather(-1, current.unsqueeze(-1)).squeeze(-1)
        assert bool((result.remask <= (~masked & (loo < 0.95))).all())
        torch.testing.assert_close(result.revision_score[~masked], loo[~masked])
        assert int(result.remask.sum()) < max(int(result.commit.sum()), 2)
        assert result.revision_rules == {"remask": (WINO_RULE, 0.95)}
        remasked += int(result.remask.sum())
        x[:, s:e] = apply_decode(result, current, model.mask_token_id)
        forwards += 1
        assert forwards <= e - s
    assert remasked > 0  # the case has narrow-out remasks to check


@pytest.mark.parametrize("family", [tiny_llada, tiny_llada_moe])
def test_wino_through_the_loop_records_and_replays_its_remasks(family):
    model = family()
    config = wino_config(early_stop=False)
    prompt = list(range(1, 9))  # blocks [8, 16), [16, 24)
    out = run_diffusion(model, [prompt], config, hooks=RunHooks(trace=True))
    assert model.mask_token_id not in out.canvas.tolist()[0]
    remasks = [r for rec in out.trace.iterations for r in rec.revisions[0]]
    assert remasks and all(r["kind"] == "remask" and r["rule"] == WINO_RULE and r["score"] < 0.95 and r["bound"] == 0.95 for r in remasks)
    assert all(len(rec.revisions[0]) < max(len(rec.committed[0]), 2) for rec in out.trace.iterations)
    assert out.stats.nfe == len(out.trace.iterations) <= 16  # one forward per iteration, within W per block
    trace = Trace.from_json(out.trace.to_json())
    assert trace.canvas_at(len(trace.iterations) - 1) == trace.final == out.canvas.tolist()
    for i, rec in enumerate(trace.iterations):
        assert all(trace.canvas_at(i)[0][r["position"]] == model.mask_token_id for r in rec.revisions[0])
    assert run_diffusion(model, [prompt] * 2, config).token_ids == out.token_ids * 2  # row-wise


def test_wino_refuses_cache_modes_and_families_in_one_line_before_a_forward():
    for cache in ("prefix", "dual", "vicinity"):
        with pytest.raises(EngineError, match=f"decoder 'wino'.*cache '{cache}' is not supported; use cache none") as err:
            run_diffusion(tiny_llada(), [PROMPT], wino_config(cache=cache))
        assert "\n" not in str(err.value)
    llada2 = tiny_llada2()
    ran = []
    llada2.layer_modules()[0].register_forward_pre_hook(lambda *_: ran.append(1))
    with pytest.raises(EngineError, match="does not support the LLaDA2MoeModelLM family.*runs on LLaDA and LLaDA-MoE"):
        run_diffusion(llada2, [PROMPT], wino_config())
    assert not ran
    with pytest.raises(EngineError, match="does not support the ScriptedLM family.*a forward of its own"):
        check_shadow_support(ScriptedLM(SCRIPT, STRENGTH))
    check_shadow_support(tiny_llada_moe())  # supported: no error
    with pytest.raises(EngineError, match=r"wino_threshold_out must be in \[0, 1\]"):  # with the config, before any worker or weight
        wino_config(decoder_options={"wino_threshold_out": 1.5}).validate()
    with pytest.raises(EngineError, match="none ran before this decode"):
        make_decoder(wino_config(), MASK).step(torch.zeros(1, 4, VOCAB), Block(torch.ones(1, 4, dtype=torch.bool), torch.full((1, 4), MASK), torch.zeros(1, 4, dtype=torch.bool), 0.3))
    assert WinoDecoder.row_wise and WinoDecoder.revises
