"""Train the embedded uniform-state model: a tiny DiffusionGemma-format checkpoint on the task
families of tinymodel/tasks.py, with the character tokenizer, text only.

    python -m tinymodel.uniform --threads 2               # runs/tiny-gemma/model, 120 min on 2 CPU cores (the shipped recipe)
    python -m tinymodel.uniform --threads 2 --resume      # continue it after an interruption

The network is transformers' DiffusionGemmaForBlockDiffusion (engine/models/diffusion_gemma.py),
small: its config is `model_config`. Each example is one canvas: the prompt is the encoder's prefix
and the canvas holds the response padded with EOS to `canvas_length`. The objective is uniform-state
diffusion as DiffusionGemma's sampler undoes it:
  - corruption: per row t ~ U(eps, 1); each canvas position becomes a uniformly random token
    (any id of the vocabulary, as the sampler's canvases and re-noising draw them) with probability t;
  - loss: cross-entropy against the clean canvas at every position, noised or not (the sampler
    reads the model's proposal at every position and accepts some of them);
  - self-conditioning: a first forward without it (no gradient); then, for a random half of the
    rows (`self_conditioning`), the second forward is fed the first's logits divided by a
    temperature drawn from the sampler's schedule [0.4, 0.8] (it feeds temperature-scaled logits);
    the other rows get the zero signal of a canvas's first step. The loss is the second forward's.
The loop, schedule, checkpoints and resume are tinymodel/train.py's `Trainer`; held-out scoring
decodes with the `uniform` sampler at `entropy_bound`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from engine.cli import OneLineParser
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.models import DiffusionGemmaLM

from .eval import TaskScore, evaluate
from .tasks import Example, split_examples
from .tokenizer import build_tokenizer, special_ids
from .train import Trainer, TrainConfig, accuracy_report, add_config_args, batch_size, config_from_args, run_training

SELF_CONDITIONING_TEMPERATURES = (0.4, 0.8)  # the uniform sampler's default t_min, t_max


@dataclass
class UniformTrainConfig(TrainConfig):
    out: str = "runs/tiny-gemma/model"
    run_dir: str = "runs/tiny-gemma"
    # the families whose answers fit a canvas of 16 (rhyme would too; grammar's sentences need 37):
    # arithmetic and pair-sum, the targets, sampled 1.5 : 1 : 1.5 (subtraction is learned from addition)
    tasks: tuple[str, ...] = ("add", "sub", "pairsum")
    task_weights: tuple[float, ...] = (1.5, 1.0, 1.5)
    d_model: int = 128  # hidden_size
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden_size: int = 256  # the dense MLP beside the experts (intermediate_size)
    num_experts: int = 4
    top_k_experts: int = 2
    moe_intermediate_size: int = 128
    # one canvas per example: the longest arithmetic response (13 characters) plus its EOS fits,
    # and a third of the 48 that grammar would need makes a step about 3x cheaper
    canvas_length: int = 16
    self_conditioning: float = 0.5  # share of rows whose second forward sees the first's logits
    entropy_bound: float = 0.1  # the held-out checks' sampler setting
    lr: float = 1e-3


def model_config(cfg: UniformTrainConfig) -> dict:
    """config.json as transformers writes it for this DiffusionGemma (MoE layers, a minimal vision
    tower the text-only engine never runs)."""
    from transformers import DiffusionGemmaConfig

    ids = special_ids()
    head_dim = cfg.d_model // cfg.n_heads
    text = dict(
        vocab_size=build_tokenizer().get_vocab_size(), hidden_size=cfg.d_model, intermediate_size=cfg.mlp_hidden_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads, head_dim=head_dim,
        global_head_dim=head_dim, max_position_embeddings=512, sliding_window=64, num_experts=cfg.num_experts,
        top_k_experts=cfg.top_k_experts, moe_intermediate_size=cfg.moe_intermediate_size,
        pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"], bos_token_id=None,
    )
    vision = dict(
        model_type="gemma4_vision", hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=8, patch_size=2, position_embedding_size=4, pooling_kernel_size=1,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=cfg.canvas_length).to_dict()
    config["architectures"] = ["DiffusionGemmaForBlockDiffusion"]
    return config


def make_canvases(examples: list[Example], tokenizer, canvas_length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefix `[B, P]` left-padded prompts, prefix mask, canvas `[B, L]` response + EOS padding)."""
    prompts = [tokenizer.encode(e.prompt, add_special_tokens=False).ids for e in examples]
    responses = [tokenizer.encode(e.response, add_special_tokens=False).ids for e in examples]
    longest = max(map(len, responses))
    if longest >= canvas_length:
        raise EngineError(f"a response of {longest} tokens leaves no room for EOS in a canvas of {canvas_length}; raise --canvas-length")
    width = max(map(len, prompts))
    prefix = torch.full((len(examples), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(examples), width), dtype=torch.bool)
    canvas = torch.full((len(examples), canvas_length), pad_id, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        prefix[row, width - len(p) :] = torch.tensor(p)
        real[row, width - len(p) :] = True
        canvas[row, : len(r)] = torch.tensor(r)
    return prefix, real, canvas


def uniform_noise(canvas: torch.Tensor, vocab_size: int, eps: float, generator: torch.Generator) -> torch.Tensor:
    """Per row t ~ U(eps, 1); each position replaced by a uniform random id with probability t
    (drawn on the CPU generator, so a seed gives the same noise on every device)."""
    b, n = canvas.shape
    t = (1 - eps) * torch.rand(b, 1, generator=generator) + eps
    replace = torch.rand(b, n, generator=generator) < t
    random_ids = torch.randint(0, vocab_size, (b, n), generator=generator)
    return torch.where(replace.to(canvas.device), random_ids.to(canvas.device), canvas)


def uniform_loss(
    forward: Callable[..., torch.Tensor], prefix: torch.Tensor, real: torch.Tensor, canvas: torch.Tensor,
    vocab_size: int, eps: float, self_conditioning: float, generator: torch.Generator,
) -> torch.Tensor:
    """Mean cross-entropy at every canvas position of the self-conditioned second forward."""
    noisy = uniform_noise(canvas, vocab_size, eps, generator)
    with torch.no_grad():
        first = forward(input_ids=prefix, decoder_input_ids=noisy, attention_mask=real)
    low, high = SELF_CONDITIONING_TEMPERATURES
    temperature = (low + (high - low) * torch.rand(canvas.shape[0], 1, 1, generator=generator)).to(first.device)
    rows = (torch.rand(canvas.shape[0], generator=generator) < self_conditioning).to(canvas.device)
    logits = forward(input_ids=prefix, decoder_input_ids=noisy, attention_mask=real, self_conditioning_logits=first / temperature, self_conditioning_mask=rows)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), canvas.reshape(-1))


