"""The hierarchical, credit and factor decoders on hand-made logits, and the decoder plug-in API.

Logits are built from the probabilities we want (`logits_for`), so every confidence, tie and
threshold crossing below is known in advance; the formulas are the ones docs/algorithms.md §2.4, §2.5
and §2.6 state.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from engine import EngineError, GenerationConfig, RunHooks, run_diffusion, save_model
from engine.__main__ import main as cli_main
from engine.decoders import make_decoder
from engine.registry import decoder_class, decoder_names, load_plugins
from tinymodel.tokenizer import save_tokenizer, special_ids

from .conftest import TINY_CONFIG, fill_block, tiny_llada

V, MASK = 12, 11  # 11 real tokens, then [MASK]
BUILT_IN = ("fixed", "threshold", "hierarchical", "credit", "factor")
EXAMPLE_PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "entropy_decoder.py"


def logits_for(probs):
    """Logits `[B, W, V]` whose softmax over the real tokens is `probs` (zero-padded); [MASK] logit 0."""
    p = torch.zeros(len(probs), len(probs[0]), V - 1)
    for b, row in enumerate(probs):
        for j, dist in enumerate(row):
            p[b, j, : len(dist)] = torch.tensor(dist)
    out = torch.zeros(p.shape[0], p.shape[1], V)
    out[..., : V - 1] = p.clamp_min(1e-12).log()
    return out


def conf(c):
    """A distribution whose top-1 is token 0 with probability `c` (the rest spread over 10 tokens)."""
    return [c] + [(1 - c) / (V - 2)] * (V - 2)


def decoder(name, **cfg):
    config = GenerationConfig(decoder=name, **cfg)
    return make_decoder(config, MASK, torch.Generator().manual_seed(0))


def decode(name, logits, masked, threshold=0.9, **cfg):
    dec = decoder(name, threshold=threshold, **cfg)
    dec.block_init(masked, 0)
    return dec.step(logits, fill_block(masked, threshold, MASK))


def mask(rows):
    return torch.tensor([[ch == "m" for ch in row] for row in rows])


# ---- every decoder ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILT_IN)
def test_rows_without_masks_commit_nothing_and_rows_with_masks_commit_at_least_one(name):
    torch.manual_seed(1)
    logits = torch.randn(3, 6, V) * 2
    masked = mask(["------", "m--mm-", "mmmmmm"])
    r = decode(name, logits, masked, steps=64)
    assert not (r.commit & ~masked).any()
    assert not (r.forced & ~r.commit).any()
    assert r.commit.sum(1).tolist()[0] == 0
    assert (r.commit.sum(1)[1:] >= 1).all()


@pytest.mark.parametrize("name", BUILT_IN)
def test_predicted_mask_is_never_a_candidate(name):
    logits = logits_for([[conf(0.5), conf(0.97)]])
    logits[..., MASK] = 40.0  # [MASK] has by far the top logit everywhere
    r = decode(name, logits, mask(["mm"]), threshold=0.9, steps=64)
    assert (r.tokens != MASK).all()
    assert r.tokens.tolist() == [[0, 0]]
    raw = r.extras.get("raw_confidence", r.confidence)  # credit's own confidence is boosted by credit
    assert abs(raw[0, 1].item() - 0.97) < 1e-5  # over the real tokens only
    assert r.commit[0, 1]


@pytest.mark.parametrize("name", BUILT_IN)
def test_batch_rows_decode_as_they_would_alone(name):
    torch.manual_seed(2)
    logits = torch.randn(3, 8, V) * 3
    masked = mask(["mmm--mmm", "-m-m-m-m", "mmmmmmmm"])
    together = decode(name, logits, masked, threshold=0.5, steps=64)
    for b in range(3):
        alone = decode(name, logits[b : b + 1], masked[b : b + 1], threshold=0.5, steps=64)
        assert torch.equal(together.commit[b], alone.commit[0])
        assert torch.equal(together.tokens[b], alone.tokens[0])
        assert torch.equal(together.forced[b], alone.forced[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are only observable on CUDA")
@pytest.mark.parametrize("name", BUILT_IN)
def test_decoders_never_wait_for_the_device(name):
    """Sync-free decoding, which loop unrolling relies on: any device-to-host wait raises here."""
    config = GenerationConfig(decoder=name, temperature=0.5, steps=64)
    dec = make_decoder(config, MASK, torch.Generator("cuda").manual_seed(0))
    logits = torch.randn(2, 16, V, device="cuda") * 3
    masked = torch.rand(2, 16, device="cuda") < 0.7
    dec.block_init(masked, 0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            masked = masked & ~dec.step(logits, fill_block(masked, 0.5, MASK)).commit
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---- hierarchical ----------------------------------------------------------------------------


def hierarchical_reference(confidence, masked, threshold, low):
    """docs/algorithms.md §2.6 for one row at a time, with plain loops: per maximal masked run every
    position equal to the run's max confidence if above `low`, every position above `threshold`,
    and the row's first best."""
    picks = []
    for c, m in zip(confidence.tolist(), masked.tolist()):
        w, pick, j = len(c), [False] * len(c), 0
        while j < w:
            if not m[j]:
                j += 1
                continue
            run = []
            while j < w and m[j]:
                run.append(j)
                j += 1
            top = max(c[i] for i in run)
            for i in run:
                pick[i] |= c[i] == top and c[i] > low
        for i in range(w):
            pick[i] |= m[i] and c[i] > threshold
        masked_c = [c[i] if m[i] else -math.inf for i in range(w)]
        if any(m):
            pick[masked_c.index(max(masked_c))] = True
        picks.append(pick)
    return torch.tensor(picks)


