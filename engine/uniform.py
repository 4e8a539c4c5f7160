"""The uniform-state loop: DiffusionGemma's sampler as the engine runs it (docs/algorithms.md,
"Uniform-state diffusion (DiffusionGemma)").

Every canvas position always holds a token. Canvases (blocks) of `block_length` tokens are made
left to right; the prompt, then each finished canvas, is encoded once into the model's K/V cache.
Per canvas: start from uniformly random tokens; per denoising step (at most
`max_denoising_steps`, counted down N..1 as transformers does):
  1. one decoder forward over the canvas, fed the previous step's logits (self-conditioning);
  2. divide the logits by the temperature `t_min + (t_max - t_min) * n / N`;
  3. sample a proposal per position from them, and take their argmax (the draft);
  4. accept the proposals of the lowest-entropy positions while the summed entropy of those
     accepted, less the largest, stays <= `entropy_bound` (the lowest is always accepted);
  5. re-noise every position not accepted with a fresh uniform token;
  6. stop the canvas early when the draft has equalled the last `stability_threshold` drafts and
     the mean entropy is < `confidence_threshold` (per row; a stopped row is frozen).
The canvas's output is its last draft; a row whose canvas holds an end-of-text id ends there
(later ids pad) and the run ends when every row has ended.

Random draws come from the request's generator in transformers' order (initial canvas; then per
step the proposals, then the noise), so with the same seed this loop replays
`DiffusionGemmaForBlockDiffusion.generate` token for token (tests/test_diffusion_gemma.py).

The settings are declared as the `uniform` decoder's options (engine/registry.py), so the CLI's
`--decoder uniform --entropy-bound ...` and the app's controls carry them; that decoder refuses to
run on a masked model. Records carry the step in `IterationRecord.uniform` (docs/trace.md §2.2).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import torch

from .config import GenerationConfig
from .decoders import Decoder
from .entropy_bound import EntropyBoundDecoder
from .errors import EngineError
from .hooks import RunHooks
from .iteration import GenerationCancelled, GenerationOutput
from .models.diffusion_gemma import DiffusionGemmaLM
from .registry import DecoderOption, register_decoder
from .stats import GenerationStats, count_tokens, generated_mask
from .trace import Trace
from .uniform_trace import UniformStep, record_step

UNIFORM = "uniform"


@register_decoder
class UniformSampler(Decoder):
    """DiffusionGemma's entropy-bound sampler: its settings, for uniform-state models only.

    Defaults are transformers' (DiffusionGemmaGenerationConfig's global defaults); the loop is
    `run_uniform_diffusion`."""

    name = UNIFORM
    diffusion_kind = UNIFORM  # the models it runs on (engine/registry.py: builtin_decoder_names)
    explanation = (
        "**Uniform-state diffusion (DiffusionGemma).** Every position always holds a token: a canvas "
        "starts as uniformly random tokens (dimmed). Each step the model proposes a token for every "
        "position; the lowest-entropy proposals are accepted while their summed entropy, less the "
        "largest, stays within the bound (the EB-Sampler rule, arXiv 2505.24857), and every other "
        "position is re-noised with a fresh random token. The temperature cools linearly from t_max, "
        "the last step's logits feed the next (self-conditioning), and a canvas stops when its argmax "
        "draft has been stable and confident; its draft is the output (transformers' DiffusionGemma)."
    )
    uses_threshold = False
    settings = ()
    sweep_setting = EntropyBoundDecoder.sweep_setting
    options = {
        "entropy_bound": EntropyBoundDecoder.options["entropy_bound"],  # one rule, one setting (a flag, a control)
        "t_min": DecoderOption(0.4, "uniform: the temperature the linear schedule cools towards (its last step is one step above it)"),
        "t_max": DecoderOption(0.8, "uniform: the temperature of a canvas's first denoising step"),
        "max_denoising_steps": DecoderOption(48, "uniform: at most this many denoising steps per canvas"),
        "stability_threshold": DecoderOption(1, "uniform: stop a canvas once its argmax draft has not changed for this many steps (and it is confident)"),
        "confidence_threshold": DecoderOption(0.005, "uniform: a canvas stops early only when its mean entropy is also below this"),
    }

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        raise EngineError("decoder 'uniform' is the uniform-state sampler: it runs on uniform-state models (DiffusionGemma) only")


@dataclass(frozen=True)
class UniformSettings:
    """This run's values of the `uniform` decoder's options, checked as transformers checks them."""

    entropy_bound: float
    t_min: float
    t_max: float
    max_denoising_steps: int
    stability_threshold: int
    confidence_threshold: float

    @classmethod
    def from_config(cls, config: GenerationConfig) -> "UniformSettings":
        if config.decoder != UNIFORM:
            raise EngineError(f"a uniform-state model (DiffusionGemma) runs with decoder 'uniform', not '{config.decoder}' (its settings: {', '.join(UniformSampler.options)})")
        values = {f.name: config.decoder_options.get(f.name, UniformSampler.options[f.name].default) for f in fields(cls)}
        s = cls(**{k: float(v) if isinstance(UniformSampler.options[k].default, float) else v for k, v in values.items()})
        checks = [
            (s.entropy_bound > 0, f"entropy_bound must be > 0, got {s.entropy_bound}"),
            (0 <= s.t_min < s.t_max, f"the temperatures need 0 <= t_min < t_max, got t_min {s.t_min}, t_max {s.t_max}"),
            (s.max_denoising_steps >= 1, f"max_denoising_steps must be >= 1, got {s.max_denoising_steps}"),
            (s.stability_threshold >= 0, f"stability_threshold must be >= 0, got {s.stability_threshold}"),
            (s.confidence_threshold > 0, f"confidence_threshold must be > 0, got {s.confidence_threshold}"),
        ]
        for ok, message in checks:
            if not ok:
                raise EngineError(message)
        return s

    def temperature(self, steps_left: int, device: torch.device) -> torch.Tensor:
        """`t_min + (t_max - t_min) * n / N` for `n` steps left, in float32 as transformers computes it
        (LinearTemperatureScheduleLogitsProcessor on an int32 step), so the logits divide alike."""
        n = torch.tensor(steps_left, dtype=torch.int32, device=device)
        return self.t_min + (self.t_max - self.t_min) * (n / self.max_denoising_steps)


class _StableAndConfident:
    """The adaptive stop: a row stops when its draft equals each of the last `stability` drafts
    (none kept yet counts as different) and its mean entropy is below `confidence`."""

    def __init__(self, stability: int, confidence: float) -> None:
        self.stability, self.confidence = stability, confidence
        self.history: torch.Tensor | None = None

    def reset(self) -> None:
        self.history = None

    def __call__(self, draft: torch.Tensor, mean_entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(stable, confident) per row, after adding `draft` to the history."""
        if self.stability == 0:
            stable = torch.ones(draft.shape[0], dtype=torch.bool, device=draft.device)
        else:
            if self.history is None:
                self.history = torch.full((self.stability, *draft.shape), -1, dtype=draft.dtype, device=draft.device)
            stable = (self.history == draft.unsqueeze(0)).all(dim=-1).all(dim=0)
            self.history = torch.cat([self.history[1:], draft.unsqueeze(0)])
        return stable, mean_entropy < self.confidence


