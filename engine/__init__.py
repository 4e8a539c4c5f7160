"""dinfer-viz engine: diffusion LM inference (masked: LLaDA, LLaDA-MoE, LLaDA2; uniform-state:
DiffusionGemma; self-speculative on block-causal models) with dInfer's four components.

- model: `engine.models` (families, registry, checkpoint loader)
- diffusion iteration manager: `engine.run` (the skeleton every kind shares), `engine.kinds` (one
  file per kind, discovered; more from $DINFER_VIZ_KINDS) and `engine.fill` (a rule-only kind's run)
- decoders: `engine.decoders` (one file per family of rules, each imported with the package)
- KV-cache manager: `engine.cache`

Public API: load_model, load_tokenizer, run_diffusion (token level), Engine (text level),
RunHooks (what a run reports and obeys), GenerationConfig, Trace, EngineError. The engine never imports the app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy_exports import lazy_exports

# Each public name and the module that defines it, imported on first use (lazy_exports.py).
_DEFINED_IN = {
    "GenerationConfig": "config",
    "Decoder": "decoders",
    "EngineError": "errors",
    "run_diffusion": "generation",
    "RunHooks": "hooks",
    "fit": "kinds",
    "load_model": "models",
    "save_model": "models",
    "Engine": "pipeline",
    "load_tokenizer": "pipeline",
    "DecoderOption": "registry",
    "decoder_names": "registry",
    "register_decoder": "registry",
    "GenerationCancelled": "run",
    "GenerationOutput": "run",
    "every_run_stopped": "run",
    "GenerationStats": "stats",
    "IterationRecord": "trace",
    "Trace": "trace",
}
__all__ = sorted(_DEFINED_IN)

if TYPE_CHECKING:
    from .config import GenerationConfig
    from .decoders import Decoder
    from .errors import EngineError
    from .generation import run_diffusion
    from .hooks import RunHooks
    from .kinds import fit
    from .models import load_model, save_model
    from .pipeline import Engine, load_tokenizer
    from .registry import DecoderOption, decoder_names, register_decoder
    from .run import GenerationCancelled, GenerationOutput, every_run_stopped
    from .stats import GenerationStats
    from .trace import IterationRecord, Trace


__getattr__, __dir__ = lazy_exports(__name__, _DEFINED_IN)
