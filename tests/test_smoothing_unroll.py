"""Iteration smoothing (docs/algorithms.md §3.1) and loop unrolling (§3.2) in the iteration manager."""

import pytest
import torch

from engine import GenerationConfig, RunHooks, run_diffusion
from engine.models.llada import LLaDAModelLM

from .conftest import TINY_CONFIG, tiny_llada
from .scripted import EOS, ScriptedLM

DECODERS = ("fixed", "threshold", "hierarchical", "credit", "factor")
CACHES = ("none", "prefix", "dual", "vicinity")
# Every decoder and every cache mode at least once, without the full product (tests stay fast).
PAIRS = [(d, "dual") for d in DECODERS] + [("threshold", c) for c in CACHES if c != "dual"]
M = TINY_CONFIG["mask_token_id"]
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]


class RecordingLLaDA(LLaDAModelLM):
    """The tiny LLaDA, unchanged, keeping what each forward was fed and what it returned."""

    def __init__(self) -> None:
        super().__init__(TINY_CONFIG)
        self.load_state_dict(tiny_llada().state_dict())
        self.eval().requires_grad_(False)
        self.calls: list[tuple[tuple[int, int] | None, torch.Tensor, torch.Tensor]] = []

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        out = super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds, **kwargs)
        fed = inputs_embeds if inputs_embeds is not None else self.embed(input_ids)
        self.calls.append((kwargs.get("replace"), fed.clone(), out.logits.clone()))
        return out


def config(**changes) -> GenerationConfig:
    base = dict(gen_length=24, block_length=8, threshold=0.5, steps=24, early_stop=False, warmup=2, prefix_look=4, after_look=4)
    return GenerationConfig(**{**base, **changes})


# ---- smoothing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder, cache", PAIRS)
def test_smoothing_with_zero_weight_gives_the_same_tokens_as_no_smoothing(decoder, cache):
    model = tiny_llada()
    plain = run_diffusion(model, PROMPTS, config(decoder=decoder, cache=cache), hooks=RunHooks(trace=True))
    soft = run_diffusion(model, PROMPTS, config(decoder=decoder, cache=cache, smoothing=True, cont_weight=0.0), hooks=RunHooks(trace=True))
    assert torch.equal(plain.canvas, soft.canvas)
    assert plain.stats.nfe == soft.stats.nfe
    assert [r.committed for r in plain.trace.iterations] == [r.committed for r in soft.trace.iterations]
    assert {r.threshold for r in soft.trace.iterations} <= {0.5, None}  # no decay without soft inputs


@pytest.mark.parametrize("decoder, cache", [("fixed", "none"), ("hierarchical", "prefix"), ("credit", "dual"), ("factor", "vicinity")])
def test_masked_inputs_are_the_mask_embedding_plus_the_weighted_expected_embedding(decoder, cache):
    """Replays the spec on what the model was really fed: after each forward over `[a, b)`, the
    positions of `[a, b)` still masked after its decode hold `E[M] + w_t softmax(logits_t) W_e`,
    the others their own embedding; positions outside keep what the last covering forward set."""
    model = RecordingLLaDA()
    cfg = config(decoder=decoder, cache=cache, smoothing=True, cont_weight=0.3, unroll=True)
    out = run_diffusion(model, PROMPTS, cfg, hooks=RunHooks(trace=True))
    w_e = model.embedding_weight()
    n = out.canvas.shape[1]
    expected = w_e[torch.tensor(out.trace.initial)]  # generate start: the plain embedding of the canvas
    assert len(model.calls) == len(out.trace.iterations) == out.stats.nfe
    for t, (replace, fed, logits) in enumerate(model.calls):
        a, b = replace if replace is not None else (0, n)
        torch.testing.assert_close(fed, expected[:, a:b], rtol=0, atol=1e-6)
        weight = min(0.15 + 0.02 * t, 0.3)
        assert out.trace.iterations[t].extras["cont_weight"] == pytest.approx(weight)
        canvas = torch.tensor(out.trace.canvas_at(t))[:, a:b]  # after this iteration's decode
        soft = w_e[M] + weight * torch.softmax(logits, dim=-1) @ w_e
        expected = expected.clone()
        expected[:, a:b] = torch.where((canvas == M).unsqueeze(-1), soft, w_e[canvas])
    assert max(r.extras["cont_weight"] for r in out.trace.iterations) == pytest.approx(0.3)  # the cap


def test_smoothing_threshold_decays_from_one_on_the_request_counter():
    out = run_diffusion(tiny_llada(), PROMPTS, config(decoder="hierarchical", smoothing=True, cont_weight=0.3), hooks=RunHooks(trace=True))
    thresholds = [r.threshold for r in out.trace.iterations]
    assert thresholds == pytest.approx([max(1.0 - 0.02 * t, 0.5) for t in range(len(thresholds))])
    assert thresholds[0] == 1.0 and len(thresholds) > 25 and thresholds[-1] == 0.5  # across blocks, not reset


