"""Static-shape forwards (engine/runtime/compiled.py): buckets, padding that changes no result, the
capture-safe MoE, torch.compile with every decoder and cache mode, on an MoE and with TP=2, and
CUDA graphs where CUDA exists.

Compiling is slow here (seconds per graph), so the compiled models are module fixtures shared by
the parametrized cases, and the prompts are chosen so that one generate needs four graphs. No
assertion depends on how long anything took.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig, RunHooks, run_diffusion, save_model
from engine.__main__ import main as cli
from engine.runtime.compiled import CompiledLM, bucket
from engine.models.moe import SparseMoE
from tinymodel.tokenizer import save_tokenizer, special_ids

from .app_support import EMBEDDED_MODEL
from .conftest import tiny_llada
from .moe_models import tiny_llada2, tiny_llada_moe

# Canvas 7 + 32 = 39 tokens: full forwards pad to 40 rows, cached ones run 32 or 40 query rows
# against a 40-slot store, whatever the decoder or cache mode.
PROMPTS = [[3, 14, 15, 9, 26, 5, 35], [2, 7, 18]]
OTHER_PROMPTS = [[4, 8, 15, 16, 23], [42, 7, 11, 30]]  # another canvas (37) in the same buckets
DECODERS = {
    "fixed": dict(decoder="fixed", steps=16),
    "threshold": dict(decoder="threshold"),
    "hierarchical": dict(decoder="hierarchical", low_threshold=0.4),
    "credit": dict(decoder="credit"),
    "factor": dict(decoder="factor"),
}
CACHES = ["none", "prefix", "dual", "vicinity"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and GPU numerics need a CUDA device")


def _config(**extra) -> GenerationConfig:
    return GenerationConfig(**{"gen_length": 32, "block_length": 16, "threshold": 0.7, "warmup": 1, "prefix_look": 8, "after_look": 8, **extra})


@pytest.fixture(scope="module")
def dense():
    """A tiny LLaDA and the same model compiled (one set of graphs for every case)."""
    model = tiny_llada()
    return model, CompiledLM(model, compile=True)


# ---- buckets and padding, eagerly ------------------------------------------------------------


def test_buckets_pad_by_at_most_a_quarter_to_multiples_of_eight():
    sizes = [bucket(n) for n in range(1, 2000)]
    assert sizes[:32] == [32] * 32 and bucket(33) == 40 and bucket(100) == 112 and bucket(1025) == 1280
    assert all(s >= n and s % 8 == 0 for n, s in enumerate(sizes, 1))
    assert all(s <= 1.25 * n for n, s in enumerate(sizes, 1) if n > 32)
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("persist", [False, True])
@pytest.mark.parametrize("build", [tiny_llada, tiny_llada_moe], ids=["keys before RoPE", "keys after RoPE"])
def test_query_slots_as_an_index_tensor_are_the_range(build, persist):
    """A cached forward told its query slots as an index tensor computes what the range computes,
    and writes (persist) the same store."""
    model = build()
    x = torch.randint(0, 38, (2, 20))
    store = model(input_ids=x, use_cache=True).kv
    by_range, by_index = store.clone(), store.clone()
    a = model(input_ids=x[:, 5:12], past_kv=by_range, replace=(5, 12), persist=persist, use_cache=True)
    b = model(input_ids=x[:, 5:12], past_kv=by_index, replace=torch.arange(5, 12), persist=persist, use_cache=True)
    assert a.logits.equal(b.logits) and a.kv.equal(b.kv) and by_range.equal(by_index)
    assert by_index[..., 5:12, :].equal(b.kv) if persist else by_index.equal(store)
    with pytest.raises(EngineError, match="one slot per query token"):
        model(input_ids=x[:, 5:12], past_kv=store, replace=torch.arange(5, 11))


def _shard_of_experts(moe: SparseMoE, first: int, count: int) -> SparseMoE:
    """`moe` cut to experts [first, first + count), as expert parallelism leaves a rank's share."""
    moe.w1 = torch.nn.Parameter(moe.w1[first : first + count].clone(), requires_grad=False)
    moe.w2 = torch.nn.Parameter(moe.w2[first : first + count].clone(), requires_grad=False)
    moe.first_expert = first
    return moe


@pytest.mark.parametrize("build", [tiny_llada_moe, tiny_llada2])
@pytest.mark.parametrize("share", [None, (4, 4)], ids=["all experts", "an expert-parallel share"])
def test_capture_safe_experts_equal_the_routed_loop(build, share):
    moe = next(m for m in build().modules() if isinstance(m, SparseMoE))
    if share:
        moe = _shard_of_experts(moe, *share)
    x = torch.randn(37, moe.w1.shape[-1])
    idx, weight = moe.gate(x)
    routed, static = moe.experts(x, idx, weight), moe.experts_static(x, idx, weight)
    torch.testing.assert_close(static, routed, rtol=0, atol=1e-5)
    if share:  # pairs routed elsewhere add nothing: tokens with no local expert are zero rows
        elsewhere = ~((idx >= 4) & (idx < 8)).any(dim=1)
        assert elsewhere.any() and static[elsewhere].eq(0).all()


