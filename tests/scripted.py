"""A real DiffusionLM whose predictions are written down in advance, for testing the loop itself.

Position j predicts `script[j]` with logit `strength[j]` (all other tokens 0), whatever the input:
so which positions commit when, and where EOS appears, is known exactly. It honours the full
forward API (query slices, past K/V, inputs_embeds) and counts its forwards.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.base import DiffusionLM, ModelOutput

VOCAB, MASK, EOS = 20, 19, 18


class ScriptedLM(DiffusionLM):
    def __init__(self, script: list[int], strength: list[float]) -> None:
        super().__init__()
        self.config = {"mask_token_id": MASK, "eos_token_id": EOS}
        self.script = torch.tensor(script)
        self.strength = torch.tensor(strength, dtype=torch.float32)
        self.wte = nn.Embedding(VOCAB, 4)
        self.forwards = 0

    def embedding_weight(self) -> torch.Tensor:
        return self.wte.weight

    def forward(self, input_ids=None, inputs_embeds=None, past_kv=None, replace=None, use_cache=False, attention_mask=None, persist=False):
        self.forwards += 1
        x = input_ids if input_ids is not None else inputs_embeds[..., 0]
        b, q = x.shape[:2]
        a = replace[0] if replace is not None else 0
        logits = torch.zeros(b, q, VOCAB)
        pos = torch.arange(a, a + q)
        logits[:, torch.arange(q), self.script[pos]] = self.strength[pos]
        kv = torch.zeros(1, 2, b, 1, q, 1) if use_cache else None
        return ModelOutput(logits=logits, kv=kv)
