"""The engine's token-level entry point: check a request, then run the diffusion loop of the
model's kind (masked: engine/iteration.py; uniform: engine/uniform.py) under the caller's hooks
(engine/hooks.py)."""

from __future__ import annotations

import torch

from .config import GenerationConfig
from .errors import EngineError
from .hooks import NO_HOOKS, RunHooks
from .iteration import GenerationOutput, cancel_between_layers, check_request, run_masked_diffusion
from .models.base import DiffusionLM
from .uniform import run_uniform_diffusion

LOOPS = {"masked": run_masked_diffusion, "uniform": run_uniform_diffusion}


@torch.inference_mode()
def run_diffusion(
    model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, *, stop_ids: list[int] | None = None, hooks: RunHooks = NO_HOOKS
) -> GenerationOutput:
    """Generate for a batch of tokenised prompts.

    `stop_ids`: the ids that end a row (EOS first, then EoT); defaults to the model's EOS. `hooks`:
    what the run reports (trace, `on_start` with the header before the first forward,
    `on_iteration` with each record) and obeys (`cancel`, checked between groups of iterations and
    between layers: GenerationCancelled; `max_tokens`, the caller's bound on the canvas).
    """
    check_request(model, prompts, config, hooks.max_tokens)
    if model.device.type == "meta":
        raise EngineError("this model has no weights in this process (a parallel Engine's live in its workers): generate through Engine.generate")
    loop = LOOPS.get(model.diffusion_kind)
    if loop is None:
        raise EngineError(f"no decoding loop for diffusion kind {model.diffusion_kind!r}; known: {', '.join(LOOPS)}")
    with cancel_between_layers(model, hooks.cancel):
        return loop(model, prompts, config, stop_ids or [model.eos_token_id], hooks)
