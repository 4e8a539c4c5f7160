"""A decoder plug-in for tests/test_parallel_engine.py: LLaDA's fixed schedule, except that the
n-th decode of a request waits until a file named `n` exists in the folder its `gates` option names.

A test that writes file n + 2 only when it has read record n holds a parallel engine's ranks at
most one iteration ahead of what the caller has read: what happens around a cancel is then
decided by the files the test writes, never by how fast the processes run.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from engine import DecoderOption, GenerationConfig, register_decoder
from engine.decoders import Block, DecodeResult
from engine.decoders.filling import FixedStepDecoder


@register_decoder
class TurnstileDecoder(FixedStepDecoder):
    name = "turnstile"
    options = {"gates": DecoderOption("", "the folder whose file n lets the n-th decode go")}

    def __init__(self, config: GenerationConfig, mask_id: int, generator: torch.Generator | None = None) -> None:
        super().__init__(config, mask_id, generator)
        self.calls = 0  # decodes in this request (a decoder lives for one request)

    def step(self, logits: torch.Tensor, block: Block) -> DecodeResult:
        self.calls += 1
        gate = Path(self.option("gates")) / str(self.calls)
        while not gate.exists():  # the test's file is the event; the sleep only spares the CPU
            time.sleep(0.002)
        return super().step(logits, block)