def test_hierarchical_confidence_anchor_equals_the_formula():
    torch.manual_seed(3)
    for trial in range(20):
        logits = torch.randn(4, 16, V) * 2.5
        masked = torch.rand(4, 16) < 0.7
        masked[0] = False  # a row without masks
        r = decode("hierarchical", logits, masked, threshold=0.8, low_threshold=0.4, anchor="confidence")
        expected = hierarchical_reference(r.confidence, masked, 0.8, 0.4)
        assert torch.equal(r.commit, expected), trial


def test_hierarchical_runs_anchors_and_forced_on_a_hand_made_block():
    # runs: [0, 3) and [4, 6); position 3 and 6 are decoded
    probs = [[conf(0.5), conf(0.7), conf(0.6), conf(0.99), conf(0.3), conf(0.35), conf(0.99)]]
    r = decode("hierarchical", logits_for(probs), mask(["mmm-mm-"]), threshold=0.9, low_threshold=0.4)
    assert r.extras["runs"].tolist() == [[0, 0, 0, -1, 1, 1, -1]]
    assert r.extras["anchors"].tolist() == [[False, True, False, False, False, False, False]]  # run 1: 0.35 < low
    assert r.commit.tolist() == [[False, True, False, False, False, False, False]]
    assert not r.forced.any()  # the best (0.7) is an anchor
    lower = decode("hierarchical", logits_for(probs), mask(["mmm-mm-"]), threshold=0.9, low_threshold=0.3)
    assert lower.commit.tolist() == [[False, True, False, False, False, True, False]]


def test_hierarchical_confidence_anchor_takes_every_tie_of_the_run_max():
    probs = [[conf(0.7), conf(0.5), conf(0.7)]]
    r = decode("hierarchical", logits_for(probs), mask(["mmm"]), threshold=0.9, low_threshold=0.6)
    assert r.commit.tolist() == [[True, False, True]]


def test_hierarchical_threshold_is_strict_and_forced_marks_the_global_best():
    probs = [[conf(0.3), conf(0.9), conf(0.2), conf(0.5)]]  # runs: [0, 3), [3, 4); nothing above low 0.95
    r = decode("hierarchical", logits_for(probs), mask(["mm-m"]), threshold=0.9, low_threshold=0.95)
    # 0.9 is not > 0.9, and no anchor clears the low threshold: only the forced best
    assert r.commit.tolist() == [[False, True, False, False]]
    assert r.forced.tolist() == [[False, True, False, False]]


def test_hierarchical_centre_anchor_is_the_eligible_position_nearest_the_centre():
    # one run of 5 at [1, 6): centre 3 (0.5) is below low 0.6; 2 and 4 are equally near: the more confident (2) wins
    probs = [[conf(0.99), conf(0.7), conf(0.65), conf(0.5), conf(0.62), conf(0.9), conf(0.99)]]
    logits, masked = logits_for(probs), mask(["-mmmmm-"])
    centre = decode("hierarchical", logits, masked, threshold=0.95, low_threshold=0.6, anchor="centre")
    assert centre.extras["anchors"].tolist() == [[False, False, True, False, False, False, False]]
    assert centre.commit.tolist() == [[False, False, True, False, False, True, False]]
    assert centre.forced.tolist() == [[False, False, False, False, False, True, False]]  # the best, 0.9
    by_confidence = decode("hierarchical", logits, masked, threshold=0.95, low_threshold=0.6, anchor="confidence")
    assert by_confidence.commit.tolist() == [[False, False, False, False, False, True, False]]
    assert not by_confidence.forced.any()


