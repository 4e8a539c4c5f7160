"""dinfer-viz engine: masked-diffusion LM inference (LLaDA family) with dInfer's four components.

- model: `engine.models` (families, registry, checkpoint loader)
- diffusion iteration manager: `engine.iteration`
- decoders: `engine.decoders`
- KV-cache manager: `engine.cache`

Public API: load_model, load_tokenizer, generate (token level), Engine (text level),
GenerationConfig, Trace, EngineError. The engine never imports the app.
"""

from .config import GenerationConfig
from .decoders import Decoder
from .errors import EngineError
from .iteration import GenerationCancelled, GenerationOutput, generate
from .models import load_model, save_model
from .pipeline import Engine, load_tokenizer
from .registry import DecoderOption, decoder_names, register_decoder
from .stats import GenerationStats
from .trace import IterationRecord, Trace

__all__ = [
    "Decoder",
    "DecoderOption",
    "Engine",
    "EngineError",
    "GenerationCancelled",
    "GenerationConfig",
    "GenerationOutput",
    "GenerationStats",
    "IterationRecord",
    "Trace",
    "decoder_names",
    "generate",
    "load_model",
    "load_tokenizer",
    "register_decoder",
    "save_model",
]
