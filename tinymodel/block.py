"""Make the embedded block-diffusion model: assets/tiny-llada converted to LLaDA2 and fine-tuned block-causal.

    python -m tinymodel.block train --threads 2 --compile           # assets/tiny-llada -> runs/tiny-llada2/model (the shipped run)
    python -m tinymodel.block train --resume --threads 2 --compile  # continue after an interruption
    python -m tinymodel.block eval --model assets/tiny-llada2 --threads 2 --limit 48  # held-out: block 1 and 8, threshold 0.9

LLaDA2 (engine/models/llada2.py) is trained block-causal: a token sees its own block and every
earlier one, so the engine decodes it block by block with an exact prefix cache, and block size 1
is plain autoregressive decoding. The dense tiny-llada already knows the task families; with
`use_qk_norm: false`, full rotary, the same RoPE table and every layer dense
(`first_k_dense_replace` = layers; the MoE fields are there only for llada2_config's checks), a
LLaDA2 computes exactly what the LLaDA does under the same attention mask (`convert_llada`;
tests/test_block_train.py proves it), so the fine-tune starts from what it knows and only has to
learn the new attention pattern.

Objective (SDAR / BD3-LM block diffusion): per batch a block size b (`block_sizes`, weighted);
blocks are the absolute ones `[k·b, (k+1)·b)` of prompt + response, as engine/cache.py's
`block_causal_mask` uses them; per row and block t ~ U(eps, 1) (t = 1 when b = 1: next-token
training), each response token of the block masked with probability t, the prompt never;
cross-entropy on the masked tokens weighted 1/t, divided by the response length. One forward
scores every block: the input is [noisy copy ; clean copy] at the same RoPE positions, a noisy
block attending to itself and to the clean blocks before it, a clean block to the clean blocks up to
itself (`training_mask`). The loop is train.py's (`Trainer`: schedule, held-out checks, model
folder, resume).
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from engine.cache import block_causal_mask
from engine.cli import DEFAULT_MODEL, OneLineParser
from engine.config import GenerationConfig
from engine.models import LLaDA2MoeModelLM, LLaDAModelLM, load_model

from .distill import add_comparison_args, compare, load_for_eval, stage_config
from .eval import TaskScore, format_table
from .tasks import split_examples
from .train import Trainer, TrainConfig, accuracy_report, add_config_args, batch_size, gen_length_sample, init_weights, make_batch, model_config, one_line_errors, run_training

RUN_DIR = "runs/tiny-llada2"
EVAL_GEN_LENGTH = 64  # the canvas tiny-llada's held-out tables use


# ---- LLaDA -> LLaDA2 --------------------------------------------------------------------------
def llada2_config_for(llada: dict) -> dict:
    """The LLaDA2 config.json computing what the LLaDA config `llada` computes (every layer dense)."""
    layers, heads = llada["n_layers"], llada["n_heads"]
    return {
        "architectures": ["LLaDA2MoeModelLM"],
        "model_type": "llada2_moe",
        "hidden_size": llada["d_model"],
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": llada.get("n_kv_heads") or heads,
        "head_dim": llada["d_model"] // heads,
        "intermediate_size": llada["mlp_hidden_size"],
        "first_k_dense_replace": layers,  # no MoE layer: the expert fields below are never built
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "moe_intermediate_size": 16,
        "num_shared_experts": 0,
        "vocab_size": llada.get("embedding_size") or llada["vocab_size"],
        "rope_theta": llada["rope_theta"],
        "partial_rotary_factor": 1.0,  # LLaDA rotates the whole head
        "rms_norm_eps": llada["rms_norm_eps"],
        "use_qk_norm": False,  # LLaDA has none
        "tie_word_embeddings": bool(llada.get("weight_tying")),
        "hidden_act": "silu",
        "max_position_embeddings": llada["max_sequence_length"],
        "torch_dtype": "float32",
        **{k: llada[k] for k in ("eos_token_id", "pad_token_id", "mask_token_id") if k in llada},
    }


# LLaDA block tensor -> LLaDA2 layer tensor (the q/k/v projections are fused separately)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_out": "attention.dense",
    "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}


def convert_state_dict(state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """A LLaDA state dict in LLaDA2's names: `query_key_value` is the rows [q | k | v]."""
    out = {"model.word_embeddings.weight": state["model.transformer.wte.weight"], "model.norm.weight": state["model.transformer.ln_f.weight"]}
    if "model.transformer.ff_out.weight" in state:  # untied output projection
        out["lm_head.weight"] = state["model.transformer.ff_out.weight"]
    for i in range(n_layers):
        src, dst = f"model.transformer.blocks.{i}.", f"model.layers.{i}."
        out[dst + "attention.query_key_value.weight"] = torch.cat([state[src + f"{p}_proj.weight"] for p in "qkv"])
        out.update({f"{dst}{new}.weight": state[f"{src}{old}.weight"] for old, new in _LAYER_NAMES.items()})
    return out