def test_hierarchical_centre_anchor_one_per_run_left_on_exact_ties():
    # run [0, 4) all 0.7: centre 1.5, positions 1 and 2 tie in distance and confidence -> 1
    # run [5, 8): centre 6
    probs = [[conf(0.7)] * 4 + [conf(0.99), conf(0.8), conf(0.7), conf(0.85)]]
    r = decode("hierarchical", logits_for(probs), mask(["mmmm-mmm"]), threshold=0.95, low_threshold=0.6, anchor="centre")
    assert r.extras["anchors"].tolist() == [[False, True, False, False, False, False, True, False]]
    assert r.commit.tolist() == [[False, True, False, False, False, False, True, True]]  # + best 0.85, forced
    assert r.forced.tolist() == [[False] * 7 + [True]]


# ---- credit ------------------------------------------------------------------------------------


def test_credit_with_alpha_zero_is_threshold_exactly():
    torch.manual_seed(4)
    for temperature in (0.0, 0.7):
        credit = decoder("credit", credit_alpha=0.0, threshold=0.6, temperature=temperature)
        plain = decoder("threshold", threshold=0.6, temperature=temperature)
        masked = torch.rand(2, 10) < 0.9
        credit.block_init(masked, 0)
        plain.block_init(masked, 0)
        for _ in range(4):
            logits = torch.randn(2, 10, V) * 3
            block = fill_block(masked, 0.6, MASK)
            a, b = credit.step(logits, block), plain.step(logits, block)
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.confidence, b.confidence)
            assert torch.equal(a.commit, b.commit) and torch.equal(a.forced, b.forced)
            masked = masked & ~a.commit


def test_credit_three_iterations_by_hand():
    """alpha 1, beta 0.5, gamma 0.5, threshold 0.8; three real tokens; [MASK] logit the highest.

    Position A keeps token 0 at p = 0.64 (boost sqrt(0.64) = 0.8 each time): credit 0.8, 1.2, 1.4,
    fused confidence 0.64(1+C) / (0.64(1+C) + 0.36): 0.762, 0.796, 0.810, so A crosses 0.8 only at
    iteration 3, on its own (not forced). B (token 2, p = 0.81, boost 0.9) commits at once; D
    switches its top-1 from token 0 (p = 0.36) to token 2 (p = 0.81) and commits at iteration 2.
    """
    a = [0.64, 0.2, 0.16]
    b = [0.09, 0.1, 0.81]
    d1, d2 = [0.36, 0.34, 0.30], [0.1, 0.09, 0.81]
    dec = decoder("credit", credit_alpha=1.0, credit_beta=0.5, credit_gamma=0.5, threshold=0.8)
    masked = mask(["mmm"])
    dec.block_init(masked, 0)

    def step(probs, masked):
        logits = logits_for([probs])
        logits[..., MASK] = 30.0
        return dec.step(logits, fill_block(masked, 0.8, MASK))

    r1 = step([a, b, d1], masked)
    assert r1.extras["credit"][0].tolist() == pytest.approx([0.8, 0.9, 0.6])
    assert r1.confidence[0].tolist() == pytest.approx(
        [0.64 * 1.8 / (0.64 * 1.8 + 0.36), 0.81 * 1.9 / (0.81 * 1.9 + 0.19), 0.36 * 1.6 / (0.36 * 1.6 + 0.64)], abs=1e-6
    )
    assert r1.commit.tolist() == [[False, True, False]] and not r1.forced.any()
    assert r1.extras["raw_confidence"][0].tolist() == pytest.approx([0.64, 0.81, 0.36], abs=1e-6)

    masked = masked & ~r1.commit
    r2 = step([a, b, d2], masked)
    # A: 0.5 * 0.8 + 0.8; B (no longer masked): decays only; D: token 0 decays to 0.3, token 2 gains 0.9
    assert r2.extras["credit"][0].tolist() == pytest.approx([1.2, 0.45, 0.9])
    assert r2.confidence[0, 0].item() == pytest.approx(0.64 * 2.2 / (0.64 * 2.2 + 0.36), abs=1e-6)
    assert r2.confidence[0, 2].item() == pytest.approx(0.81 * 1.9 / (0.1 * 1.3 + 0.09 + 0.81 * 1.9), abs=1e-6)
    assert r2.tokens[0, 2].item() == 2
    assert r2.commit.tolist() == [[False, False, True]] and not r2.forced.any()

    masked = masked & ~r2.commit
    r3 = step([a, b, d2], masked)
    assert r3.extras["credit"][0].tolist() == pytest.approx([1.4, 0.225, 0.45])
    assert r3.confidence[0, 0].item() == pytest.approx(0.64 * 2.4 / (0.64 * 2.4 + 0.36), abs=1e-6)
    assert r3.commit.tolist() == [[True, False, False]] and not r3.forced.any()
    # without credit A (0.64) would only have been committed by the at-least-one rule
    assert decode("threshold", logits_for([[a, b, d2]]), masked, threshold=0.8).forced[0, 0]


