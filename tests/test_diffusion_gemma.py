"""DiffusionGemma through transformers' classes, and the engine's uniform-state loop against
transformers' own `generate`.

Parity is exact at the sampler's real temperatures, not only where sampling is deterministic: the
engine draws from its request generator in the order transformers draws from the global one (the
initial canvas; per step the proposals by `torch.multinomial`, then the re-noising canvas), a
generator seeded with `seed` produces the stream `torch.manual_seed(seed)` does, and both call the
same network on the same inputs. The step-by-step acceptance masks are also compared with
transformers' `EntropyBoundSampler` on the same logits, and the adaptive stop with its
`StableAndConfidentStoppingCriteria` on the same drafts.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.hooks import RunHooks
from engine.models import DiffusionGemmaLM, load_model, save_model
from engine.pipeline import Engine
from engine.trace import Trace
from engine.run import GenerationCancelled
from engine.decoders.entropy_bound import EntropyBoundDecoder
from engine.generation import run_diffusion
from engine.kinds.uniform import UniformRun, _StableAndConfident

from .conftest import tiny_llada
from .gemma_models import CANVAS, STOP, build_checkpoint, tiny_config


def run_uniform_diffusion(model, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks):
    """The engine's entry point on a uniform-state model (it fits and runs the model's kind)."""
    out = run_diffusion(model, prompts, config, stop_ids=stop_ids, hooks=hooks)
    assert out.trace is None or out.trace.kind == "uniform"
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("tiny-gemma"))


@pytest.fixture(scope="module")
def reference(checkpoint):
    from transformers import DiffusionGemmaForBlockDiffusion

    return DiffusionGemmaForBlockDiffusion.from_pretrained(checkpoint, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(checkpoint) -> DiffusionGemmaLM:
    return load_model(checkpoint)


def uniform_config(seed: int = 0, gen_length: int = 3 * CANVAS, **options) -> GenerationConfig:
    return GenerationConfig(decoder="uniform", gen_length=gen_length, block_length=CANVAS, seed=seed, decoder_options=options)


def hf_generate(reference, prompts: list[list[int]], seed: int, gen_length: int, **settings) -> torch.Tensor:
    """transformers' generate on left-padded prompts, with our stop id and the pad id as its EOS and pad."""
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    torch.manual_seed(seed)
    kwargs = {"attention_mask": mask} if len(prompts) > 1 else {}
    return reference.generate(ids, max_new_tokens=gen_length, eos_token_id=[STOP], pad_token_id=0, **settings, **kwargs)


def test_checkpoint_loads_through_the_loader_with_transformers_weights(checkpoint, reference, model):
    assert isinstance(model, DiffusionGemmaLM) and model.diffusion_kind == "uniform"
    assert model.text_config.num_experts == 2  # every DiffusionGemma layer is MoE
    theirs = reference.state_dict()
    for name, tensor in model.hf.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    for name, buffer in model.hf.named_buffers():  # computed, not stored: RoPE frequencies, scales
        assert torch.equal(buffer, dict(reference.named_buffers())[name]), name
    # the encoder shares the decoder's weights, the head the embedding (transformers' ties)
    assert model.model.encoder.language_model.layers[0].self_attn.q_proj.weight is model.model.decoder.layers[0].self_attn.q_proj.weight
    assert model.lm_head.weight is model.embedding_weight()
    assert model.mask_token_id == 0 and model.eos_token_ids == [0] and model.canvas_length == CANVAS