def test_early_stop_fill_feeds_plain_eos_embeddings():
    """Row 1 emits EOS in block 0 and is filled with EOS; from then on its filled positions must
    feed EOS's own embedding, not the soft [MASK] one (row 0's prompt covers the EOS position)."""
    script = list(range(6)) + [EOS] + [7] * 17
    model = RecordingScripted(script, [0.5] * 6 + [9.0] + [0.5] * 17)
    out = run_diffusion(model, [[1, 2, 3, 4, 5, 6, 7], [1, 2]], GenerationConfig(
        gen_length=16, block_length=8, threshold=0.99, smoothing=True, align_blocks=True))
    assert out.canvas[1, 8:].eq(EOS).all() and not out.canvas[0].eq(EOS).all()
    assert torch.equal(model.fed[-1][1, 8:], model.embed(out.canvas[1, 8:]))


class RecordingScripted(ScriptedLM):
    def __init__(self, script, strength) -> None:
        super().__init__(script, strength)
        self.fed: list[torch.Tensor] = []
        self.requires_grad_(False)

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        self.fed.append(inputs_embeds.clone())
        return super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds, **kwargs)


# ---- unrolling ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder, cache", PAIRS + [(d, "none") for d in DECODERS if d != "threshold"])
def test_unrolled_loop_gives_the_same_tokens_with_fewer_host_syncs(decoder, cache):
    model = tiny_llada()
    cfg = config(decoder=decoder, cache=cache, gen_length=32, block_length=16, steps=32, threshold=0.3)
    plain = run_diffusion(model, PROMPTS, cfg)
    unrolled = run_diffusion(model, PROMPTS, cfg.replace(unroll=True))
    assert torch.equal(plain.canvas, unrolled.canvas)
    assert unrolled.stats.host_syncs < plain.stats.host_syncs
    assert unrolled.stats.nfe >= plain.stats.nfe  # no-op forwards on a finished block count


def _one_per_iteration_model() -> ScriptedLM:
    # every logit 0.5 over 19 real tokens: confidence ~0.08 < 0.9, so threshold commits one at a time
    return ScriptedLM([1] * 32, [0.5] * 32)


def test_host_syncs_follow_the_unroll_schedule_exactly():
    # one block [16, 32) of 16 masks
    prompt, cfg = [[1] * 16], GenerationConfig(gen_length=16, block_length=16, threshold=0.9, early_stop=False)
    plain = run_diffusion(_one_per_iteration_model(), prompt, cfg)
    assert (plain.stats.nfe, plain.stats.host_syncs) == (16, 17)  # a check per iteration, one that finds none left
    # masks 16, 12, 9, 7, 6, ..., 1 -> groups 4, 3, 2, 1 x 7: ten groups and the final check
    unrolled = run_diffusion(_one_per_iteration_model(), prompt, cfg.replace(unroll=True))
    assert (unrolled.stats.nfe, unrolled.stats.host_syncs) == (16, 11)
    # expected_tpf 1 and max_unroll 3: groups of 3, 3, 3, 3, 3, 1
    clamped = run_diffusion(_one_per_iteration_model(), prompt, cfg.replace(unroll=True, expected_tpf=1, max_unroll=3))
    assert (clamped.stats.nfe, clamped.stats.host_syncs) == (16, 7)
    assert torch.equal(plain.canvas, unrolled.canvas) and torch.equal(plain.canvas, clamped.canvas)


def test_wasted_iterations_on_a_finished_block_count_in_nfe():
    sure = ScriptedLM([3] * 24, [20.0] * 24)  # every position certain: a block completes in one iteration
    cfg = GenerationConfig(gen_length=16, block_length=8, threshold=0.9, early_stop=False, unroll=True, expected_tpf=2)
    out = run_diffusion(sure, [[1] * 8], cfg, hooks=RunHooks(trace=True))
    # each block: 8 masks // 2 = 4 iterations queued; the first commits all 8, three are no-ops
    assert out.stats.nfe == 8 and out.stats.host_syncs == 4
    assert [sum(len(row) for row in r.committed) for r in out.trace.iterations] == [8, 0, 0, 0] * 2


def test_defaults_are_dinfers_serving_values():
    cfg = GenerationConfig()
    assert (cfg.unroll, cfg.expected_tpf, cfg.max_unroll) == (False, 4, 8)
    assert (cfg.cont_weight, cfg.cont_weight_init, cfg.cont_weight_growth, cfg.threshold_decay) == (0.3, 0.15, 0.02, 0.02)
