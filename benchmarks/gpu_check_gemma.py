"""The GPU check's DiffusionGemma step (issue 37): DiffusionGemma-26B-A4B shapes with random
weights, one denoising step's decoder forward over a 256-token canvas against the bandwidth
floor, and the tokens per second at batch 1 that it projects for 16 steps per canvas, beside
vLLM's published 1,756 (decode) and 895 (end to end) tok/s on one H100 in FP8.

    python -m benchmarks.gpu_check --models diffusion-gemma-26b-a4b          # CUDA, bf16
    python -m benchmarks.gpu_check --tiny --models diffusion-gemma-26b-a4b   # CPU: tiny-gemma's shapes, fp32

The model is the engine's DiffusionGemma (transformers' own network, engine/models/diffusion_gemma.py)
built on the target device in the target dtype, filled by transformers' initialiser (nothing is
downloaded); the forwards are the ones the uniform loop makes (`encode` of the prompt into the
cache, then `denoise` of a canvas that reads it). Projection: a canvas of `canvas` tokens costs
`steps` denoising forwards (decode), plus the encode of the finished canvas into the cache
(end to end, per canvas in steady state; the prompt's own prefill is left out).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

# Gemma 4 26B-A4B's text shapes (its config.json) with DiffusionGemma's 256-token canvas: 30 layers
# (every sixth full attention), 128 experts of which 8 per token beside a dense MLP in every layer.
DIFFUSION_GEMMA_26B = {
    "model_type": "diffusion_gemma", "architectures": ["DiffusionGemmaForBlockDiffusion"], "canvas_length": 256,
    "text_config": {
        "model_type": "diffusion_gemma_text", "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
        "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8, "num_hidden_layers": 30,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
        "num_global_key_value_heads": 2, "sliding_window": 1024, "max_position_embeddings": 262144,
        "pad_token_id": 0, "eos_token_id": 1, "final_logit_softcapping": 30.0,
    },
}
TINY_GEMMA = Path(__file__).resolve().parent.parent / "assets" / "tiny-gemma" / "config.json"
# vLLM's published DiffusionGemma-26B-A4B figures (batch 1, one H100, FP8, 16 fixed steps, 256-token canvas)
VLLM_TOKENS_PER_SECOND = {"decode": 1756.0, "end to end": 895.0}
STEPS = 16


def gemma_config(tiny: bool) -> dict[str, Any]:
    return json.loads(TINY_GEMMA.read_text()) if tiny else DIFFUSION_GEMMA_26B


def build_gemma(config: dict[str, Any], device: torch.device, dtype: torch.dtype):
    """The engine's DiffusionGemma, made on `device` in `dtype` (a 26B model never exists in fp32
    or on the host), its random weights from transformers' initialiser."""
    from engine.models.diffusion_gemma import DiffusionGemmaLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DiffusionGemmaLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval().requires_grad_(False)


def forward_bytes(model, canvas: int, cached: int) -> float:
    """Bytes one decoder forward over `canvas` tokens reads at least: every dense weight of the
    decoder (the vision tower and the embedding lookup excluded; the tied output head included),
    the experts `canvas` tokens hit under uniform top-k routing, and the cache's `cached` K/V."""
    text = model.text_config
    decoder = model.model.decoder
    experts = [m for m in decoder.modules() if type(m).__name__.endswith("TextExperts")]
    expert_ids = {id(p) for m in experts for p in m.parameters()}
    element = model.embedding_weight().element_size()
    dense = sum(p.numel() for p in decoder.parameters() if id(p) not in expert_ids)  # the embedding is the head
    per_expert = sum(p.numel() for m in experts for p in m.parameters()) / text.num_experts
    hit = text.num_experts * (1 - (1 - text.top_k_experts / text.num_experts) ** canvas)
    window = text.sliding_window
    kv = 0
    for kind, layer in zip(text.layer_types, decoder.layers):  # keys, and values where a layer has its own
        keys = min(cached, window) if kind == "sliding_attention" else cached
        attention = layer.self_attn
        kv += keys * attention.k_proj.out_features * (2 if getattr(attention, "v_proj", None) is not None else 1)
    return (dense + hit * per_expert + kv) * element