def convert_llada(model: LLaDAModelLM) -> LLaDA2MoeModelLM:
    """`model` as a LLaDA2 with the same weights (strict: every tensor mapped, none left over)."""
    converted = LLaDA2MoeModelLM(llada2_config_for(model.config))
    converted.load_state_dict(convert_state_dict(model.state_dict(), model.config["n_layers"]), strict=True)
    return converted


# ---- the block-diffusion objective ------------------------------------------------------------
def training_mask(length: int, block_length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`[2L, 2L]` boolean (True = may attend) over [noisy ; clean]: noisy block i sees itself and
    the clean blocks < i (what the engine's block i sees while it decodes), clean block i the clean
    blocks <= i (engine/cache.py's `block_causal_mask`: what the committed prefix saw)."""
    block = torch.arange(length, device=device) // block_length
    causal = block_causal_mask(length, block_length, torch.device(device))
    own = block.unsqueeze(1) == block.unsqueeze(0)
    noisy_rows = torch.cat([own, causal & ~own], dim=1)
    clean_rows = torch.cat([torch.zeros_like(causal), causal], dim=1)
    return torch.cat([noisy_rows, clean_rows], dim=0)


def block_noise(
    ids: torch.Tensor, response: torch.Tensor, block_length: int, mask_id: int, eps: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy ids, masked, t per position): per row and block t ~ U(eps, 1) (1 for one-token blocks,
    so b = 1 is next-token training, not half of it), each response token masked with probability
    its block's t. Drawn on the CPU `generator` (train.mask_responses' rule: one run on any device)."""
    rows, length = ids.shape
    blocks = -(-length // block_length)
    t = (1 - eps) * torch.rand(rows, blocks, generator=generator) + eps
    if block_length == 1:
        t = torch.ones_like(t)
    t = t.repeat_interleave(block_length, dim=1)[:, :length]
    masked = (torch.rand(rows, length, generator=generator) < t).to(ids.device) & response
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, t.to(ids.device)


def block_logits(model: torch.nn.Module, noisy: torch.Tensor, clean: torch.Tensor, block_length: int) -> torch.Tensor:
    """Logits `[B, L, V]` of the noisy copy, every block at once: one forward over [noisy ; clean]
    with both copies at positions [0, L) (an index-tensor `replace` without a past gives each
    query token its position: engine/models/layers.py)."""
    length = noisy.shape[1]
    rope = model.rope if hasattr(model, "rope") else model._orig_mod.rope
    rope.table(length, noisy.device)  # an index-tensor position reads the table: grow it first
    positions = torch.arange(length, device=noisy.device).repeat(2)
    mask = training_mask(length, block_length, noisy.device)
    return model(input_ids=torch.cat([noisy, clean], dim=1), replace=positions, attention_mask=mask).logits[:, :length]


def block_diffusion_loss(
    model: torch.nn.Module, ids: torch.Tensor, response: torch.Tensor, block_length: int, mask_id: int, eps: float, generator: torch.Generator
) -> torch.Tensor:
    """CE on masked response tokens / t, / response length, mean over rows (train.diffusion_loss's
    weighting, with the noise per block and block-causal attention)."""
    noisy, masked, t = block_noise(ids, response, block_length, mask_id, eps, generator)
    logits = block_logits(model, noisy, ids, block_length)
    per_token = F.cross_entropy(logits[masked], ids[masked], reduction="none") / t[masked]
    lengths = response.sum(dim=1, keepdim=True).expand_as(ids)[masked]
    return (per_token / lengths).sum() / ids.shape[0]


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class BlockTrainConfig(TrainConfig):
    """train.py's settings with this stage's defaults (a fine-tune of the converted tiny-llada)."""

    out: str = f"{RUN_DIR}/model"
    run_dir: str = RUN_DIR
    convert_from: str = DEFAULT_MODEL  # a LLaDA folder to convert and start from; "" = fresh weights (tests)
    max_minutes: float = 80.0  # the shipped run's budget (assets/tiny-llada2/README.md)
    # shorter canvases than train.py's: the EOS tail after an answer teaches little and costs both copies
    min_gen: int = 24
    max_gen: int = 80
    lr: float = 3e-4  # a fine-tune: tinymodel/edit.py's 2e-4 lost little; the new attention pattern needs a bit more
    warmup: int = 50
    tokens_per_batch: int = 4000  # per copy: the forward sees twice this
    eval_every: int = 250
    eval_per_task: int = 16
    # block sizes sampled per batch, and their weights: 1 (autoregressive) and 8 (the card's) most
    block_sizes: tuple[float, ...] = (1, 2, 4, 8, 16, 32)
    block_weights: tuple[float, ...] = (2, 1, 1, 2, 1, 1)
    eval_block: int = 8  # the held-out checks decode in blocks of this size at threshold 0.9


def decode_config(block_length: int, gen_length: int = EVAL_GEN_LENGTH) -> GenerationConfig:
    """Threshold 0.9 in blocks of `block_length` with the exact block-causal prefix cache."""
    return GenerationConfig(gen_length=gen_length, block_length=block_length, decoder="threshold", threshold=0.9, cache="prefix").validate()


class BlockTrainer(Trainer):
    """Trainer on a LLaDA2: the converted model, block-causal held-out decoding, the block loss."""

    cfg: BlockTrainConfig

    def new_model(self) -> LLaDA2MoeModelLM:
        cfg = self.cfg
        if cfg.convert_from:
            self.log(f"weights from {cfg.convert_from}, converted to LLaDA2")
            return convert_llada(load_model(cfg.convert_from))
        model = LLaDA2MoeModelLM(llada2_config_for(model_config(cfg)))
        init_weights(model, cfg.seed)
        return model

    def held_out(self, model: torch.nn.Module) -> dict[str, TaskScore]:
        examples = split_examples(list(self.cfg.tasks), "held_out", self.cfg.eval_per_task, seed=self.cfg.seed)
        model.eval()
        try:
            return compare([("", model, self.evaluation_tokenizer)], examples, [("", decode_config(self.cfg.eval_block))], len(examples))[0][2]
        finally:
            model.train()

    def loss(self, forward: torch.nn.Module) -> torch.Tensor:
        cfg = self.cfg
        block_length = int(random.choices(cfg.block_sizes, weights=cfg.block_weights)[0])
        gen_length = gen_length_sample(cfg)
        ids, response = make_batch(self.sampler.batch(batch_size(cfg, gen_length)), self.tokenizer, gen_length, self.ids["eos_token_id"])
        return block_diffusion_loss(forward, ids.to(cfg.device), response.to(cfg.device), block_length, self.ids["mask_token_id"], cfg.eps, self.generator)


def train_block(cfg: BlockTrainConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) the fine-tune; returns its summary."""
    trainer = BlockTrainer(cfg, log)
    return trainer.run(trainer.loss, accuracy_report)


def run_eval(args: argparse.Namespace) -> str:
    """The model's held-out table at each `--block-lengths`, threshold 0.9, gen `--gen-length`."""
    model = ("llada2", *load_for_eval(args.model, args))
    examples = split_examples(args.tasks, "held_out", args.limit)
    configs = [(f"block {b}", decode_config(b, args.gen_length)) for b in args.block_lengths]
    return format_table(compare([model], examples, configs, args.batch_size), args.batch_size)


def build_parser() -> tuple[OneLineParser, OneLineParser]:
    """The command's parser and its train stage's (whose flags are BlockTrainConfig's fields)."""
    parser = OneLineParser(prog="python -m tinymodel.block", description=__doc__.split("\n\n")[0])
    stages = parser.add_subparsers(dest="stage", required=True, parser_class=OneLineParser)
    eval_stage = stages.add_parser("eval", help="held-out validity at threshold 0.9 in blocks of each --block-lengths")
    eval_stage.add_argument("--model", default=BlockTrainConfig.out)
    eval_stage.add_argument("--block-lengths", nargs="+", type=int, default=[1, 8])
    eval_stage.add_argument("--gen-length", type=int, default=EVAL_GEN_LENGTH)
    add_comparison_args(eval_stage, ["add", "sub", "pairsum", "rhyme", "grammar"])
    train_stage = stages.add_parser("train", help="convert tiny-llada and fine-tune it block-causal (tinymodel/train.py's flags, these defaults)")
    add_config_args(train_stage, BlockTrainConfig())
    return parser, train_stage


def checked_config(train_parser: OneLineParser, args: argparse.Namespace) -> BlockTrainConfig:
    """The train stage's config; mismatched or non-integer block flags are the parser's one-line error."""
    cfg = stage_config(train_parser, args, BlockTrainConfig)
    cfg.block_sizes, cfg.block_weights = tuple(cfg.block_sizes), tuple(cfg.block_weights)
    sizes_ok = min(cfg.block_sizes) >= 1 and all(b == int(b) for b in cfg.block_sizes)
    if len(cfg.block_sizes) != len(cfg.block_weights) or not sizes_ok or min(cfg.block_weights) < 0:
        train_parser.error("need --block-sizes (positive integers) and --block-weights (non-negative) of the same length")
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser, train_parser = build_parser()
    args = parser.parse_args(argv)
    if args.stage == "eval":
        return one_line_errors(lambda: print(run_eval(args)))
    return run_training(train_block, checked_config(train_parser, args))


if __name__ == "__main__":
    sys.exit(main())