def test_credit_memory_lives_for_one_block_only():
    dec = decoder("credit")
    masked = mask(["mmmm"])
    dec.block_init(masked, 0)
    assert dec.credit is None
    dec.step(torch.randn(1, 4, V), fill_block(masked, 0.9, MASK))
    assert dec.credit.shape == (1, 4, V) and dec.credit.dtype == torch.float32
    dec.block_done(0)
    assert dec.credit is None
    dec.block_init(mask(["mm"]), 1)  # a shorter last block gets a fresh tensor of its own width
    dec.step(torch.randn(1, 2, V), fill_block(mask(["mm"]), 0.9, MASK))
    assert dec.credit.shape == (1, 2, V)


# ---- factor ------------------------------------------------------------------------------------


def factor_reference(confidence, masked, factor):
    """dInfer's get_transfer_index_dynamic (docs/algorithms.md §2.4), per row with its Python loop."""
    out = []
    for c, m in zip(confidence.tolist(), masked.tolist()):
        k = sum(m)
        commit = [False] * len(c)
        if k:
            thresholds = [1 - factor / (n + 1) for n in range(1, k + 1)]
            thresholds[0] = -1
            ordered = sorted((x for x, mm in zip(c, m) if mm), reverse=True)
            for top_i in range(k):
                if ordered[top_i] < thresholds[top_i]:
                    break
            if top_i == 0 or top_i == k - 1:
                top_i += 1
            chosen = sorted((j for j in range(len(c)) if m[j]), key=lambda j: -c[j])[:top_i]
            for j in chosen:
                commit[j] = True
        out.append(commit)
    return torch.tensor(out)


@pytest.mark.parametrize(
    "confidences, factor, expected",
    [
        ([0.3], 1.0, [True]),  # K = 1: the at-least-one rule
        ([0.6, 0.3, 0.2, 0.2], 1.0, [True, False, False, False]),  # t_2 = 2/3 > 0.3: stop after one
        ([0.9, 0.8, 0.5, 0.4], 1.0, [True, True, False, False]),  # t_3 = 0.75 > 0.5: two
        ([0.9, 0.8, 0.2], 1.0, [True, True, True]),  # fails at rank K - 1 = 2: the quirk takes all K
        ([0.99, 0.99, 0.99], 1.0, [True, True, True]),  # every rank passes
        ([0.4, 0.5, 0.45, 0.3], 3.0, [True, True, True, True]),  # large factor: t_n = 1 - 3/(n+1) low
        ([0.8, 0.5, 0.3, 0.3], 1.0, [True, False, False, False]),
    ],
)
def test_factor_rule_on_hand_made_confidences(confidences, factor, expected):
    probs = [[conf(c) for c in confidences]]
    masked = torch.ones(1, len(confidences), dtype=torch.bool)
    r = decode("factor", logits_for(probs), masked, factor=factor)
    assert r.commit[0].tolist() == expected
    assert torch.equal(r.commit, factor_reference(r.confidence, masked, factor))


def test_factor_forced_marks_commits_below_their_rank_threshold():
    probs = [[conf(0.9), conf(0.8), conf(0.2)], [conf(0.3), conf(0.2), conf(0.2)]]
    r = decode("factor", logits_for(probs), torch.ones(2, 3, dtype=torch.bool), factor=1.0)
    assert r.forced.tolist() == [[False, False, True], [True, False, False]]  # the quirk; best below 1 - 1/2
    assert r.extras["rank"].tolist() == [[0, 1, 2], [0, 1, 2]]
    assert r.extras["factor_threshold"][0].tolist() == pytest.approx([0.5, 1 - 1 / 3, 0.75])


def test_factor_matches_the_reference_loop_on_random_blocks():
    torch.manual_seed(5)
    for factor in (0.5, 1.0, 2.0, 4.0):
        logits = torch.randn(6, 12, V) * 3
        masked = torch.rand(6, 12) < 0.6
        masked[0] = False
        r = decode("factor", logits, masked, factor=factor)
        assert torch.equal(r.commit, factor_reference(r.confidence, masked, factor)), factor


