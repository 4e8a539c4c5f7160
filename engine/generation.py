"""The engine's token-level entry point: fit the request to its kind (the request's, else the
model's own), check it, then run that kind's loop (engine/kinds/) under the caller's hooks
(engine/hooks.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from .cache import check_attention
from .config import GenerationConfig
from .constraints import CanvasConstraint, Compiler, spec_of
from .constraints.canvas import checked_by
from .errors import EngineError
from .hooks import NO_HOOKS, CancelFlag, RunHooks
from .infill import Layouts
from .kinds import fit, run_kind
from .models.base import DiffusionLM
from .run import GenerationCancelled, GenerationOutput, cancel_between_layers, check_canvas


def fit_request(
    model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, max_tokens: int | None = None, vocabulary: Compiler | None = None,
    layouts: Layouts | None = None,
) -> GenerationConfig:
    """The config as `model` runs it (engine/kinds/base.py: `fit`), after every check a request gets
    before any forward: the config's rules, the kind's settings, the prompt, the canvas's length,
    and, given the tokenizer's `vocabulary`, that the answer's constraint fits the canvas (the row
    with the longest prompt has the least room). Reads only the model's config, so a model
    skeleton (no weights) can answer it. `layouts`: each row's pinned text (engine/infill.py), tokenised."""
    return check_fitted(model, prompts, fit(config, model), max_tokens, vocabulary, layouts)  # fit validates the fitted config


def check_settings(config: GenerationConfig, model: Any) -> GenerationConfig:
    """The checks of a config that need no prompt: `fit`'s (the kind, its settings, the decoder's
    rules) and the model's attention's (`check_attention`), the config as the model runs it;
    `model` a model, a skeleton or its `ModelTraits`. The tuner's space offers no choice that this
    refuses (engine/tuning/space.py)."""
    fitted = fit(config, model)
    check_attention(model, fitted)
    return fitted


def check_fitted(
    model: DiffusionLM, prompts: list[list[int]], fitted: GenerationConfig, max_tokens: int | None = None, vocabulary: Compiler | None = None,
    layouts: Layouts | None = None,
) -> GenerationConfig:
    """`fit_request`'s checks of the prompt on a config `fit` already gave for `model` (the CLI
    fits on the model's skeleton before loading it): not validated again."""
    check_canvas(model, prompts, fitted, max_tokens, layouts)
    check_attention(model, fitted)
    if vocabulary is not None and spec_of(fitted) is not None:
        longest = max(len(p) for p in prompts)
        CanvasConstraint.build([spec_of(fitted)], vocabulary, [longest], longest + fitted.gen_length)
    return fitted


@torch.inference_mode()
def run_diffusion(
    model: DiffusionLM, prompts: list[list[int]], config: GenerationConfig, *, stop_ids: list[int] | None = None, hooks: RunHooks = NO_HOOKS,
    vocabulary: Compiler | None = None,
) -> GenerationOutput:
    """Generate for a batch of tokenised prompts.

    `stop_ids`: the ids that end a row (EOS first, then EoT); defaults to the model's EOS. `hooks`:
    what the run reports (trace, `on_start` with the header before the first forward,
    `on_iteration` with each record) and obeys (`cancel`, checked between groups of iterations and
    between layers: GenerationCancelled; `max_tokens`, the caller's bound on the canvas).
    `vocabulary`: the tokenizer's tokens (engine.constraints.TokenVocabulary), which a constraint
    (the config's `regex`, `json_schema` or `choice`, or the hooks' per row) is compiled over.
    """
    config = fit_request(model, prompts, config, hooks.max_tokens, layouts=hooks.layouts)
    return run_fitted(model, prompts, config, stop_ids=stop_ids, hooks=hooks, vocabulary=vocabulary)


@torch.inference_mode()
def run_fitted(
    model: DiffusionLM, prompts: list[list[int]], fitted: GenerationConfig, *, stop_ids: list[int] | None = None, hooks: RunHooks = NO_HOOKS,
    vocabulary: Compiler | None = None,
) -> GenerationOutput:
    """`run_diffusion` on a config already fitted and checked for these prompts (`fit_request`):
    a parallel engine's workers run the parent's fitted config, never fitting or validating it again."""
    if model.device.type == "meta":
        raise EngineError("this model has no weights in this process (a parallel Engine's live in its workers): generate through Engine.generate")
    if fitted.pins() and hooks.layouts is None:
        raise EngineError("suffix and template are text: generate through Engine.generate, which tokenises them, or give RunHooks.layouts")
    run = run_kind(fitted, model).run
    with cancel_between_layers(model, hooks.cancel), checked_by(partial(_cancelled, hooks.cancel)):
        return run(model, prompts, fitted, stop_ids or [model.eos_token_id], hooks, vocabulary).run()


def _cancelled(cancel: CancelFlag | None) -> None:
    """The check a constraint's pass over a long region makes (engine/constraints/canvas.py:
    checked_by), so a cancel stops it there and not only at the loop's next step."""
    if cancel is not None and cancel.is_set():
        raise GenerationCancelled("generation cancelled")
