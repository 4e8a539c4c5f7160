"""Uniform-state diffusion: DiffusionGemma's sampler as the engine runs it (docs/algorithms.md §9).

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
`DiffusionGemmaForBlockDiffusion.generate` token for token (tests/test_diffusion_gemma.py). The
server runs each request as its own run (its own generator) and packs the runs' denoising
forwards into one (DiffusionGemmaLM.run_packed; docs/serving.md §3).

The sampler is the kind's decoder (`uniform`), whose options carry the settings; the kind reads
no other generation setting and refuses them (engine/kinds/base.py: fit). Records: docs/trace.md §3.2.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..config import GenerationConfig
from ..decoders import Block, DecodeResult, Decoder
from ..decoders.entropy_bound import EntropyBoundDecoder
from ..errors import EngineError
from ..models.diffusion_gemma import DiffusionGemmaLM
from ..registry import DecoderOption, register_decoder
from ..run import DiffusionRun
from ..step_state import StepState, Writes, id_lists, per_position, register_step_state
from ..trace import UNIFORM, IterationRecord, positions, rounded
from .base import DiffusionKind, KindSettings, register_kind

MAX_STEPS = 1024  # denoising steps per canvas, at most: a request's work stays bounded


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """`EntropyBoundDecoder.entropy` (torch's `Categorical(logits=).entropy()`, the rule transformers
    uses) computed by the same operations in the same order, so bit for bit the same, without
    building the distribution object and validating its argument: a quarter of that call's time
    on a small canvas, paid twice per step."""
    logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    return -(logits.clamp(min=torch.finfo(logits.dtype).min) * probs).sum(-1)


@register_decoder
class UniformSampler(Decoder):
    """DiffusionGemma's entropy-bound sampler, one denoising step: sample a proposal per position,
    accept the lowest-entropy proposals within the bound. Defaults are transformers'
    (DiffusionGemmaGenerationConfig's global defaults)."""

    name = UNIFORM
    order = 70  # beside entropy_bound, whose rule it applies to the whole canvas
    kind = UNIFORM
    references = ("transformers",)  # DiffusionGemma's generate
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
    options: ClassVar[dict[str, DecoderOption]] = {
        # one rule, one setting (a flag, a control); transformers takes only a positive bound
        "entropy_bound": dataclasses.replace(EntropyBoundDecoder.options["entropy_bound"], above=True),
        "t_min": DecoderOption(0.4, "uniform: the temperature the linear schedule cools towards (its last step is one step above it)", least=0.0),
        "t_max": DecoderOption(0.8, "uniform: the temperature of a canvas's first denoising step", least=0.0, above=True),
        "max_denoising_steps": DecoderOption(48, "uniform: at most this many denoising steps per canvas", least=1, most=MAX_STEPS),
        "stability_threshold": DecoderOption(1, "uniform: stop a canvas once its argmax draft has not changed for this many steps (and it is confident)", least=0, most=MAX_STEPS),
        "confidence_threshold": DecoderOption(0.005, "uniform: a canvas stops early only when its mean entropy is also below this", least=0.0, above=True),
    }
    increasing = (("t_min", "t_max"),)  # the schedule cools from t_max towards t_min

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.bound = float(self.option("entropy_bound"))
        self.t_min, self.t_max = float(self.option("t_min")), float(self.option("t_max"))
        self.steps = int(self.option("max_denoising_steps"))

    def temperature(self, steps_left: int, device: torch.device) -> torch.Tensor:
        """`t_min + (t_max - t_min) * n / N` for `n` steps left, in float32 as transformers computes it
        (LinearTemperatureScheduleLogitsProcessor on an int32 step), so the logits divide alike."""
        n = torch.tensor(steps_left, dtype=torch.int32, device=device)
        return self.t_min + (self.t_max - self.t_min) * (n / self.steps)

    def commit_order(self, result: DecodeResult) -> torch.Tensor:
        return -result.extras["entropy"]  # lowest entropy first, the acceptance's own order

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        """`logits`: the temperature-scaled logits `[B, W, V]`. Tokens: the sampled proposals and
        their probabilities; commit: the accepted ones; extras: entropy and the rule's sum."""
        rows = logits.shape[0]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        proposal = torch.multinomial(probs.view(-1, probs.shape[-1]), 1, generator=self.generator).view(rows, -1)
        entropies = entropy(logits)
        accepted, lower_sum = EntropyBoundDecoder.accept(entropies, self.bound)
        # no forced commits: the lowest-entropy position passes the rule by itself
        return DecodeResult(
            proposal, probs.gather(-1, proposal.unsqueeze(-1)).squeeze(-1), accepted, torch.zeros_like(accepted),
            extras={"entropy": entropies, "entropy_sum": lower_sum},
        )


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


@dataclass
class _Step:
    """One denoising step's tensors, for its record (`[B, W]` per position, `[B]` per row)."""

    block: int
    span: tuple[int, int]
    step: int
    steps_left: int
    temperature: float
    active: torch.Tensor
    result: DecodeResult
    draft: torch.Tensor
    draft_probability: torch.Tensor
    noise: torch.Tensor
    stable: torch.Tensor
    confident: torch.Tensor
    mean_entropy: torch.Tensor
    stopped: torch.Tensor
    start: torch.Tensor | None
    output: torch.Tensor | None
    constraint: dict[str, Any] | None = None  # the record's `constraint` (engine/constraints/canvas.py: Restriction.record)


class UniformRun(DiffusionRun):
    """One uniform-state run; `run_blocks` is the loop (the calls it makes of the model:
    DiffusionGemmaLM's `new_cache`, `encode`, `decoder_masks`, `denoise`)."""

    kind = UNIFORM

    def setup(self, prompts: list[list[int]]) -> None:
        model: DiffusionGemmaLM = self.model  # this kind's models: engine/models/diffusion_gemma.py
        config = self.cfg
        model.check_text_only(prompts)
        self.sampler = UniformSampler(config, model.mask_token_id, self.generator)
        self.pad = model.mask_token_id
        self.width = config.block_length
        self.prompt_length = max(len(p) for p in prompts)
        # rows left-padded to one prompt length, as transformers batches them (attention masks out the pad)
        x = torch.full((len(prompts), self.prompt_length + config.gen_length), self.pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), self.prompt_length), dtype=torch.bool)
        for row, p in enumerate(prompts):
            x[row, self.prompt_length - len(p) : self.prompt_length] = torch.tensor(p, dtype=torch.long)
            attention[row, self.prompt_length - len(p) :] = True
        self.begin([self.prompt_length] * len(prompts), x, self.pad, self.sampler.capabilities())
        self.attention = attention.to(self.device)
        self.stopper = _StableAndConfident(int(self.sampler.option("stability_threshold")), float(self.sampler.option("confidence_threshold")))
        self.final_until = [self.prompt_length] * len(prompts)

    def _random_tokens(self) -> torch.Tensor:
        return torch.randint(0, self.model.vocab_size, (self.x.shape[0], self.width), generator=self.generator, device=self.device)

    def run_blocks(self) -> None:
        p = self.prompt_length
        cache = self.model.new_cache()
        ended = torch.zeros(self.x.shape[0], dtype=torch.bool, device=self.device)  # rows past an end-of-text id
        attention = self.attention
        for block in range(self.cfg.num_blocks()):
            s, e = p + block * self.width, p + (block + 1) * self.width
            encoded = (0, p) if block == 0 else (s - self.width, s)  # the prompt, else the last canvas
            positions_ = torch.arange(*encoded, dtype=torch.int32, device=self.device).unsqueeze(0)
            encoding = time.perf_counter()  # the canvas's first step's time includes its encoder forward, as its record counts it
            self.metered(lambda: self.model.encode(self.x[:, encoded[0] : encoded[1]], attention, positions_, cache))  # the canvas's first record counts it
            attention = torch.nn.functional.pad(attention, (0, self.width), value=True)
            ended = self._denoise_canvas(block, s, e, cache, attention, ended, encoding)
            self.host_syncs += 1
            if bool(ended.all()):
                break

    def _denoise_canvas(self, block: int, s: int, e: int, cache: Any, attention: torch.Tensor, ended: torch.Tensor, encoding: float) -> torch.Tensor:
        """Denoise canvas `[s, e)` into `self.x` (its encoder forward began at `encoding`); returns the rows ended after it."""
        rows = self.x.shape[0]
        canvas = self._random_tokens()
        start_tokens = canvas
        masks = self.model.decoder_masks(canvas, cache, attention)
        positions_ = torch.arange(s, e, dtype=torch.int32, device=self.device).unsqueeze(0)
        self_conditioning: torch.Tensor | None = None
        draft = canvas
        stopped = torch.zeros(rows, dtype=torch.bool, device=self.device)
        nothing = torch.zeros_like(canvas, dtype=torch.bool)
        self.stopper.reset()
        for step, steps_left in enumerate(range(self.sampler.steps, 0, -1)):
            self.check_cancel()
            t0 = encoding if step == 0 else time.perf_counter()
            active = ~stopped
            logits = self.metered(lambda: self.model.denoise(canvas, cache, masks, positions_, self_conditioning))
            temperature = self.sampler.temperature(steps_left, self.device)
            scaled = logits / temperature
            decided, restriction, dropped = scaled, None, None  # what the sampler and the draft read
            if self.constraint is not None:  # this canvas and the later ones are open, the earlier ones fixed
                open_ = torch.arange(self.x.shape[1], device=self.device).expand_as(self.x) >= s
                decided, restriction = self.constraint.restrict(scaled, self.x, open_, s, ~nothing)
            result = self.sampler.step(decided, Block(nothing, canvas, ~nothing, 0.0))
            if self.constraint is not None:  # acceptances and the draft jointly completable, in the sampler's order
                order = self.sampler.commit_order(result)
                kept = self.constraint.admit(self.x, open_, s, result.commit, result.tokens, order)
                result.commit, dropped = kept, result.commit & ~kept
                new_draft = self.constraint.draft(decided, self.x, open_, s, order)
            else:
                new_draft = scaled.argmax(dim=-1)
            noise = self._random_tokens()
            next_canvas = torch.where(result.commit, result.tokens, noise)
            recomputed = False
            if self_conditioning is not None:  # a stopped row keeps its canvas, draft and logits
                new_draft = torch.where(stopped[:, None], draft, new_draft)
                next_canvas = torch.where(stopped[:, None], canvas, next_canvas)
                scaled = torch.where(stopped[:, None, None], self_conditioning, scaled)
                recomputed = self.records  # a stopped row's entropy of its kept logits, for its record
            # the rows still going kept their logits, so the sampler's entropy is theirs; a stopped
            # row's value decides nothing (it stays stopped), only a record shows it
            sampled = result.extras["entropy"]
            mean_entropy = (torch.where(stopped[:, None], entropy(scaled), sampled) if recomputed else sampled).mean(dim=-1)
            stable, confident = self.stopper(new_draft, mean_entropy)
            stopped = stopped | (stable & confident)
            canvas, draft = next_canvas, new_draft
            self_conditioning = scaled.to(self.model.dtype)
            last = steps_left == 1 or bool(stopped.all())
            self.host_syncs += 1
            if last:
                ended = self._finish_canvas(s, e, draft, ended)
            if self.records:
                result.commit = result.commit & active[:, None]
                draft_probability = torch.softmax(scaled, dim=-1, dtype=torch.float32).gather(-1, draft.unsqueeze(-1)).squeeze(-1)
                state = _Step(
                    block, (s, e), step, steps_left, float(temperature), active, result, draft, draft_probability, noise,
                    stable, confident, mean_entropy, stopped, start_tokens if step == 0 else None, self.x[:, s:e] if last else None,
                    restriction.record(scaled, None, dropped, s) if restriction is not None else None,
                )
                state_seconds = time.perf_counter() - t0
                emitted = time.perf_counter()
                self.emit(self._record(state, state_seconds), emitted)
            self.iteration += 1
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

    def _record(self, st: _Step, seconds: float) -> IterationRecord:
        """The step's record (docs/trace.md §3.2): `top1` the draft, `committed` the accepted
        positions; `state` the proposal, the rule's numbers, the re-noising and the stop rule."""
        s, e = st.span
        result = st.result
        renoised = ~result.commit & st.active[:, None]
        noise = st.noise.cpu().tolist()
        where = [row.nonzero().flatten().tolist() for row in renoised.cpu()]
        if st.output is not None:  # the canvas is written: final for every row
            self.final_until = [max(f, e) for f in self.final_until]
        return IterationRecord(
            iteration=self.iteration, block=st.block, block_range=[s, e], forward="denoise", recomputed=[[s, e]], threshold=None,
            committed=positions(result.commit, s), forced=[[] for _ in noise], top1=st.draft.cpu().tolist(),
            confidence=rounded(st.draft_probability), seconds=seconds, active=st.active.cpu().tolist(), final_until=list(self.final_until),
            constraint=st.constraint,
            state={
                "step": st.step,
                "steps_left": st.steps_left,
                "temperature": round(st.temperature, 6),
                "bound": self.sampler.bound,
                "proposal": result.tokens.cpu().tolist(),
                "proposal_probability": rounded(result.confidence),
                "entropy": rounded(result.extras["entropy"]),
                "entropy_sum": rounded(result.extras["entropy_sum"]),
                "draft": st.draft.cpu().tolist(),
                "renoised": [[p + s for p in row] for row in where],
                "noise": [[noise[r][p] for p in row] for r, row in enumerate(where)],
                "start": st.start.cpu().tolist() if st.start is not None else None,
                "output": st.output.cpu().tolist() if st.output is not None else None,
                "stopping": {
                    "stable": st.stable.cpu().tolist(),
                    "confident": st.confident.cpu().tolist(),
                    "mean_entropy": rounded(st.mean_entropy),
                    "stopped": st.stopped.cpu().tolist(),
                    "stability_threshold": self.stopper.stability,
                    "confidence_threshold": self.stopper.confidence,
                },
            },
        )


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class UniformStepState(StepState):
    """A uniform step's `state` (docs/trace.md §3.2): what a replay reads and writes of it."""

    def check(self, state: dict[str, Any], rows: int, s: int, e: int, need: Any) -> None:
        for name in ("proposal", "draft"):
            per_position(state, name, rows, e - s, _is_id, need)
        renoised, noise = state.get("renoised"), state.get("noise")
        need(isinstance(renoised, list) and isinstance(noise, list) and len(renoised) == len(noise) == rows, "state: renoised and noise need one list per row")
        for row in range(rows):
            ok = isinstance(renoised[row], list) and isinstance(noise[row], list) and len(renoised[row]) == len(noise[row])
            need(ok and all(_is_id(p) and s <= p < e for p in renoised[row]) and all(map(_is_id, noise[row])), f"state.renoised[{row}] must be positions inside the canvas, one noise id each")
        for name in ("start", "output"):
            if state.get(name) is not None:
                per_position(state, name, rows, e - s, _is_id, need)

    def writes(self, rec: Any, row: int) -> Writes:
        """A canvas's starting noise (first step), the accepted proposals, the fresh noise at the
        positions not accepted, the canvas's output (last step)."""
        s, e = rec.block_range
        u = rec.state
        writes: Writes = list(zip(range(s, e), u["start"][row])) if u.get("start") is not None else []
        writes += [(p, u["proposal"][row][p - s]) for p in rec.committed[row]]  # it accepts its sampled proposals
        writes += zip(u["renoised"][row], u["noise"][row])
        if u.get("output") is not None:
            writes += zip(range(s, e), u["output"][row])
        return writes

    def ids(self, state: dict[str, Any]) -> set[int]:
        return id_lists(state, "proposal", "draft", "noise", "start", "output")

    def current(self, rec: Any, row: int, canvas: list[int], mask: int) -> list[int | None]:
        """Earlier canvases' outputs, the current canvas's argmax draft (`top1`; its output once its
        last step wrote it), nothing past it: a uniform canvas holds noise, never [MASK]."""
        s, e = rec.block_range
        done = (rec.state or {}).get("output") is not None
        return [canvas[p] if p < s or (done and p < e) else rec.top1[row][p - s] if p < e else None for p in range(len(canvas))]

    def written(self, rec: Any, canvas: list[int], p: int, mask: int) -> bool:
        return p < rec.block_range[0]  # earlier canvases are final; the current one is noise

    def open_positions(self, rec: Any, before: list[int], mask: int) -> list[int]:
        return list(range(*rec.block_range))  # every position of the canvas is denoised each step

    def converged(self, records: list[Any], last: list[Any], row: int, open_left: bool) -> bool | None:
        """Every canvas's last step stopped by the adaptive rule (not at the step limit); None when
        the trace lacks the stop rule's state."""
        stops = [((rec.state or {}).get("stopping") or {}).get("stopped") for rec in last]
        return None if any(s is None for s in stops) else all(bool(s[row]) for s in stops)