class UniformTrainer(Trainer):
    """Trainer on a DiffusionGemma: its model and its held-out decoding."""

    cfg: UniformTrainConfig

    def new_model(self) -> DiffusionGemmaLM:
        torch.manual_seed(self.cfg.seed)  # transformers initialises the weights from the global generator
        return DiffusionGemmaLM(model_config(self.cfg))

    def held_out(self, model: torch.nn.Module) -> dict[str, TaskScore]:
        cfg = self.cfg
        examples = split_examples(list(cfg.tasks), "held_out", cfg.eval_per_task, seed=cfg.seed)
        config = GenerationConfig(
            gen_length=cfg.canvas_length, block_length=cfg.canvas_length, decoder="uniform", decoder_options={"entropy_bound": cfg.entropy_bound}
        )
        model.eval()
        scores = evaluate(model, self.evaluation_tokenizer, examples, config, batch_size=len(examples))
        model.train()
        return scores

    def loss(self, forward: torch.nn.Module) -> torch.Tensor:
        cfg = self.cfg
        examples = self.sampler.batch(batch_size(cfg, cfg.canvas_length))
        prefix, real, canvas = make_canvases(examples, self.tokenizer, cfg.canvas_length, self.ids["pad_token_id"])
        device = cfg.device
        return uniform_loss(
            forward, prefix.to(device), real.to(device), canvas.to(device), self.model.vocab_size, cfg.eps, cfg.self_conditioning, self.generator
        )


def train_uniform(cfg: UniformTrainConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) training; returns the summary (final loss, held-out accuracy)."""
    trainer = UniformTrainer(cfg, log)
    return trainer.run(trainer.loss, accuracy_report)


def parse_args(argv: list[str] | None) -> UniformTrainConfig:
    parser = OneLineParser(prog="python -m tinymodel.uniform", description=__doc__.split("\n\n")[0])
    add_config_args(parser, UniformTrainConfig())
    cfg = config_from_args(parser, vars(parser.parse_args(argv)), UniformTrainConfig)
    if not 0 <= cfg.self_conditioning <= 1 or cfg.entropy_bound <= 0 or cfg.canvas_length < 2:
        parser.error("need 0 <= --self-conditioning <= 1, --entropy-bound > 0 and --canvas-length >= 2")
    return cfg


def main(argv: list[str] | None = None) -> int:
    return run_training(train_uniform, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