def test_save_model_round_trip_and_engine(tmp_path, checkpoint, model):
    again = load_model(save_model(model, tmp_path / "copy"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    engine = Engine(checkpoint)
    assert isinstance(engine.model, DiffusionGemmaLM) and engine.stop_ids[0] == 0
    out = run_uniform_diffusion(engine.model, [engine.encode("12+7=", use_chat_template=False)], uniform_config(), engine.stop_ids, RunHooks(trace=True, token_strings=engine.token_strings))
    assert set(out.trace.tokens) >= {str(i) for rec in out.trace.iterations for row in rec.state["draft"] for i in row}


def test_config_without_experts_is_one_line_error(tmp_path, checkpoint):
    import json

    folder = tmp_path / "no-experts"
    folder.mkdir()
    config = json.loads((checkpoint / "config.json").read_text())
    del config["text_config"]["num_experts"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    with pytest.raises(EngineError, match="text_config.num_experts must be a positive integer") as err:
        load_model(folder)
    assert "\n" not in str(err.value)


def test_checkpoint_missing_a_tensor_names_it(tmp_path, checkpoint):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "short"
    folder.mkdir()
    (folder / "config.json").write_text((checkpoint / "config.json").read_text())
    state = load_file(checkpoint / "model.safetensors")
    del state["model.decoder.self_conditioning.up_proj.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(EngineError, match="checkpoint lacks tensor model.decoder.self_conditioning.up_proj.weight"):
        load_model(folder)


def test_every_end_id_the_config_lists_stops_a_row(tmp_path, checkpoint):
    """Gemma configs list several end ids: each is a stop id of the engine, the first one first."""
    import json

    folder = tmp_path / "two-ends"
    folder.mkdir()
    config = json.loads((checkpoint / "config.json").read_text())
    config["text_config"]["eos_token_id"] = [0, 5]
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (checkpoint / name).exists():
            (folder / name).write_bytes((checkpoint / name).read_bytes())
    engine = Engine(str(folder))
    assert engine.model.eos_token_ids == [0, 5] and engine.stop_ids[:2] == [0, 5]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("stop", [dict(confidence_threshold=2.5), dict(confidence_threshold=1.8, stability_threshold=0)])
def test_tokens_equal_transformers_generate(model, reference, seed, stop):
    """One prompt, three canvases, transformers' default sampler settings but fewer steps and a
    looser stopping rule, so that rows end on the stop id and (second case) canvases stop early."""
    prompt = [[12, 30, 45, 9, 17]]
    settings = dict(max_denoising_steps=12, **stop)
    ours = run_uniform_diffusion(model, prompt, uniform_config(seed, **settings), [STOP], RunHooks(trace=True))
    theirs = hf_generate(reference, prompt, seed, 3 * CANVAS, **settings)
    n = theirs.sequences.shape[1]
    assert ours.canvas[:, :n].tolist() == theirs.sequences.tolist()
    assert (ours.canvas[:, n:] == 0).all()  # canvases never run hold the pad id


def test_bfloat16_equals_transformers(checkpoint):
    """The accelerator default dtype: bf16 weights, fp32 logits, self-conditioning fed back in bf16."""
    from transformers import DiffusionGemmaForBlockDiffusion

    model = load_model(checkpoint, dtype=torch.bfloat16)
    reference = DiffusionGemmaForBlockDiffusion.from_pretrained(checkpoint, attn_implementation="eager", dtype=torch.bfloat16).eval()
    settings = dict(max_denoising_steps=8, confidence_threshold=1.8, stability_threshold=0)
    ours = run_uniform_diffusion(model, [[12, 30, 45, 9, 17]], uniform_config(1, **settings), [STOP], RunHooks())
    theirs = hf_generate(reference, [[12, 30, 45, 9, 17]], 1, 3 * CANVAS, **settings)
    assert model.dtype == torch.bfloat16
    assert ours.canvas[:, : theirs.sequences.shape[1]].tolist() == theirs.sequences.tolist()


def test_batch_equals_transformers(model, reference):
    """Two rows that stop and end at different steps (a stopped row is frozen while the other goes on)."""
    from transformers import EntropyBoundSamplerConfig

    prompts = [[12, 30, 45, 9, 17, 20, 21], [40, 41, 42, 43, 44, 45, 46]]
    # stability 0: a row stops as soon as it is confident (the random model's drafts never settle)
    settings = dict(max_denoising_steps=10, confidence_threshold=1.8, stability_threshold=0, t_min=0.2, t_max=1.0)
    ours = run_uniform_diffusion(model, prompts, uniform_config(2, entropy_bound=0.5, **settings), [STOP], RunHooks(trace=True))
    theirs = hf_generate(reference, prompts, 2, 3 * CANVAS, sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.5), **settings)
    n = theirs.sequences.shape[1]
    assert ours.canvas[:, :n].tolist() == theirs.sequences.tolist()
    stopped_alone = [rec for rec in ours.trace.iterations if rec.active == [False, True] or rec.active == [True, False]]
    assert stopped_alone  # a record where one row was frozen and the other denoised


def test_left_padded_row_sees_what_it_sees_alone(model):
    """Unequal prompts are left-padded and the pad masked out, as transformers batches them (its
    generate cannot build the eager mask for a padded batch in 5.24, so there is no reference run):
    the padded row's logits equal its logits alone on the same canvas."""
    def first_logits(prompts: list[list[int]]) -> torch.Tensor:
        run = UniformRun(model, prompts, uniform_config(), [STOP], RunHooks())
        cache = model.new_cache()
        p = run.prompt_length
        model.encode(run.x[:, :p], run.attention, torch.arange(p, dtype=torch.int32).unsqueeze(0), cache)
        attention = torch.nn.functional.pad(run.attention, (0, CANVAS), value=True)
        canvas = torch.arange(CANVAS).repeat(len(prompts), 1) + 20
        masks = model.decoder_masks(canvas, cache, attention)
        return model.denoise(canvas, cache, masks, torch.arange(p, p + CANVAS, dtype=torch.int32).unsqueeze(0), None)

    with torch.inference_mode():
        batch = first_logits([[12, 30, 45, 9, 17], [40, 41]])
        alone = first_logits([[40, 41]])
    torch.testing.assert_close(batch[1], alone[0], rtol=1e-4, atol=1e-4)


def test_early_stop_and_padding_were_exercised(model):
    """Over a few seeds, some row ends on the stop id and pads after it (else parity proves less)."""
    padded = 0
    for seed in range(6):
        out = run_uniform_diffusion(model, [[12, 30, 45, 9, 17]], uniform_config(seed, max_denoising_steps=12, confidence_threshold=2.5), [STOP], RunHooks())
        generated = out.canvas[0, 5:].tolist()
        if STOP in generated:
            first = generated.index(STOP)
            assert all(t == 0 for t in generated[first + 1 :])
            padded += 1
    assert padded >= 1


def test_acceptance_equals_transformers_sampler_on_the_same_logits():
    from transformers import EntropyBoundSampler, EntropyBoundSamplerConfig

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 16, 50, generator=generator) * torch.tensor([0.5, 3.0, 8.0]).view(3, 1, 1)
    logits[0, 4] = logits[0, 5]  # a tie in entropy
    for bound in (0.01, 0.1, 1.0, 5.0):
        sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=bound), canvas_length=16, vocab_size=50, max_denoising_steps=4)
        sampler.accept_canvas(torch.zeros(3, 16, dtype=torch.long), torch.ones(3, 16, dtype=torch.long), logits, 1)
        accepted, lower_sum = EntropyBoundDecoder.accept(EntropyBoundDecoder.entropy(logits), bound)
        assert torch.equal(accepted, sampler.accepted_token_mask)
        assert torch.equal(accepted, lower_sum <= bound)
        assert accepted.any(dim=1).all()  # the lowest-entropy position always passes