@pytest.mark.parametrize("build", [tiny_llada, tiny_llada_moe], ids=["dense", "moe"])
def test_padded_forwards_give_the_unpadded_logits_and_store(build):
    """Every call the cache manager makes, through the padding alone (no compiler): full, refresh,
    embeddings, cached with and without persist; the caller's store changes only under persist."""
    model = build()
    padded = CompiledLM(model, compile=False)
    x = torch.randint(0, 38, (2, 27))
    torch.testing.assert_close(padded(input_ids=x).logits, model(input_ids=x).logits, rtol=0, atol=1e-5)
    embeds = model.embed(x)
    torch.testing.assert_close(padded(inputs_embeds=embeds).logits, model(inputs_embeds=embeds).logits, rtol=0, atol=1e-5)
    store = padded(input_ids=x, use_cache=True).kv
    torch.testing.assert_close(store, model(input_ids=x, use_cache=True).kv, rtol=0, atol=1e-5)
    for persist in (False, True):
        mine, theirs = store.clone(), store.clone()
        got = padded(input_ids=x[:, 9:17], past_kv=mine, replace=(9, 17), persist=persist).logits
        want = model(input_ids=x[:, 9:17], past_kv=theirs, replace=(9, 17), persist=persist).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
        assert persist or mine.equal(store)
    assert {(shape[1], past and past[4]) for _, shape, past, *_ in padded.buckets} == {(32, None), (32, 32)}


