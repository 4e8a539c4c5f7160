"""Component 1, the model: the families, their registry and the checkpoint loader."""

from .base import DiffusionLM, ModelOutput
from .llada import LLaDAModelLM
from .loader import family_names, load_model, model_class, register_family, save_model

register_family(
    "llada",
    lambda cfg: cfg.get("model_type") == "llada" and "num_experts" not in cfg,
    LLaDAModelLM,
)

__all__ = [
    "DiffusionLM",
    "LLaDAModelLM",
    "ModelOutput",
    "family_names",
    "load_model",
    "model_class",
    "register_family",
    "save_model",
]