def test_stop_rule_equals_transformers_criteria():
    from transformers import StableAndConfidentStoppingCriteria

    generator = torch.Generator().manual_seed(1)
    theirs = StableAndConfidentStoppingCriteria(stability_threshold=2, confidence_threshold=3.0)
    ours = _StableAndConfident(2, 3.0)
    drafts = [torch.randint(0, 3, (4, 5), generator=generator) for _ in range(3)]
    drafts += [drafts[-1]] * 3
    for draft in drafts:
        logits = torch.randn(4, 5, 20, generator=generator) * 3
        stable, confident = ours(draft, EntropyBoundDecoder.entropy(logits).mean(dim=-1))
        assert torch.equal(stable & confident, theirs(draft, logits))


def test_trace_is_valid_and_replays_every_canvas_the_model_read(model):
    seen: list[torch.Tensor] = []
    denoise = model.denoise

    def spy(canvas, *args):
        seen.append(canvas.clone())
        return denoise(canvas, *args)

    model.denoise = spy
    try:
        out = run_uniform_diffusion(model, [[12, 30, 45]], uniform_config(5, max_denoising_steps=6, confidence_threshold=2.5), [STOP], RunHooks(trace=True))
    finally:
        del model.denoise
    trace = Trace.from_dict(out.trace.to_dict())
    assert len(trace.iterations) == len(seen)
    for i, rec in enumerate(trace.iterations):
        s, e = rec.block_range
        u = rec.state
        # what the step read: the canvas rebuilt from the records before it, and its own start
        before = trace.canvas_at(i - 1)[0][s:e] if u["start"] is None else u["start"][0]
        assert before == seen[i][0].tolist()
        accepted = [p - s for p in rec.committed[0]]
        assert accepted == [j for j, total in enumerate(u["entropy_sum"][0]) if total <= u["bound"] + 1e-4] or not rec.active[0]
        assert sorted(rec.committed[0] + u["renoised"][0]) == (list(range(s, e)) if rec.active[0] else [])
        assert 0 < u["temperature"] <= 0.8
    assert trace.canvas_at(len(trace.iterations) - 1) == trace.final == out.canvas.tolist()