def test_padded_block_causal_forwards_keep_the_callers_mask():
    """LLaDA2's forwards carry their own masks (block-causal, and the store's unused slots)."""
    model = tiny_llada2()
    padded = CompiledLM(model, compile=False)
    x = torch.randint(0, 38, (1, 24))
    causal = torch.arange(24).unsqueeze(1) // 8 >= torch.arange(24).unsqueeze(0) // 8
    got, want = padded(input_ids=x, attention_mask=causal, use_cache=True), model(input_ids=x, attention_mask=causal, use_cache=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    store = torch.zeros_like(want.kv)
    store[..., :16, :] = want.kv[..., :16, :]
    keys = (torch.arange(24) < 16 + 8).view(1, 1, 1, -1)
    got = padded(input_ids=x[:, 16:24], past_kv=store, replace=(16, 24), attention_mask=keys, use_cache=True)
    want = model(input_ids=x[:, 16:24], past_kv=store, replace=(16, 24), attention_mask=keys, use_cache=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.kv, want.kv, rtol=0, atol=1e-5)


# ---- torch.compile ---------------------------------------------------------------------------


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("decoder", DECODERS)
def test_compiled_generation_decides_what_the_plain_one_decides(dense, decoder, cache):
    model, compiled = dense
    config = _config(cache=cache, **DECODERS[decoder])
    plain = run_diffusion(model, PROMPTS, config, hooks=RunHooks(trace=True))
    out = run_diffusion(compiled, PROMPTS, config, hooks=RunHooks(trace=True))
    assert out.token_ids == plain.token_ids and out.stats.nfe == plain.stats.nfe
    assert [r.committed for r in out.trace.iterations] == [r.committed for r in plain.trace.iterations]
    assert [r.forward for r in out.trace.iterations] == [r.forward for r in plain.trace.iterations]
    costs = [r.cost for r in out.trace.iterations]
    assert out.stats.compiles == sum(c["compiles"] for c in costs)
    assert out.stats.compile_seconds == pytest.approx(sum(c["compile_seconds"] for c in costs))
    assert not any(c["graph_replay"] or c["captures"] for c in costs) and out.stats.graph_replays == 0


def test_after_warm_up_a_generation_compiles_nothing_and_each_bucket_compiled_once(dense):
    model, compiled = dense
    config = _config(cache="prefix")
    run_diffusion(compiled, PROMPTS, config)  # warm (a no-op when the cases above ran)
    out = run_diffusion(compiled, OTHER_PROMPTS, config, hooks=RunHooks(trace=True))
    assert out.stats.compiles == 0 and out.stats.compile_seconds == 0
    assert all(r.cost["compiles"] == 0 for r in out.trace.iterations)
    assert out.token_ids == run_diffusion(model, OTHER_PROMPTS, config).token_ids
    assert compiled.counters.compiles == len(compiled.buckets)  # no bucket was ever compiled twice


def test_a_compiled_moe_decides_what_the_plain_one_decides():
    model = tiny_llada_moe()
    compiled = CompiledLM(model, compile=True)
    config = _config(cache="dual")
    assert run_diffusion(compiled, PROMPTS, config).token_ids == run_diffusion(model, PROMPTS, config).token_ids
    assert compiled.counters.compiles == len(compiled.buckets) == 2  # the refresh, and the dual forward


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """The tiny LLaDA (2 layers: quicker to compile than the embedded model's 6) with the embedded
    model's character tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-llada")
    save_model(tiny_llada(vocab_size=99, embedding_size=99, **special_ids()), folder)
    save_tokenizer(folder)
    return folder


def test_compile_with_tensor_parallelism_keeps_the_tokens_and_times_each_ranks_all_reduces(tiny_folder):
    config = _config(cache="none")
    prompts = ["Q: 48+57=? A:", "Q: 3+4=? A:"]
    with Engine(tiny_folder) as one, Engine(tiny_folder, tp_size=2, compile=True) as two:
        first = two.generate(prompts, config, hooks=RunHooks(trace=True)).output
        again = two.generate(prompts, config, hooks=RunHooks(trace=True)).output
        plain = one.generate(prompts, config, hooks=RunHooks(trace=True)).output
    assert first.token_ids == again.token_ids == plain.token_ids
    assert first.stats.compiles >= 1 and again.stats.compiles == 0 and again.stats.comm_seconds > 0
    for record in again.trace.iterations:
        assert len(record.cost["compute_seconds"]) == len(record.cost["comm_seconds"]) == 2
        assert all(s > 0 for s in record.cost["comm_seconds"])  # 4 all-reduces per forward, on either rank
    assert all(r.cost["comm_seconds"] == [0.0] for r in plain.trace.iterations)


# ---- the options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(cuda_graphs=True), "cuda_graphs needs a CUDA device; this engine runs on cpu"),
        (dict(compile="yes"), "compile and cuda_graphs must be true or false"),
    ],
)
def test_options_this_machine_cannot_take_are_one_line_before_loading(options, message):
    with pytest.raises(EngineError, match=message) as refused:
        Engine(EMBEDDED_MODEL, **options)
    assert "\n" not in str(refused.value)


def test_the_cli_refuses_cuda_graphs_on_the_cpu_in_one_line(capsys):
    assert cli(["generate", "--prompt", "Q: 3+4=? A:", "--cuda-graphs"]) == 2
    assert capsys.readouterr().err == "error: cuda_graphs needs a CUDA device; this engine runs on cpu\n"


# ---- CUDA ----------------------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "compile and graphs"])
@pytest.mark.parametrize("cache", ["none", "dual"])
def test_cuda_graphs_replay_one_capture_per_bucket_and_keep_the_tokens(compile, cache):
    model = tiny_llada().cuda()
    graphed = CompiledLM(model, compile=compile, cuda_graphs=True)
    config = _config(cache=cache)
    assert run_diffusion(graphed, PROMPTS, config).token_ids == run_diffusion(model, PROMPTS, config).token_ids
    out = run_diffusion(graphed, OTHER_PROMPTS, config, hooks=RunHooks(trace=True))
    assert out.token_ids == run_diffusion(model, OTHER_PROMPTS, config).token_ids
    assert out.stats.captures == 0 and out.stats.graph_replays == out.stats.nfe
    assert all(r.cost["graph_replay"] for r in out.trace.iterations)
    assert graphed.counters.captures == len(graphed.buckets)


@CUDA
@pytest.mark.parametrize("build", [tiny_llada_moe, tiny_llada2])
def test_captured_moe_logits_match_the_routed_forward_in_bf16(build):
    model = build().cuda().to(torch.bfloat16)
    for name, p in model.named_parameters():  # routers stay fp32, as the loader keeps them
        if name.endswith(model.fp32_suffixes):
            p.data = p.data.float()
    x = torch.randint(0, 38, (2, 24), device="cuda")
    want = model(input_ids=x).logits.float()
    got = CompiledLM(model, compile=False, cuda_graphs=True)(input_ids=x).logits.float()
    assert float((got - want).norm() / want.norm()) < 5e-2  # bf16 rounding of differently grouped matmuls (gpu_check.TOLERANCE)


def test_a_compiled_uniform_state_model_answers_as_the_eager_one(tiny_gemma_folder):
    """The compiled wrapper carries the kind: a DiffusionGemma runs its own loop with its denoising
    forward compiled (engine/runtime/compiled.py: CompiledDenoiser), token for token the eager run.
    On the tests' 2-layer random DiffusionGemma: half the shipped model's layers to compile."""
    gemma = tiny_gemma_folder
    config = GenerationConfig(decoder_options={"max_denoising_steps": 6})
    compiled = Engine(gemma, compile=True).generate("Q: 7+58=? A:", config, RunHooks(trace=True))
    eager = Engine(gemma).generate("Q: 7+58=? A:", config)
    assert compiled.output.token_ids == eager.output.token_ids and compiled.output.trace.kind == "uniform"
    assert compiled.output.stats.compiles >= 1
    with pytest.raises(EngineError, match="uniform diffusion does not run with cuda_graphs"):
        Engine(gemma, cuda_graphs=True)
