"""Component 1, the model: the families, their registry and the checkpoint loader."""

from .base import DiffusionLM, ModelOutput
from .diffusion_gemma import DiffusionGemmaLM, is_diffusion_gemma
from .llada import LLaDAModelLM
from .llada2 import LLaDA2MoeModelLM
from .llada_moe import LLaDAMoEModelLM
from .loader import family_names, load_model, model_class, model_skeleton, register_family, save_model

register_family(
    "llada",
    lambda cfg: cfg.get("model_type") == "llada" and "num_experts" not in cfg,
    LLaDAModelLM,
)
# LLaDA-MoE's own config class declares model_type "llada" (a third-party port says "lladamoe");
# the expert count tells it from dense LLaDA.
register_family(
    "llada-moe",
    lambda cfg: cfg.get("model_type") in ("llada", "lladamoe") and "num_experts" in cfg,
    LLaDAMoEModelLM,
)
register_family(
    "llada2",
    lambda cfg: cfg.get("model_type") == "llada2_moe" or "LLaDA2MoeModelLM" in (cfg.get("architectures") or []),
    LLaDA2MoeModelLM,
)
# model_type as transformers writes it (DiffusionGemmaConfig); the network is transformers' own.
register_family("diffusion-gemma", is_diffusion_gemma, DiffusionGemmaLM)

__all__ = [
    "DiffusionGemmaLM",
    "DiffusionLM",
    "LLaDA2MoeModelLM",
    "LLaDAMoEModelLM",
    "LLaDAModelLM",
    "ModelOutput",
    "family_names",
    "load_model",
    "model_class",
    "model_skeleton",
    "register_family",
    "save_model",
]
