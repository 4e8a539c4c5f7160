"""An example diffusion kind kept outside the engine: any-order decoding by a margin rule, with no
decoder and one setting of its own (docs/algorithms.md §10.2).

Each step fills, in the block being decoded, every masked position whose top-1 probability leads
its runner-up by at least `margin` (the model is sure of that token against every other), and at
least the position with the largest lead: a position far right of the answer can be written
before one beside the prompt, whatever order a left-to-right reader would expect. It runs on
full-attention masked-diffusion models (tiny-llada), where every position sees every other.

Everything else is the run skeleton's (engine/fill.py, engine/run.py): the forwards and their
count, the answer's constraint, early stop, the trace and its finality, cancel; with no view of
its own, the app draws its records with masked diffusion's view. Load it by path:

    DINFER_VIZ_KINDS=examples/margin_kind.py python -m engine generate --model tiny-llada --kind margin --margin 0.3
    DINFER_VIZ_KINDS=examples/margin_kind.py python app.py
"""

from __future__ import annotations

import torch

from engine.fill import FillRun
from engine.kinds import DiffusionKind, KindSettings, ModelTraits, register_kind
from engine.registry import DecoderOption

MARGIN = "margin"


class MarginRun(FillRun):
    kind = MARGIN

    def choose(self, probs: torch.Tensor, tokens: torch.Tensor, confidence: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """Every masked position whose top-1 leads its runner-up by `margin`, and each row's largest lead."""
        lead = self.lead(probs)
        lead = torch.where(masked, lead, torch.full_like(lead, -1.0))
        best = torch.zeros_like(masked).scatter_(1, lead.argmax(dim=1, keepdim=True), True)
        return masked & ((lead >= MarginKind.option(self.cfg, "margin")) | best)

    def order(self, probs: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
        return self.lead(probs)  # under a constraint, the surest leads are kept first

    @staticmethod
    def lead(probs: torch.Tensor) -> torch.Tensor:
        top = probs.topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]


@register_kind
class MarginKind(DiffusionKind):
    """Any-order decoding by the top-1's lead over its runner-up."""

    name = MARGIN
    run = MarginRun
    summary = "fills, in any order, every masked position whose top-1 leads its runner-up by the margin"
    settings = KindSettings(
        decoders=None,  # its rule is its own: no decoder to choose
        options={"margin": DecoderOption(0.5, "margin kind: fill a position when its top-1's probability leads the runner-up's by at least this", least=0.0, most=1.0)},
    )

    @classmethod
    def refuses(cls, model: ModelTraits) -> str | None:
        if model.diffusion_kind != "masked" or model.block_causal:
            return "it needs a full-attention masked-diffusion model (LLaDA), where every position sees every other"
        return None
