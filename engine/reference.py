"""Record a reference implementation's own run as a trace (docs/analysis.md §1, docs/trace.md).

Two references, each run by its own code and observed only through public hooks:

- transformers' `DiffusionGemmaForBlockDiffusion.generate` for a DiffusionGemma checkpoint: a
  streamer (`put` for the prompt and each finished canvas, `put_draft` for each step's argmax
  draft), a logits processor (the raw logits and the step counter `n`, applied before generate's
  own temperature) and a PyTorch forward pre-hook on its decoder (the canvas each step reads);
- diffusers' `LLaDA2Pipeline` with its `BlockRefinementScheduler` for an LLaDA2 checkpoint (the
  engine's network behind the adapter diffusers calls, block-causal as LLaDA2 is, [MASK] never
  proposed as every decoder of ours does): `callback_on_step_end` with every tensor it offers,
  and the adapter's own logits for the candidates.

What the hooks do not expose is marked, never invented: a token id the hooks never showed is
`NOT_EXPOSED` (-1), a probability `null`; fields derived from what was observed by the
reference's own published rule (the accepted positions from the observed logits through
transformers' `EntropyBoundSampler`) are named in the header's `config["reference"]`, with the
observed and the absent ones. A model or setting the reference does not support is refused in
one line (EngineError) before anything runs.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .cache import block_causal_mask
from .config import GenerationConfig
from .errors import EngineError
from .kinds import KINDS
from .registry import builtin_decoder_names, decoder_class
from .step_state import step_state
from .trace import Trace

# each reference library and the diffusion kind its own loop runs (the kind its traces record)
REFERENCE_KINDS = {"transformers": "uniform", "diffusers": "masked"}
REFERENCES = tuple(REFERENCE_KINDS)
NOT_EXPOSED = -1  # a token id the reference's hooks did not show
TOP = 3  # candidates per position, as the engine's traces keep (engine/trace.py TOP_CANDIDATES)

# the GenerationConfig fields each reference reads; any other field must keep its default
_READS = {
    "transformers": {"gen_length", "block_length", "decoder", "seed", "use_chat_template", "decoder_options"},
    "diffusers": {"gen_length", "block_length", "decoder", "threshold", "temperature", "seed", "early_stop", "use_chat_template", "decoder_options"},
}


def reference_of_kind(kind: str) -> str | None:
    """The reference library whose own loop runs `kind` diffusion (None: no library does)."""
    return next((library for library, runs in REFERENCE_KINDS.items() if runs == kind), None)


def reference_decoders(reference: str) -> list[str]:
    """The built-in decoders whose rule `reference`'s own loop runs (each decoder's `references`)."""
    return [name for kind in KINDS for name in builtin_decoder_names(kind) if reference in decoder_class(name).references]


# what each reference library's sampler runs on, in words (its refusal names it)
REFERENCE_MODELS = {"transformers": "DiffusionGemma checkpoints", "diffusers": "LLaDA2 checkpoints"}


def check_model(reference: str, model_kind: str) -> None:
    """EngineError (one line) for a model of another kind than the reference's sampler runs, said
    before the request is fitted to the model (whose refusal would name the engine's decoders)."""
    if reference in REFERENCE_KINDS and REFERENCE_KINDS[reference] != model_kind:
        raise EngineError(f"the {reference} reference runs {REFERENCE_MODELS[reference]} ({REFERENCE_KINDS[reference]} diffusion); this model is {model_kind} diffusion")


def check_settings(reference: str, config: GenerationConfig) -> None:
    """EngineError (one line) for a reference it cannot run, a decoder it does not have or a
    setting it has no counterpart for."""
    if reference not in REFERENCES:
        raise EngineError(f"unknown reference '{reference}'; choose from {', '.join(REFERENCES)}")
    decoders = reference_decoders(reference)
    if config.decoder not in decoders:
        raise EngineError(f"the {reference} reference runs {' or '.join(decoders)}, not decoder '{config.decoder}'")
    default = GenerationConfig()
    changed = [f for f in config.to_dict() if f not in _READS[reference] and getattr(config, f) != getattr(default, f)]
    if changed:
        flag = "--" + changed[0].replace("_", "-")
        raise EngineError(f"the {reference} reference has no counterpart for {flag} (it runs its own loop): leave it at its default")
    if reference == "diffusers" and config.decoder_options.get("repetition_penalty", 0.0):
        raise EngineError("diffusers' LLaDA2Pipeline has no repetition penalty: leave --repetition-penalty at 0")


def option(config: GenerationConfig, name: str) -> Any:
    """A decoder option's value: given, else its declared default."""
    return config.decoder_options.get(name, decoder_class(config.decoder).options[name].default)


def _reference_note(library: str, entry: str, hooks: list[str], observed: list[str], derived: dict[str, str], absent: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    import importlib.metadata

    return {
        "library": library, "version": importlib.metadata.version(library), "entry": entry, "hooks": hooks,
        "observed": observed, "derived": derived, "absent": absent, "not_exposed_id": NOT_EXPOSED, "settings": settings,
    }


def _top(probs: torch.Tensor, k: int = TOP) -> list[list[list[float]]]:
    """`[W, V]` probabilities -> per position the k most probable [id, p] pairs."""
    p, i = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [[[int(a), round(float(b), 4)] for a, b in zip(ids, ps)] for ids, ps in zip(i.tolist(), p.tolist())]


def _finish(data: dict[str, Any], token_strings) -> Trace:
    """The trace in this engine's current version (built here in version 3's form, upgraded on
    load), with token strings when a tokenizer is at hand, checked on load. Its `nfe` counts the
    forwards as the engine does (docs/counting.md; a DiffusionGemma canvas's encoder forward too),
    so a reference's NFE and TPF compare with a run's."""
    if token_strings is not None:
        ids = set(data["eos_ids"]) | {data["mask_id"]} | {i for row in data["final"] + data["initial"] for i in row}
        for rec in data["iterations"]:
            ids |= {i for row in rec["top1"] for i in row} | {c[0] for row in rec.get("candidates") or [] for cs in row for c in cs}
            ids |= step_state(data["kind"]).ids(rec.get("uniform") or {})
        data["tokens"] = token_strings({i for i in ids if i >= 0})
    trace = Trace.from_dict(data)
    trace.stats["nfe"] = sum(rec.forwards for rec in trace.iterations)
    return trace


# --- transformers: DiffusionGemma -------------------------------------------------------------


def transformers_settings(config: GenerationConfig) -> dict[str, Any]:
    """generate's keywords for the engine's uniform settings (the same names and defaults)."""
    from transformers import EntropyBoundSamplerConfig

    return {
        "max_new_tokens": config.gen_length,
        "max_denoising_steps": int(option(config, "max_denoising_steps")),
        "t_min": float(option(config, "t_min")),
        "t_max": float(option(config, "t_max")),
        "stability_threshold": int(option(config, "stability_threshold")),
        "confidence_threshold": float(option(config, "confidence_threshold")),
        "sampler_config": EntropyBoundSamplerConfig(entropy_bound=float(option(config, "entropy_bound"))),
    }


def record_transformers(
    model, prompt: list[int], config: GenerationConfig, *, stop_ids: list[int] | None = None, pad_id: int | None = None, token_strings=None, name: str | None = None
) -> Trace:
    """transformers' own `generate` on one tokenised prompt, recorded step by step: seeded as
    the engine's parity test seeds it (`torch.manual_seed(config.seed)`), with `stop_ids` (default:
    the checkpoint's end ids) as its EOS and `pad_id` (default: its pad id) as its pad."""
    from transformers import DiffusionGemmaForBlockDiffusion, LinearTemperatureScheduleLogitsProcessor, LogitsProcessor, LogitsProcessorList
    from transformers.generation.streamers import BaseStreamer

    if not isinstance(model, DiffusionGemmaForBlockDiffusion):
        raise EngineError(f"the transformers reference runs DiffusionGemmaForBlockDiffusion, not {type(model).__name__}")
    check_settings("transformers", config)
    canvas_length = int(model.config.canvas_length)
    if config.block_length != canvas_length:
        raise EngineError(f"transformers' generate denoises canvases of the checkpoint's {canvas_length}: use --block-length {canvas_length}")
    text = model.config.text_config
    eos = list(stop_ids) if stop_ids else _ids(model.generation_config.eos_token_id) or _ids(text.eos_token_id)
    pad = pad_id if pad_id is not None else next(i for i in (model.generation_config.pad_token_id, text.pad_token_id, eos[0]) if i is not None)
    settings = transformers_settings(config)
    steps_max = settings["max_denoising_steps"]
    reads, raws, drafts, puts, times = [], [], [], [], []

    class Observer(BaseStreamer):
        def put(self, value):
            puts.append(value[0].tolist())

        def put_draft(self, value, **_):
            drafts.append(value[0].tolist())
            times.append(time.perf_counter())

        def end(self):
            pass

    class RawLogits(LogitsProcessor):
        def __call__(self, input_ids, scores, cur_step):
            raws.append((scores[0].detach().float().clone(), int(cur_step)))
            return scores

    hook = model.model.decoder.register_forward_pre_hook(lambda _m, _a, kw: reads.append(kw["decoder_input_ids"][0].tolist()), with_kwargs=True)
    try:
        torch.manual_seed(config.seed)
        t0 = time.perf_counter()
        out = model.generate(
            torch.tensor([prompt], device=model.device), streamer=Observer(), logits_processor=LogitsProcessorList([RawLogits()]),
            eos_token_id=eos, pad_token_id=pad, **settings,
        )
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    p = len(prompt)
    canvases = -(-config.gen_length // canvas_length)
    n = p + canvases * canvas_length
    final = (out.sequences[0].tolist() + [pad] * n)[:n]
    temperature = LinearTemperatureScheduleLogitsProcessor(settings["t_min"], settings["t_max"], steps_max)
    bound = settings["sampler_config"].entropy_bound
    records, step, block, outputs = [], 0, 0, puts[1:]
    history: list[list[int]] = []
    for i, ((raw, left), read, draft) in enumerate(zip(raws, reads, drafts)):
        if i and left == steps_max:  # a new canvas begins
            block, step, history = block + 1, 0, []
        s, e = p + block * canvas_length, p + (block + 1) * canvas_length
        last = i + 1 == len(raws) or raws[i + 1][1] == steps_max
        scaled = temperature(None, raw, torch.tensor(left))
        records.append(_uniform_record(i, block, (s, e), step, left, scaled, read, draft, None if last else reads[i + 1], outputs[block] if last else None,
                                       bound, float(left) / steps_max, settings, history, steps_max, times[i] - (times[i - 1] if i else t0)))
        history.append(draft)
        step += 1
    initial = prompt + [pad] * (n - p)
    note = _reference_note(
        "transformers", "DiffusionGemmaForBlockDiffusion.generate", ["streamer put/put_draft", "logits_processor", "decoder forward pre-hook"],
        ["the canvas each step reads", "the raw logits and steps_left", "the argmax draft", "each canvas's output", "tokens_per_forward"],
        {"temperature-scaled logits": "LinearTemperatureScheduleLogitsProcessor on the observed logits",
         "accepted (committed), renoised": "EntropyBoundSampler.accept_canvas on the scaled logits",
         "entropy, entropy_sum, candidates, confidence": "the scaled softmax",
         "stopping.stable, stopping.confident": "StableAndConfidentStoppingCriteria's rule on the observed drafts"},
        ["the sampled proposal where it was not accepted (-1)", "the re-noising after a canvas's last step (-1)", "timings per forward (seconds: between drafts)"],
        {k: (v.entropy_bound if k == "sampler_config" else v) for k, v in settings.items()} | {"eos_token_id": eos, "pad_token_id": pad},
    )
    data = {
        "version": 3, "model": name or f"transformers:{type(model).__name__}", "kind": REFERENCE_KINDS["transformers"], "capabilities": {"revises": None, "shadow_block": None},
        "mask_id": pad, "eos_ids": eos, "prompt_lengths": [p], "canvas_length": n, "block_length": canvas_length,
        "config": {**config.to_dict(), "reference": note}, "initial": [initial], "tokens": {}, "expected": None, "iterations": records,
        "final": [final], "stats": {"nfe": len(records), "seconds": seconds}, "trace_seconds": 0.0,
    }
    return _finish(data, token_strings)


def _ids(value) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _uniform_record(i, block, span, step, left, scaled, read, draft, next_read, output, bound, fraction, settings, history, steps_max, seconds) -> dict[str, Any]:
    """One step of transformers' sampler in the trace's uniform record (docs/trace.md §3.2)."""
    from transformers import EntropyBoundSampler, EntropyBoundSamplerConfig

    s, e = span
    width = e - s
    probs = torch.softmax(scaled, dim=-1)
    entropy = torch.distributions.Categorical(logits=scaled).entropy()
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=bound), width, scaled.shape[-1], steps_max)
    current = torch.tensor([read])
    sampler.accept_canvas(current, current, scaled[None], left)
    accepted = sampler.accepted_token_mask[0].tolist()
    order = entropy.argsort()
    lower = torch.empty_like(entropy).scatter_(0, order, entropy[order].cumsum(0) - entropy[order])
    after = next_read if next_read is not None else [NOT_EXPOSED] * width
    proposal = [after[w] if accepted[w] else NOT_EXPOSED for w in range(width)]
    renoised = [w for w in range(width) if not accepted[w]]
    mean = float(entropy.mean())
    stab, conf = settings["stability_threshold"], settings["confidence_threshold"]
    stable = stab == 0 or (len(history) >= stab and all(h == draft for h in history[-stab:]))
    confident = mean < conf
    return {
        "iteration": i, "block": block, "block_range": [s, e], "forward": "prefix", "recomputed": [[s, e]], "threshold": None,
        "committed": [[s + w for w in range(width) if accepted[w]]], "forced": [[]],
        "top1": [draft], "confidence": [[round(float(probs[w, draft[w]]), 4) for w in range(width)]], "seconds": seconds,
        "extras": {}, "cost": None, "candidates": [_top(probs)], "revisions": None,
        "active": [True], "final_until": [e if output is not None else s],
        "uniform": {
            "step": step, "steps_left": left, "temperature": round(settings["t_min"] + (settings["t_max"] - settings["t_min"]) * fraction, 6), "bound": bound,
            "entropy": [[round(float(v), 4) for v in entropy]], "entropy_sum": [[round(float(v), 4) for v in lower]], "draft": [draft],
            "proposal": [proposal], "proposal_probability": [[round(float(probs[w, t]), 4) if t >= 0 else None for w, t in enumerate(proposal)]],
            "renoised": [[s + w for w in renoised]], "noise": [[after[w] for w in renoised]],
            "start": [read] if step == 0 else None, "output": [output] if output is not None else None,
            "stopping": {"stable": [stable], "confident": [confident], "mean_entropy": [round(mean, 4)], "stopped": [stable and confident],
                         "stability_threshold": stab, "confidence_threshold": conf},
        },
    }


# --- diffusers: LLaDA2 ------------------------------------------------------------------------


class DiffusersAdapter(torch.nn.Module):
    """What LLaDA2Pipeline calls, `model(ids, attention_mask=, position_ids=).logits`, over the
    engine's LLaDA2 network: block-causal attention over the window diffusers feeds it (the
    prompt's blocks up to the current one), [MASK] removed from the proposals. Keeps the last
    logits so a recorder can read the candidates."""

    def __init__(self, model: torch.nn.Module, block_length: int) -> None:
        super().__init__()
        self.model, self.block_length, self.last_logits = model, block_length, None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor):
        n = input_ids.shape[1]
        if not bool(attention_mask.all()) or not torch.equal(position_ids[0], torch.arange(n, device=position_ids.device)):
            raise EngineError("the diffusers reference runs whole blocks without padding: use a prompt and gen_length that fill whole blocks")
        out = self.model(input_ids=input_ids, attention_mask=block_causal_mask(n, self.block_length, input_ids.device))
        out.logits[..., self.model.mask_token_id] = float("-inf")
        self.last_logits = out.logits[0, -self.block_length :].detach().float()
        return out