class _UniformRun:
    """State of one uniform-state run; `run` is the loop."""

    def __init__(self, model: DiffusionGemmaLM, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks) -> None:
        self.model, self.cfg, self.hooks, self.stop_ids = model, config, hooks, stop_ids
        self.settings = UniformSettings.from_config(config)
        model.check_text_only(prompts)
        self.device = model.device
        self.pad = model.mask_token_id
        self.width = config.block_length
        self.prompt_length = max(len(p) for p in prompts)
        # rows left-padded to one prompt length, as transformers batches them (attention masks out the pad)
        self.length = self.prompt_length + config.gen_length
        x = torch.full((len(prompts), self.length), self.pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), self.prompt_length), dtype=torch.bool)
        for row, p in enumerate(prompts):
            x[row, self.prompt_length - len(p) : self.prompt_length] = torch.tensor(p, dtype=torch.long)
            attention[row, self.prompt_length - len(p) :] = True
        self.x, self.attention = x.to(self.device), attention.to(self.device)
        self.generator = torch.Generator(self.device).manual_seed(config.seed)
        self.stopper = _StableAndConfident(self.settings.stability_threshold, self.settings.confidence_threshold)
        self.nfe = self.iteration = self.host_syncs = 0
        self.excluded_seconds = 0.0  # trace recording and callbacks
        self.recorder = hooks.begin_trace(
            model, config, mask_id=self.pad, stop_ids=stop_ids, prompt_lengths=[self.prompt_length] * len(prompts),
            canvas_length=self.length, block_length=self.width, initial=self.x.cpu().tolist(),
        )
        self.trace: Trace | None = self.recorder.trace if self.recorder is not None else None

    def _random_tokens(self) -> torch.Tensor:
        return torch.randint(0, self.model.vocab_size, (self.x.shape[0], self.width), generator=self.generator, device=self.device)

    def run(self) -> GenerationOutput:
        if self.hooks.on_start is not None and self.recorder is not None:  # before the clock starts
            self.hooks.on_start(self.recorder.header())
        start = time.perf_counter()
        rows = self.x.shape[0]
        p = self.prompt_length
        cache = self.model.new_cache()
        ended = torch.zeros(rows, dtype=torch.bool, device=self.device)  # rows past an end-of-text id
        attention = self.attention
        for block in range(self.cfg.num_blocks()):
            s, e = p + block * self.width, p + (block + 1) * self.width
            encoded = (0, p) if block == 0 else (s - self.width, s)  # the prompt, else the last canvas
            positions = torch.arange(*encoded, dtype=torch.int32, device=self.device).unsqueeze(0)
            self.model.encode(self.x[:, encoded[0] : encoded[1]], attention, positions, cache)
            self.nfe += 1
            attention = torch.nn.functional.pad(attention, (0, self.width), value=True)
            ended = self._denoise_canvas(block, s, e, cache, attention, ended)
            self.host_syncs += 1
            if bool(ended.all()):
                break
        return self._output(start)

    def _denoise_canvas(self, block: int, s: int, e: int, cache: Any, attention: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        """Denoise canvas `[s, e)` into `self.x`; returns the rows ended after it."""
        settings, rows = self.settings, self.x.shape[0]
        canvas = self._random_tokens()
        start_tokens = canvas
        masks = self.model.decoder_masks(canvas, cache, attention)
        positions = torch.arange(s, e, dtype=torch.int32, device=self.device).unsqueeze(0)
        self_conditioning: torch.Tensor | None = None
        draft = canvas
        stopped = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.stopper.reset()
        total = settings.max_denoising_steps
        for step, steps_left in enumerate(range(total, 0, -1)):
            if self.hooks.cancel is not None and self.hooks.cancel.is_set():
                raise GenerationCancelled("generation cancelled")
            t0 = time.perf_counter()
            active = ~stopped
            logits = self.model.denoise(canvas, cache, masks, positions, self_conditioning)
            self.nfe += 1
            temperature = settings.temperature(steps_left, self.device)
            scaled = logits / temperature
            probs = torch.softmax(scaled, dim=-1, dtype=torch.float32)
            proposal = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=self.generator).view(rows, -1)
            new_draft = scaled.argmax(dim=-1)
            position_entropy = EntropyBoundDecoder.entropy(scaled)
            accepted, lower_sum = EntropyBoundDecoder.accept(position_entropy, settings.entropy_bound)
            noise = self._random_tokens()
            next_canvas = torch.where(accepted, proposal, noise)
            if self_conditioning is not None:  # a stopped row keeps its canvas, draft and logits
                new_draft = torch.where(stopped[:, None], draft, new_draft)
                next_canvas = torch.where(stopped[:, None], canvas, next_canvas)
                scaled = torch.where(stopped[:, None, None], self_conditioning, scaled)
            mean_entropy = EntropyBoundDecoder.entropy(scaled).mean(dim=-1)
            stable, confident = self.stopper(new_draft, mean_entropy)
            stopped = stopped | (stable & confident)
            canvas, draft = next_canvas, new_draft
            self_conditioning = scaled.to(self.model.dtype)
            last = steps_left == 1 or bool(stopped.all())
            self.host_syncs += 1
            if last:
                ended = self._finish_canvas(s, e, draft, ended)
            if self.recorder is not None:
                step_state = UniformStep(
                    block=block, block_range=(s, e), step=step, steps_left=steps_left, temperature=float(temperature),
                    bound=settings.entropy_bound, active=active, accepted=accepted & active[:, None], proposal=proposal,
                    confidence=probs.gather(-1, proposal.unsqueeze(-1)).squeeze(-1), noise=noise, entropy=position_entropy,
                    lower_sum=lower_sum, draft=draft, stable=stable, confident=confident, mean_entropy=mean_entropy, stopped=stopped,
                    stability_threshold=settings.stability_threshold, confidence_threshold=settings.confidence_threshold,
                    start=start_tokens if step == 0 else None, output=self.x[:, s:e] if last else None,
                )
                self._record(step_state, time.perf_counter() - t0)
            if last:
                break
        return ended

    def _finish_canvas(self, s: int, e: int, draft: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        """Write the canvas's output (its last draft) and end rows: with early stop, a row that had
        ended pads the whole canvas, and after a canvas's first end-of-text id the rest pads."""
        tokens = draft
        if self.cfg.early_stop:
            stop = torch.tensor(self.stop_ids, device=self.device)
            ended_now = torch.isin(tokens, stop).any(dim=-1)
            tokens = torch.where(ended[:, None], torch.full_like(tokens, self.pad), tokens)
            is_stop = torch.isin(tokens, stop)
            seen = is_stop.cumsum(dim=-1)
            tokens = torch.where((seen > 0) & ~((seen == 1) & is_stop), torch.full_like(tokens, self.pad), tokens)
            ended = ended | ended_now
        self.x[:, s:e] = tokens
        return ended

    def _record(self, step: UniformStep, seconds: float) -> None:
        t0 = time.perf_counter()
        rec = record_step(self.recorder, self.iteration, step, seconds)
        if self.hooks.on_iteration is not None:
            self.hooks.on_iteration(rec)
        self.iteration += 1
        self.excluded_seconds += time.perf_counter() - t0

    def _output(self, start: float) -> GenerationOutput:
        prompt_lengths = [self.prompt_length] * self.x.shape[0]
        keep = generated_mask(self.x, prompt_lengths, self.stop_ids, self.pad)
        token_ids = [row[k].tolist() for row, k in zip(self.x.cpu(), keep.cpu())]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats = GenerationStats(
            nfe=self.nfe,
            tokens=sum(count_tokens(self.x, prompt_lengths, self.stop_ids, self.pad)),
            seconds=time.perf_counter() - start - self.excluded_seconds,
            batch=self.x.shape[0],
            trace_seconds=self.excluded_seconds,
            host_syncs=self.host_syncs,
        )
        if self.recorder is not None:
            self.recorder.finish(self.x.cpu().tolist(), stats.to_dict(), self.excluded_seconds)
        return GenerationOutput(self.x, prompt_lengths, token_ids, stats, self.trace)


@torch.inference_mode()
def run_uniform_diffusion(model: DiffusionGemmaLM, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], hooks: RunHooks) -> GenerationOutput:
    """The uniform-state loop on a checked request, for a model with `diffusion_kind == "uniform"`
    (the calls it makes: DiffusionGemmaLM's `new_cache`, `encode`, `decoder_masks`, `denoise`)
    (engine/generation.py: `run_diffusion` checks the request and installs the between-layer
    cancel, then calls the loop of the model's kind). `stop_ids`: the ids that end a row."""
    if model.diffusion_kind != UNIFORM:
        raise EngineError(f"{type(model).__name__} is a {model.diffusion_kind} diffusion model: the uniform-state loop runs DiffusionGemma")
    return _UniformRun(model, prompts, config, stop_ids or [model.eos_token_id], hooks).run()