# ---- in the loop: extras in the trace ------------------------------------------------------------


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_decoder_generates_to_the_end_with_small_json_extras(name):
    out = run_diffusion(tiny_llada(), [[1, 2, 3], [4, 5]], GenerationConfig(decoder=name, gen_length=16, block_length=8, early_stop=False), hooks=RunHooks(trace=True))
    assert (out.canvas != TINY_CONFIG["mask_token_id"]).all()
    expected = {"hierarchical": {"runs", "anchors"}, "credit": {"credit", "raw_confidence"}, "factor": {"rank", "factor_threshold"}}
    for rec in out.trace.iterations:
        assert set(rec.extras) == expected.get(name, set())
        for value in rec.extras.values():
            assert len(value) == 2 and all(len(row) == rec.block_range[1] - rec.block_range[0] for row in value)
        assert (rec.threshold is None) == (name in ("fixed", "factor"))
    json.dumps(out.trace.to_dict())


# ---- plug-in API ---------------------------------------------------------------------------------


def test_example_plugin_registers_and_follows_its_rule(own_registry):
    load_plugins(str(EXAMPLE_PLUGIN))
    assert "entropy" in decoder_names()
    # budget -ln(0.5) = 0.69 nats; a near one-hot has ~0 entropy, conf(0.6) about 1.6 nats
    probs = [[conf(0.6), [0.999, 0.001], [1.0], conf(0.5)]]
    r = decode("entropy", logits_for(probs), mask(["mmmm"]), threshold=0.5)
    # lowest entropy first: [1.0] (0), then 0.999 (0.008), then conf(0.6): spent 0.008 <= 0.69, so
    # it commits too; conf(0.5) comes after 1.6 + nats: not
    assert r.commit.tolist() == [[True, True, True, False]]
    assert decode("entropy", logits_for([[conf(0.3), conf(0.4)]]), mask(["mm"]), threshold=0.99).commit.tolist() == [[False, True]]
    out = run_diffusion(tiny_llada(), [[1, 2, 3]], GenerationConfig(decoder="entropy", gen_length=16, block_length=8, early_stop=False))
    assert (out.canvas != TINY_CONFIG["mask_token_id"]).all()


def test_a_broken_plugin_is_one_engine_error(tmp_path):
    bad = tmp_path / "bad_decoder.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(EngineError, match="cannot load decoder plug-in .*bad_decoder.py.*boom"):
        load_plugins(str(bad))


def test_a_plugin_with_the_former_decode_is_told_to_implement_step(tmp_path, own_registry):
    """`decode(logits, masked, threshold)` is no longer called: a plug-in defining only that is
    refused when it loads, in one line, rather than never running its rule (or, on a built-in
    base, silently running the base's)."""
    old = tmp_path / "old_decoder.py"
    old.write_text(
        "from engine import Decoder, register_decoder\n\n\n@register_decoder\nclass OldDecoder(Decoder):\n"
        "    name = 'old'\n\n    def decode(self, logits, masked, threshold):\n        return None\n"
    )
    with pytest.raises(EngineError, match=r"old_decoder.py.*OldDecoder defines decode\(logits, masked, threshold\).*implement step\(logits, block\)") as refused:
        load_plugins(str(old))
    assert "\n" not in str(refused.value) and "old" not in decoder_names()
    with pytest.raises(TypeError, match=r"implement step\(logits, block\)"):
        type("OldThreshold", (decoder_class("threshold"),), {"name": "old_threshold", "decode": lambda self, logits, masked, threshold: None})


def _tiny_checkpoint(folder: Path) -> Path:
    ids = special_ids()
    model = tiny_llada(vocab_size=100, embedding_size=100, **ids)
    save_model(model, folder)
    save_tokenizer(folder)
    return folder


def test_plugin_decoder_runs_from_the_command_line(tmp_path, monkeypatch, capsys, own_registry):
    """The CLI finds the plug-in through DINFER_VIZ_DECODERS alone (a copy, so that it loads afresh)."""
    plugin = tmp_path / "my_decoder.py"
    plugin.write_text(EXAMPLE_PLUGIN.read_text())
    monkeypatch.setenv("DINFER_VIZ_DECODERS", str(plugin))
    folder = _tiny_checkpoint(tmp_path / "tiny")
    argv = ["generate", "--model", str(folder), "--prompt", "Hi", "--gen-length", "16", "--block-length", "8",
            "--decoder", "entropy", "--no-use-chat-template", "--json"]
    assert cli_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["nfe"] >= 2
    monkeypatch.setenv("DINFER_VIZ_DECODERS", str(tmp_path / "missing.py"))
    assert cli_main(argv) == 2
    assert "cannot load decoder plug-in" in capsys.readouterr().err
