"""The iteration manager: schedule, early stop, batching, stats and trace."""

import threading

import pytest

from engine import EngineError, GenerationCancelled, GenerationConfig, RunHooks, Trace, run_diffusion
from engine.run import block_ranges

from .conftest import tiny_llada
from .scripted import EOS, MASK, VOCAB, ScriptedLM


def test_block_ranges_aligned_and_unaligned():
    assert block_ranges([5], 5 + 8, 4, align=True) == [(4, 8), (8, 12), (12, 13)]
    assert block_ranges([5], 5 + 8, 4, align=False) == [(5, 9), (9, 13)]
    assert block_ranges([9, 6], 9 + 8, 4, align=True) == [(4, 8), (8, 12), (12, 16), (16, 17)]


def _script(prompt_len, answer, total):
    """Prompt positions predict themselves; then the answer; then EOS to the end."""
    return list(range(prompt_len)) + answer + [EOS] * (total - prompt_len - len(answer))


def test_early_stop_skips_later_blocks_and_counts_forwards():
    prompt = [1, 2, 3, 4]
    answer = [5, 6, 7]  # EOS appears at position 7, inside block [4, 8)
    model = ScriptedLM(_script(4, answer, 4 + 16), [5.0] * 20)
    cfg = GenerationConfig(gen_length=16, block_length=4, decoder="threshold", threshold=0.5)
    out = run_diffusion(model, [prompt], cfg, stop_ids=[EOS])
    assert out.stats.nfe == 1 == model.forwards  # one confident forward fills the block; later blocks skipped
    assert out.token_ids == [answer]
    assert out.stats.tokens == 3
    assert out.canvas[0, 8:].eq(EOS).all()


def test_without_early_stop_every_block_is_decoded():
    model = ScriptedLM(_script(4, [5, 6, 7], 20), [5.0] * 20)
    cfg = GenerationConfig(gen_length=16, block_length=4, decoder="threshold", threshold=0.5, early_stop=False)
    out = run_diffusion(model, [[1, 2, 3, 4]], cfg, stop_ids=[EOS])
    assert out.stats.nfe == 4  # one per block
    assert out.stats.tokens == 3


def test_eos_in_prompt_does_not_stop_generation():
    """Chat templates put EoT inside the prompt; only generated positions can end a row."""
    prompt = [1, EOS, 3]  # position 1 holds EOS, in the first (aligned) block [0, 4)
    model = ScriptedLM([1, EOS, 3, 10] + [11] * 8 + [EOS] * 4, [5.0] * 16)
    cfg = GenerationConfig(gen_length=12, block_length=4, decoder="threshold", threshold=0.5)
    out = run_diffusion(model, [prompt], cfg, stop_ids=[EOS])
    assert out.token_ids == [[10] + [11] * 8]


def test_batch_rows_stop_independently():
    """Rows share the canvas; a row that finished is padded with EOS while the other goes on."""
    model = ScriptedLM(_script(4, [5, 6, 7, 8, 9, 10, 11], 26), [5.0] * 26)  # canvas: 10 + 16
    cfg = GenerationConfig(gen_length=16, block_length=4, decoder="threshold", threshold=0.5)
    out = run_diffusion(model, [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], cfg, stop_ids=[EOS])
    assert out.prompt_lengths == [4, 10]
    # row 0 generates from position 4; row 1's prompt already covers 4..9 and generates from 10
    assert out.token_ids[0] == [5, 6, 7, 8, 9, 10, 11]
    assert out.token_ids[1] == [11]
    assert out.stats.tokens == 8
    assert out.stats.batch == 2


def test_stats_definitions():
    model = ScriptedLM(_script(4, [5, 6, 7, 8, 9], 20), [0.1] * 20)  # low confidence: one token per forward
    cfg = GenerationConfig(gen_length=16, block_length=4, decoder="threshold", threshold=0.99)
    out = run_diffusion(model, [[1, 2, 3, 4]], cfg, stop_ids=[EOS])
    s = out.stats
    assert s.tokens == 5
    assert s.nfe == 8  # blocks [4,8) and [8,12), one commit each; EOS at 9 stops the rest
    assert s.tpf == pytest.approx(5 / 8)
    assert s.tps == pytest.approx(5 / s.seconds)


def test_trace_replays_to_the_final_canvas_and_round_trips_json():
    model = tiny_llada()
    cfg = GenerationConfig(gen_length=16, block_length=8, decoder="threshold", threshold=0.3, early_stop=False)
    out = run_diffusion(model, [[1, 2, 3, 4, 5]], cfg, stop_ids=[48], hooks=RunHooks(trace=True))
    trace = Trace.from_json(out.trace.to_json())
    assert len(trace.iterations) == out.stats.nfe
    assert trace.canvas_at(-1) == trace.initial
    assert trace.canvas_at(len(trace.iterations) - 1) == out.canvas.tolist() == trace.final
    rec = trace.iterations[0]
    assert rec.forward == "full" and rec.recomputed == [[0, 21]]
    assert len(rec.top1[0]) == len(rec.confidence[0]) == 8
    assert set(rec.forced[0]) <= set(rec.committed[0])
    committed = sorted(p for r in trace.iterations for p in r.committed[0])
    assert committed == sorted(set(committed))  # every position committed once