register_step_state(UNIFORM, UniformStepState())


def fit_canvas(config: GenerationConfig, canvas_length: int, carry_over: bool) -> GenerationConfig:
    """A uniform-state checkpoint denoises canvases of the length it was trained with
    (transformers' generate knows no other): the block length is that canvas, and the generation
    length whole canvases (rounded up). A block length set to another value is refused, unless the
    settings are carried over from another model's page."""
    if not carry_over and config.block_length not in (canvas_length, GenerationConfig.block_length):
        raise EngineError(f"this uniform-state model denoises canvases of {canvas_length} tokens: block_length {config.block_length} is not supported (leave it at the default)")
    if config.gen_length < 1:  # left for fit's validation to refuse, not rounded up to a canvas
        return config
    length = max(canvas_length, -(-config.gen_length // canvas_length) * canvas_length)
    return dataclasses.replace(config, block_length=canvas_length, gen_length=length)


@register_kind
class UniformKind(DiffusionKind):
    """Uniform-state diffusion reads only the settings every run shares (its sampler's are the
    `uniform` decoder's options), and runs compiled or eagerly in one process."""

    name = UNIFORM
    run = UniformRun
    summary = "every position holds a token from the start; each step resamples the canvas and keeps its lowest-entropy proposals"
    settings = KindSettings(
        reads=frozenset(), default_decoder=UNIFORM, system_options=frozenset({"compile"}),
        # a run's rows draw proposals and noise from one generator in batch order (transformers'),
        # so requests are never rows of one run; each is its own run, its denoising forwards packed
        # with other runs' (DiffusionGemmaLM.run_packed)
        shares_batches=False,
        fit_canvas=fit_canvas,
    )
