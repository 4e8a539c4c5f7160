"""A decoder plug-in for the fault tests (tests/test_torchrun_faults.py, tests/test_app_signals.py):
the turnstile (tests/turnstile_decoder.py), which also writes a file `reached-<n>-<rank>` in its
gates folder when its n-th decode reaches its gate, so a test knows that a run, on every rank, is
inside its request before it kills or signals anything, without waiting a guessed time.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine import register_decoder
from engine.decoders import Block, DecodeResult
from tests.turnstile_decoder import TurnstileDecoder


@register_decoder
class MarkedGateDecoder(TurnstileDecoder):
    name = "marked_gate"

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        Path(self.option("gates"), f"reached-{self.calls + 1}-{os.environ.get('RANK', '0')}").touch()
        return super().step(logits, block)