def test_each_record_carries_its_forwards_cost_and_traces_without_one_still_load():
    model = tiny_llada()
    cfg = GenerationConfig(gen_length=16, block_length=8, threshold=0.3, cache="dual")
    out = run_diffusion(model, [[1, 2, 3, 4, 5]], cfg, stop_ids=[48], hooks=RunHooks(trace=True))
    for rec in out.trace.iterations:  # one process, nothing compiled: compute only
        assert rec.cost["comm_seconds"] == [0.0] and len(rec.cost["compute_seconds"]) == 1
        assert 0 <= rec.cost["compute_seconds"][0] <= rec.seconds
        assert (rec.cost["compiles"], rec.cost["captures"], rec.cost["compile_seconds"], rec.cost["graph_replay"]) == (0, 0, 0.0, False)
    assert (out.stats.compiles, out.stats.captures, out.stats.graph_replays, out.stats.comm_seconds) == (0, 0, 0, 0.0)
    data = out.trace.to_dict()
    assert Trace.from_dict(data).iterations == out.trace.iterations
    for rec in data["iterations"]:  # written before `cost` existed
        del rec["cost"]
    assert all(rec.cost is None for rec in Trace.from_dict(data).iterations)
    for bad in ({"compute_seconds": [0.1]}, {**out.trace.iterations[0].cost, "comm_seconds": [0.1, 0.2]}, {**out.trace.iterations[0].cost, "compiles": -1}):
        data["iterations"][0]["cost"] = bad
        with pytest.raises(EngineError, match=r"iterations\[0\]\.cost must hold compute_seconds, comm_seconds"):
            Trace.from_dict(data)


def test_records_keep_the_top_candidates_of_the_masked_positions_and_long_blocks_none():
    import math

    from engine.trace import CANDIDATES_MAX_BLOCK, TOP_CANDIDATES

    prompt = [1, 2, 3, 4]
    strength = [5.0] * 4 + [4.0, 0.5, 4.0, 0.5]  # two positions pass tau 0.5 at once, two wait
    model = ScriptedLM(_script(4, [5, 6, 7, 8], 8), strength)
    cfg = GenerationConfig(gen_length=4, block_length=4, decoder="threshold", threshold=0.5, early_stop=False)
    out = run_diffusion(model, [prompt], cfg, stop_ids=[EOS], hooks=RunHooks(trace=True))
    first, second = out.trace.iterations[:2]
    others = VOCAB - 2  # every real token but the scripted one ([MASK] excluded)

    def prob(logit: float) -> float:
        return round(math.exp(logit) / (math.exp(logit) + others), 4)

    assert sorted(first.committed[0]) == [4, 6]
    for w, token in enumerate([5, 6, 7, 8]):
        pairs = first.candidates[0][w]
        assert len(pairs) == TOP_CANDIDATES and pairs[0] == [token, prob(strength[4 + w])]
        assert [p for _, p in pairs[1:]] == [round(1 / (math.exp(strength[4 + w]) + others), 4)] * 2
        assert MASK not in [t for t, _ in pairs]
    assert second.candidates[0][0] == [] and second.candidates[0][2] == []  # committed before: nothing weighed
    assert second.candidates[0][1][0][0] == 6 and second.candidates[0][3][0][0] == 8
    loaded = Trace.from_json(out.trace.to_json())
    assert loaded.iterations == out.trace.iterations
    data = out.trace.to_dict()
    data["iterations"][0]["candidates"][0][1] = [[6, "high"]]
    with pytest.raises(EngineError, match=r"iterations\[0\]\.candidates\[0\] must be one list of \[id, probability\] pairs"):
        Trace.from_dict(data)
    n = CANDIDATES_MAX_BLOCK + 1  # a longer block: its lists would grow with its square
    long_model = ScriptedLM(_script(4, [5] * n, 4 + n), [5.0] * (4 + n))
    long_cfg = GenerationConfig(gen_length=n, block_length=n, decoder="threshold", threshold=0.5, early_stop=False, align_blocks=False)
    assert all(rec.candidates is None for rec in run_diffusion(long_model, [prompt], long_cfg, stop_ids=[EOS], hooks=RunHooks(trace=True)).trace.iterations)


def test_forced_commits_are_those_below_threshold():
    model = ScriptedLM(_script(4, [5, 6, 7, 8], 12), [0.0] * 4 + [0.5, 9.0, 0.4, 0.3] + [0.0] * 4)
    cfg = GenerationConfig(gen_length=8, block_length=4, decoder="threshold", threshold=0.99, early_stop=False)
    out = run_diffusion(model, [[1, 2, 3, 4]], cfg, stop_ids=[EOS], hooks=RunHooks(trace=True))
    first = out.trace.iterations[0]
    assert first.committed == [[5]] and first.forced == [[]]  # 9.0 logit: confidence ~0.998 >= 0.99
    second = out.trace.iterations[1]
    assert len(second.committed[0]) == 1 and second.forced == second.committed


def test_cancel_stops_between_iterations():
    model = tiny_llada()
    cancel = threading.Event()
    seen = []

    def on_iteration(rec):
        seen.append(rec)
        cancel.set()

    cfg = GenerationConfig(gen_length=16, block_length=8, decoder="fixed")
    with pytest.raises(GenerationCancelled):
        run_diffusion(model, [[1, 2, 3]], cfg, stop_ids=[48], hooks=RunHooks(on_iteration=on_iteration, cancel=cancel))
    assert len(seen) == 1


def test_empty_prompt_is_rejected():
    with pytest.raises(EngineError, match="empty prompt"):
        run_diffusion(tiny_llada(), [[]], GenerationConfig(), stop_ids=[48])


def test_predicted_mask_is_never_committed():
    """A model that always prefers [MASK] still finishes: the decoder takes the best real token."""
    model = ScriptedLM([MASK] * 12, [9.0] * 12)
    for decoder in ("threshold", "fixed"):
        out = run_diffusion(model, [[1, 2, 3, 4]], GenerationConfig(gen_length=8, block_length=4, decoder=decoder), stop_ids=[EOS])
        assert not out.canvas.eq(MASK).any()