def record_diffusers(model, prompt: list[int], config: GenerationConfig, *, stop_ids: list[int] | None = None, token_strings=None, name: str | None = None) -> Trace:
    """diffusers' `LLaDA2Pipeline` on one tokenised prompt over the engine's LLaDA2 `model`,
    recorded step by step. threshold -> editing off; edit -> its edit threshold and post-mask
    steps; early_stop -> diffusers' own `eos_early_stop` (it freezes a row at its EOS block)."""
    import diffusers

    from .models.llada2 import LLaDA2MoeModelLM

    if not isinstance(model, LLaDA2MoeModelLM):
        raise EngineError(f"the diffusers reference runs LLaDA2Pipeline on an LLaDA2 checkpoint, not {type(model).__name__}")
    check_settings("diffusers", config)
    bl, p = config.block_length, len(prompt)
    if p % bl:
        raise EngineError(f"the diffusers reference needs a prompt of whole blocks ({p} tokens, blocks of {bl}): diffusers pads the prompt's block, the engine does not")
    editing = float(option(config, "edit_threshold")) if config.decoder == "edit" else None
    post = int(option(config, "max_post_edit_steps")) if config.decoder == "edit" else 16
    eos = list(stop_ids) if stop_ids else [int(model.eos_token_id)]
    mask = int(model.mask_token_id)
    adapter = DiffusersAdapter(model, bl)
    pipe = diffusers.LLaDA2Pipeline(model=adapter, scheduler=diffusers.BlockRefinementScheduler(), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    settings = {
        "gen_length": config.gen_length, "block_length": bl, "num_inference_steps": config.gen_length, "temperature": config.temperature,
        "sampling_method": "greedy" if config.temperature == 0 else "multinomial", "threshold": config.threshold, "editing_threshold": editing,
        "max_post_steps": post, "minimal_topk": 1, "eos_early_stop": config.early_stop, "mask_token_id": mask, "eos_token_id": eos[0],
    }
    n = p + config.gen_length
    canvas = prompt + [mask] * config.gen_length
    initial, records, clock = list(canvas), [], [time.perf_counter()]

    def on_step(_pipe, global_step: int, _step: int, k: dict) -> dict:
        window = k["block_x"].shape[1]
        s, e = window - bl, window
        after, before = k["block_x"][0, -bl:].tolist(), canvas[s:e]
        probs = k["sampled_probs"][0].float().tolist()
        committed = [s + w for w in range(bl) if before[w] == mask and after[w] != mask]
        edits = [{"position": s + w, "old": before[w], "new": after[w], "kind": "edit", "rule": "p(new) > editing threshold", "score": round(probs[w], 4), "bound": editing}
                 for w in range(bl) if before[w] != mask and after[w] != before[w]]
        canvas[s:e] = after
        logits = adapter.last_logits
        cands = _top(torch.softmax(logits, dim=-1)) if logits is not None else None
        now = time.perf_counter()
        records.append({
            "iteration": global_step, "block": s // bl - p // bl, "block_range": [s, e], "forward": "full", "recomputed": [[0, e]],
            "threshold": config.threshold, "committed": [committed], "forced": [[q for q in committed if probs[q - s] <= config.threshold]],
            "top1": [k["sampled_tokens"][0].tolist()], "confidence": [[round(v, 4) for v in probs]], "seconds": now - clock[-1], "extras": {}, "cost": None,
            "candidates": [[c if before[w] == mask else [] for w, c in enumerate(cands)]] if cands is not None else None,
            "revisions": [edits] if editing is not None else None, "uniform": None, "active": [True],
            "final_until": [s if editing is not None else next((q for q in range(p, n) if canvas[q] == mask), n)],
        })
        clock.append(now)
        return {}

    with torch.no_grad():
        out = pipe(input_ids=torch.tensor([prompt]), use_chat_template=False, output_type="seq", callback_on_step_end=on_step,
                   callback_on_step_end_tensor_inputs=["block_x", "sampled_tokens", "sampled_probs"], **settings)
    final = prompt + out.sequences[0].tolist()
    note = _reference_note(
        "diffusers", "LLaDA2Pipeline.__call__ (BlockRefinementScheduler)", ["callback_on_step_end", "the model adapter's logits"],
        ["the window after each step (block_x)", "sampled_tokens and sampled_probs", "the logits of each forward"],
        {"committed": "positions [MASK] before the step and written after it", "revisions": "committed positions the step changed",
         "forced": "committed positions whose probability does not exceed the threshold (the scheduler's quota)", "candidates": "softmax of the adapter's logits"},
        ["timings per forward (seconds: between callbacks)", "cost"],
        {k: v for k, v in settings.items()},
    )
    data = {
        "version": 3, "model": name or "diffusers:LLaDA2Pipeline", "kind": REFERENCE_KINDS["diffusers"], "capabilities": {"revises": editing is not None, "shadow_block": None},
        "mask_id": mask, "eos_ids": eos, "prompt_lengths": [p], "canvas_length": n, "block_length": bl,
        "config": {**config.to_dict(), "reference": note}, "initial": [initial], "tokens": {}, "expected": None, "iterations": records,
        "final": [final], "stats": {"nfe": len(records), "seconds": clock[-1] - clock[0]}, "trace_seconds": 0.0,
    }
    return _finish(data, token_strings)


# --- from a model folder ----------------------------------------------------------------------


def record_reference(reference: str, model_path: str, prompt: str, config: GenerationConfig, *, device: str = "cpu") -> Trace:
    """The command line's entry: load `model_path` as `reference` loads it, encode `prompt` with
    the folder's tokenizer (the chat template when `config.use_chat_template`), record the run."""
    from .models import load_model
    from .models.loader import resolve_model_path
    from .pipeline import load_tokenizer

    check_settings(reference, config)
    if not prompt or not prompt.strip():
        raise EngineError("empty prompt")
    folder = resolve_model_path(model_path)
    tokenizer = load_tokenizer(folder)
    ids = _encode(tokenizer, prompt, config.use_chat_template)

    def strings(found: set[int]) -> dict[str, str]:
        return {str(i): tokenizer.convert_ids_to_tokens(i) or "" for i in sorted(found)}

    if reference == "transformers":
        import json

        kind = json.loads((folder / "config.json").read_text()).get("model_type") if (folder / "config.json").is_file() else None
        if kind != "diffusion_gemma":
            raise EngineError(f"the transformers reference runs DiffusionGemma checkpoints (model_type diffusion_gemma), not {kind!r}")
        from transformers import DiffusionGemmaForBlockDiffusion

        model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), attn_implementation="eager").to(device).eval()
        return record_transformers(model, ids, config, token_strings=strings, name=folder.name)
    model = load_model(folder, device=device)
    return record_diffusers(model, ids, config, token_strings=strings, name=folder.name)


def _encode(tokenizer, prompt: str, use_chat_template: bool) -> list[int]:
    """The ids the engine's pipeline gives the prompt (engine/pipeline.py Engine.encode's rule)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]
