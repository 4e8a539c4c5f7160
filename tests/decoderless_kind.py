"""A kind that takes no decoder, for the tests (engine/kinds/base.py `KindSettings.decoders=None`):
each run fills every open position with the model's argmax, the most confident share first, in
`rounds` forwards (its own option, declared once here). Not registered on import: conftest's
`decoderless_kind` fixture puts it in the test's own kind registry (`own_kinds`), so no other test
sees it, whatever order they run in."""

from __future__ import annotations

import torch

from engine.kinds.base import DiffusionKind, KindSettings, ModelTraits
from engine.registry import DecoderOption
from engine.run import DiffusionRun, masked_canvas

FILL = "fill"


class FillRun(DiffusionRun):
    kind = FILL

    def setup(self, prompts: list[list[int]]) -> None:
        mask = self.model.mask_token_id
        self.begin([len(p) for p in prompts], masked_canvas(prompts, self.cfg.gen_length, mask), mask, {})  # no decoder: no capabilities

    def run_blocks(self) -> None:
        rounds = FillKind.option(self.cfg, "rounds")
        for done in range(rounds):
            self.check_cancel()
            out = self.metered(lambda: self.model(input_ids=self.x))
            logits = out.logits.float()
            logits[..., self.mask_id] = -torch.inf
            confidence, tokens = logits.softmax(-1).max(-1)
            for row in range(self.x.shape[0]):
                open_ = (self.x[row] == self.mask_id).nonzero().flatten()
                share = -(-len(open_) // (rounds - done))
                chosen = open_[confidence[row, open_].argsort(descending=True)[:share]]
                self.x[row, chosen] = tokens[row, chosen]
            self.iteration += 1


class FillKind(DiffusionKind):
    name = FILL
    run = FillRun
    summary = "fills every open position with the argmax, the most confident share first, in a few forwards"
    settings = KindSettings(
        reads=frozenset(), decoders=None, shares_batches=False,
        options={"rounds": DecoderOption(2, "forwards per run, each filling an equal share of the open positions", least=1, most=4)},
    )

    @classmethod
    def refuses(cls, model: ModelTraits) -> str | None:
        return None if model.diffusion_kind in ("masked", FILL) else f"this model is {model.diffusion_kind} diffusion"
