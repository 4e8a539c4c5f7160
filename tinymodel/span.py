"""Continue the embedded model's training with span masking, so it fills holes before pinned text
(docs/algorithms.md §11; the run and its figures: assets/tiny-llada/README.md, "Span masking").

    python -m tinymodel.span --threads 1                    # from assets/tiny-llada -> runs/tiny-llada-span/model
    python -m tinymodel.span --threads 1 --resume           # continue it after an interruption

The ordinary objective masks each answer token with one probability t, the prompt never, and pads
the answer with end-of-text to a canvas longer than it; its masked tokens are as often after a
visible one as before it, so a hole's left context carries the answer and the text after a hole
hardly ever matters (pair-sum `Q: ?+?=57 A:` with ` + 34` pinned after a hole of 3: 7 of 34
held-out sums valid). A share `span_share` of the steps here takes a span batch instead: one
family, each answer followed by end-of-text only up to the batch's longest row (a request with a
suffix ends at the suffix), a contiguous span of each answer (uniform length, uniform start)
masked with probability t and the rest of the answer visible; the loss is the same (cross-entropy
on masked tokens / t / the span's length). The loop, schedule, checkpoints and resume are
tinymodel/train.py's `Trainer`; each checkpoint also logs the held-out pair-sum infill rate.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL, OneLineParser

from .infill import pairsum_cases, score_infill
from .tasks import Example, get_task
from .train import Trainer, TrainConfig, accuracy_report, add_config_args, batch_size, config_from_args, diffusion_loss, run_training

INFILL_CONFIG = GenerationConfig(decoder="threshold", threshold=0.9)  # the held-out tables' decoder


@dataclass
class SpanTrainConfig(TrainConfig):
    out: str = "runs/tiny-llada-span/model"
    run_dir: str = "runs/tiny-llada-span"
    init_from: str = DEFAULT_MODEL
    # a continuation of weights at the end of a cosine to 1e-5: restarts at 2e-4 and above lost
    # 15-35 points of grammar (assets/tiny-llada/README.md), so the peak stays low
    lr: float = 5e-5
    warmup: int = 100
    min_lr_ratio: float = 0.2
    max_minutes: float = 40.0
    eval_every: int = 100
    threads: int = 1
    task_weights: tuple[float, ...] = (1.0, 1.5, 2.5, 0.5, 1.0)  # the shipped model's last segment
    ema_decay: float = 0.99
    span_share: float = 0.5  # share of steps on a span batch (the rest: the ordinary objective)


def span_batch(examples: list[Example], tokenizer, eos_id: int, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, span) `[B, W]`: prompt, answer, end-of-text to the batch's longest row (which
    gets none); `span` True on a contiguous run of each answer, length and start uniform."""
    prompts = [tokenizer.encode(e.prompt, add_special_tokens=False).ids for e in examples]
    answers = [tokenizer.encode(e.response, add_special_tokens=False).ids for e in examples]
    width = max(len(p) + len(a) for p, a in zip(prompts, answers))
    ids = torch.full((len(examples), width), eos_id, dtype=torch.long)
    span = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, (p, a) in enumerate(zip(prompts, answers)):
        ids[row, : len(p) + len(a)] = torch.tensor(p + a)
        length = rng.randint(1, len(a))
        start = len(p) + rng.randint(0, len(a) - length)
        span[row, start : start + length] = True
    return ids, span


class SpanTrainer(Trainer):
    """The ordinary objective mixed with span batches; checkpoints log the pair-sum infill rate."""

    cfg: SpanTrainConfig

    def span_loss(self, forward: torch.nn.Module) -> torch.Tensor:
        cfg = self.cfg
        family = self.sampler.rng.choices(self.sampler.tasks, weights=self.sampler.weights)[0]
        first = family.sample(self.sampler.rng)
        examples = [first] + [family.sample(self.sampler.rng) for _ in range(batch_size(cfg, len(first.response)) - 1)]
        ids, span = span_batch(examples, self.tokenizer, self.ids["eos_token_id"], random)
        return diffusion_loss(forward, ids.to(cfg.device), span.to(cfg.device), self.ids["mask_token_id"], cfg.eps, self.generator)

    def loss(self, forward: torch.nn.Module) -> torch.Tensor:
        return self.span_loss(forward) if random.random() < self.cfg.span_share else self.sft_loss(forward)

    def checkpoint(self, minutes: float) -> None:
        super().checkpoint(minutes)
        score = score_infill(Engine(str(self.out)), pairsum_cases(), INFILL_CONFIG, pinned=True)
        self.log(f"step {self.step} infill pair-sum (held out, suffix pinned) {score.valid}/{score.n} valid, TPF {score.tpf:.2f}")


def train_span(cfg: SpanTrainConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the continuation; returns the summary (final loss, held-out accuracy)."""
    trainer = SpanTrainer(cfg, log)
    return trainer.run(trainer.loss, accuracy_report)


def parse_args(argv: list[str] | None) -> SpanTrainConfig:
    parser = OneLineParser(prog="python -m tinymodel.span", description=__doc__.split("\n\n")[0])
    add_config_args(parser, SpanTrainConfig())
    cfg = config_from_args(parser, vars(parser.parse_args(argv)), SpanTrainConfig)
    if not 0 <= cfg.span_share <= 1:
        parser.error("--span-share must be in [0, 1]")
    return cfg


def main(argv: list[str] | None = None) -> int:
    return run_training(train_span, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