def check_gemma(name: str, tiny: bool, device: torch.device, dtype: torch.dtype, bandwidth: float, prompt_length: int,
                timer: Callable[[Callable[[], Any]], float]) -> dict[str, Any]:
    """Build the model, encode a random prompt, time the encode of one canvas and the decoder
    forward of one denoising step (self-conditioned, as every step after the first; `timer`: its
    median seconds), and project. The prompt and a canvas must fit the sliding window."""
    start = time.perf_counter()
    model = build_gemma(gemma_config(tiny), device, dtype)
    built = time.perf_counter() - start
    width = model.canvas_length
    generator = torch.Generator(device).manual_seed(0)
    prompt = torch.randint(2, model.vocab_size, (1, prompt_length), generator=generator, device=device)
    canvas = torch.randint(2, model.vocab_size, (1, width), generator=generator, device=device)
    with torch.inference_mode():
        cache = model.new_cache()
        mask = torch.ones((1, prompt_length), dtype=torch.bool, device=device)
        model.encode(prompt, mask, torch.arange(prompt_length, device=device, dtype=torch.int32).unsqueeze(0), cache)
        attention = torch.nn.functional.pad(mask, (0, width), value=True)
        masks = model.decoder_masks(canvas, cache, attention)
        positions = torch.arange(prompt_length, prompt_length + width, device=device, dtype=torch.int32).unsqueeze(0)
        first = model.denoise(canvas, cache, masks, positions, None)
        conditioning = first.to(model.dtype)
        denoise_s = timer(lambda: model.denoise(canvas, cache, masks, positions, conditioning))
        logits = model.denoise(canvas, cache, masks, positions, conditioning)
        finite = bool(torch.isfinite(logits).all())
        def encode_canvas() -> None:  # the finished canvas into the cache, then back to the prompt alone
            model.encode(canvas, attention, positions, cache)
            cache.crop(-width)

        encode_s = timer(encode_canvas)
        kept = cache.get_seq_length() == prompt_length  # the crop left the prompt (within the sliding window)
    params = sum(p.numel() for p in model.parameters())
    floor_s = forward_bytes(model, width, prompt_length) / bandwidth
    del model, cache
    if device.type == "cuda":
        torch.cuda.empty_cache()
    decode_tps = width / (STEPS * denoise_s)
    end_to_end_tps = width / (STEPS * denoise_s + encode_s)
    return {
        "model": name, "params": params, "build_s": built, "canvas": width, "prompt": prompt_length, "steps": STEPS,
        "denoise_ms": 1e3 * denoise_s, "floor_ms": 1e3 * floor_s, "x_floor": denoise_s / floor_s, "encode_ms": 1e3 * encode_s,
        "decode_tps": decode_tps, "end_to_end_tps": end_to_end_tps, "floor_decode_tps": width / (STEPS * floor_s),
        "vllm_decode_tps": VLLM_TOKENS_PER_SECOND["decode"], "vllm_end_to_end_tps": VLLM_TOKENS_PER_SECOND["end to end"],
        "vllm": f"{VLLM_TOKENS_PER_SECOND['decode']:,.0f} / {VLLM_TOKENS_PER_SECOND['end to end']:,.0f}", "finite": finite,
        "failures": [why for ok, why in ((finite, "denoise logits not finite"), (kept, "the timed encodes changed the cache")) if not ok],
    }


GEMMA_COLUMNS = [
    ("canvas", "canvas", ""), ("prompt", "prompt", ""), ("denoise ms (median)", "denoise_ms", ".3f"), ("floor ms", "floor_ms", ".3f"),
    ("x floor", "x_floor", ".2f"), ("encode ms", "encode_ms", ".3f"), ("decode tok/s (16 steps)", "decode_tps", ".1f"),
    ("end-to-end tok/s", "end_to_end_tps", ".1f"), ("floor decode tok/s", "floor_decode_tps", ".1f"),
    ("vLLM decode / end to end", "vllm", ""),
]