def test_counting_rules(model, reference):
    """tokens: the final canvas's generated ids that are neither stop ids nor pad, not the sum of
    acceptances (most accepted proposals are replaced later); nfe: every forward, the encoder's
    (one per canvas) and the decoder's (one per step). On one row transformers' tokens_per_forward
    divides its non-pad tokens by the decoder forwards only."""
    prompt = [[12, 30, 45, 9, 17]]
    settings = dict(max_denoising_steps=12, confidence_threshold=2.5)
    out = run_uniform_diffusion(model, prompt, uniform_config(1, **settings), [STOP], RunHooks(trace=True))
    generated = out.canvas[0, 5:].tolist()
    assert out.stats.tokens == sum(t not in (STOP, 0) for t in generated) == len(out.token_ids[0])
    accepted = sum(len(rec.committed[0]) for rec in out.trace.iterations)
    assert accepted > out.stats.tokens
    canvases = len({rec.block for rec in out.trace.iterations})
    assert out.stats.nfe == canvases + len(out.trace.iterations)
    theirs = hf_generate(reference, prompt, 1, 3 * CANVAS, **settings)
    hf_tokens = int((theirs.sequences[0, 5:] != 0).sum())
    assert theirs.tokens_per_forward.item() == pytest.approx(hf_tokens / (out.stats.nfe - canvases))


def test_cancel_between_steps(model):
    cancel = threading.Event()
    records = []

    def on_iteration(rec):
        records.append(rec)
        if len(records) == 2:
            cancel.set()

    with pytest.raises(GenerationCancelled):
        run_uniform_diffusion(model, [[12, 30]], uniform_config(), [STOP], RunHooks(on_iteration=on_iteration, cancel=cancel))
    assert len(records) == 2


def test_refusals_are_one_line(model):
    cases = [
        (uniform_config().replace(decoder="fixed"), "decoder 'fixed' runs masked diffusion and this model is uniform diffusion"),
        (uniform_config().replace(cache="dual"), "uniform diffusion does not read cache"),
        (uniform_config().replace(temperature=0.7, smoothing=True), "does not read temperature .*, smoothing"),
        (uniform_config(t_min=0.9), "t_min < t_max"),
        (uniform_config(max_denoising_steps=0), r"max_denoising_steps must be in \[1, 1024\], got 0"),
    ]
    for config, message in cases:
        with pytest.raises(EngineError, match=message) as err:
            run_uniform_diffusion(model, [[12, 30]], config, [STOP], RunHooks())
        assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="text-only") as err:  # Gemma's image token id (config.json)
        run_uniform_diffusion(model, [[12, 258880]], uniform_config(), [STOP], RunHooks())
    assert "258880" in str(err.value)


def test_uniform_decoder_refuses_a_masked_model():
    with pytest.raises(EngineError, match="decoder 'uniform' runs uniform diffusion and this model is masked diffusion"):
        run_uniform_diffusion(tiny_llada(), [[1, 2]], uniform_config(), [48], RunHooks())


def test_engine_generate_runs_the_uniform_loop(checkpoint):
    """Through the text API once the entry point dispatches on `diffusion_kind`: the same tokens as
    the loop called directly, and an expected answer in the header."""
    engine = Engine(checkpoint)
    config = uniform_config(max_denoising_steps=6).replace(use_chat_template=False)
    result = engine.generate("12+7=", config, RunHooks(trace=True), expected="19")
    direct = run_uniform_diffusion(engine.model, [engine.encode("12+7=", use_chat_template=False)], config, engine.stop_ids, RunHooks())
    assert result.output.canvas.tolist() == direct.canvas.tolist()
    assert result.output.trace.iterations[0].state is not None and result.output.trace.expected
