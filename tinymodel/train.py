"""Train the embedded model: a small LLaDA on the task families of tinymodel/tasks.py, on CPU or GPU.

    python -m tinymodel.train --threads 2 --compile          # the shipped recipe (120 min on 2 CPU cores)
    python -m tinymodel.train --resume --threads 2 --compile # continue it after an interruption
    python -m tinymodel.train --device cuda                  # the same recipe on a GPU

The defaults are the last segment of the shipped model's run (assets/tiny-llada/README.md); it writes
runs/tiny-llada/model, never the shipped folder unless `--out` says so.

The objective (LLaDA's SFT masked diffusion), the batches, the optimizer and the schedule, with
the run that made the shipped weights: assets/tiny-llada/README.md, "Training". With
`--max-minutes` the cosine runs on wall time (or steps, whichever is further), so a run on a
shared CPU ends on time with its learning rate decayed.

Every `eval_every` steps the model is scored on held-out prompts through the engine's own
generate, the model folder is written (safetensors) and a resume file (weights, optimizer, step,
elapsed minutes, RNG states; torch.save of tensors and plain values, loaded with
`weights_only=True`, kept in the run folder only, never shipped) is saved; `--resume` continues
from it. `--init-from FOLDER` starts from a saved model's weights with a fresh optimizer and
schedule; `--task-weights` sets the family mix (default `DEFAULT_TASK_WEIGHTS`); `--ema-decay D`
scores and writes a moving average of the weights instead of the weights as stepped; `--device cuda`
trains on a GPU (the noise is drawn on the CPU, so a seed gives the same run on either).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, ClassVar, TypeVar

import torch
import torch.nn.functional as F

from engine.cli import OneLineParser, checked_device
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.models import LLaDAModelLM, load_model, save_model

from .eval import TaskScore, evaluate
from .tasks import TASKS, Example, ExampleSampler, split_examples
from .tokenizer import build_tokenizer, hf_tokenizer, save_tokenizer, special_ids

RESUME_FILE = "resume.pt"
# Sampling weight of each family when `--task-weights` is not given: the families the previous
# model learned last (subtraction, and pair-sum, which is subtraction with a free operand) get more.
DEFAULT_TASK_WEIGHTS = {"add": 1.0, "sub": 1.3, "pairsum": 1.5, "rhyme": 0.5, "grammar": 1.0}


@dataclass
class TrainConfig:
    out: str = "runs/tiny-llada/model"  # never the shipped assets/tiny-llada unless asked: a run would replace it
    run_dir: str = "runs/tiny-llada"
    tasks: tuple[str, ...] = tuple(TASKS)
    # sampling weight of each task, in `tasks` order (empty: the class's default_weights)
    task_weights: tuple[float, ...] = ()
    default_weights: ClassVar[dict[str, float]] = DEFAULT_TASK_WEIGHTS
    d_model: int = 192
    n_layers: int = 6
    n_heads: int = 6
    mlp_hidden_size: int = 512
    steps: int = 100_000
    max_minutes: float = 120.0  # > 0: also stop (and finish the cosine) when this much wall time has passed
    batch_size: int = 48
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.05
    warmup: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    min_gen: int = 36  # most responses fit; a batch with a longer one gets its canvas widened (make_batch)
    max_gen: int = 96
    # gen length = min_gen + (max_gen - min_gen) * u ** length_skew, u ~ U(0, 1): 1 is uniform; larger
    # values favour short canvases, where the prompt is not drowned in EOS padding (measured: one-digit
    # sums learned ~3.5x faster per step on 24-token canvases than on uniform 32-128 ones)
    length_skew: float = 3.0
    # > 0: each batch holds about this many tokens, `tokens_per_batch // (prompt + gen length)`
    # examples (at least `batch_size // 3`), so short canvases carry more examples: the shipped model
    # was trained with 8000 (assets/tiny-llada/README.md)
    tokens_per_batch: int = 8000
    eps: float = 1e-3
    eval_every: int = 500
    eval_per_task: int = 48
    seed: int = 0
    threads: int = 2
    device: str = "cpu"
    compile: bool = False
    resume: bool = False
    # a model folder to start from (fresh optimizer and schedule): continue training a shipped model;
    # the architecture flags must describe that folder's model
    init_from: str = ""
    # > 0: keep an exponential moving average of the weights (this decay per step, after a short
    # warm-up) and write, score and ship the average; the raw weights are what the optimizer steps.
    # Checkpoints of the shipped run swung by 10-25 points on held-out prompts from one to the next;
    # the average damps that, and lags: climbing back from a restart it averages the dip too
    # (assets/tiny-llada/README.md).
    ema_decay: float = 0.0


Config = TypeVar("Config", bound=TrainConfig)  # TrainConfig or a subclass (tinymodel.distill's)


def model_config(cfg: TrainConfig) -> dict:
    """config.json in the real LLaDA field names (the reference modeling code reads these)."""
    vocab_size = build_tokenizer().get_vocab_size()
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_layer_norm": False,
        "block_type": "llama",
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_heads,
        "n_layers": cfg.n_layers,
        "mlp_hidden_size": cfg.mlp_hidden_size,
        "mlp_ratio": cfg.mlp_hidden_size // cfg.d_model,
        "vocab_size": vocab_size,
        "embedding_size": vocab_size,
        "include_bias": False,
        "include_qkv_bias": False,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "rms_norm_eps": 1e-5,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 10000.0,
        "max_sequence_length": 512,
        "scale_logits": False,
        "weight_tying": False,
        "use_cache": False,
        "torch_dtype": "float32",
        **special_ids(),
    }


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Normal(0, 0.02) for linear and embedding weights (the usual small-transformer init)."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)


def warm_start(model: LLaDAModelLM, folder: str) -> None:
    """Copy a saved model's weights into `model`; its architecture must be the same."""
    source = load_model(folder)
    mine, theirs = model.state_dict(), source.state_dict()
    for name, tensor in mine.items():
        if name not in theirs or theirs[name].shape != tensor.shape:
            shape = tuple(theirs[name].shape) if name in theirs else "nothing"
            raise EngineError(
                f"--init-from {folder}: tensor {name} is {shape} there, {tuple(tensor.shape)} here; "
                "pass the architecture flags (--d-model, --n-layers, ...) of that model"
            )
    model.load_state_dict(theirs)


def make_batch(examples: list[Example], tokenizer, gen_length: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, response_mask) `[B, P_max + gen_length]`: prompt, response, EOS to the end.

    A shorter prompt gets a longer response region, as the engine's canvas gives it. A batch whose
    longest response would not leave room for one EOS gets the canvas that does (a grammar
    sentence can reach 36 characters, above the default `min_gen`: a training run crashed on one
    at step 740).
    """
    prompts = [tokenizer.encode(e.prompt, add_special_tokens=False).ids for e in examples]
    responses = [tokenizer.encode(e.response, add_special_tokens=False).ids for e in examples]
    gen_length = max(gen_length, 1 + max(map(len, responses)))
    width = max(map(len, prompts)) + gen_length
    ids = torch.full((len(examples), width), eos_id, dtype=torch.long)
    response = torch.ones((len(examples), width), dtype=torch.bool)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        ids[row, : len(p) + len(r)] = torch.tensor(p + r)
        response[row, : len(p)] = False
    return ids, response


def mask_responses(
    ids: torch.Tensor, response: torch.Tensor, mask_id: int, eps: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy ids, masked, p_mask): per row t ~ U(eps, 1); each response token masked w.p. t.

    The noise is drawn on the CPU (`generator` is a CPU generator), so a seed gives the same masks
    on every device, and then moved to `ids`' device.
    """
    b, n = ids.shape
    t = (1 - eps) * torch.rand(b, generator=generator) + eps
    p_mask = t.unsqueeze(1).expand(b, n)
    masked = (torch.rand(b, n, generator=generator) < p_mask).to(ids.device) & response
    p_mask = p_mask.to(ids.device)
    return torch.where(masked, torch.full_like(ids, mask_id), ids), masked, p_mask


def diffusion_loss(
    model: torch.nn.Module, ids: torch.Tensor, response: torch.Tensor, mask_id: int, eps: float, generator: torch.Generator
) -> torch.Tensor:
    """LLaDA SFT loss: CE on masked response tokens / t, / response length, mean over rows."""
    noisy, masked, p_mask = mask_responses(ids, response, mask_id, eps, generator)
    logits = model(input_ids=noisy).logits
    token_loss = F.cross_entropy(logits[masked], ids[masked], reduction="none") / p_mask[masked]
    lengths = response.sum(dim=1, keepdim=True).expand_as(ids)[masked]
    return (token_loss / lengths).sum() / ids.shape[0]


def task_weights(cfg: TrainConfig) -> list[float]:
    return list(cfg.task_weights) or [cfg.default_weights.get(name, 1.0) for name in cfg.tasks]


def gen_length_sample(cfg: TrainConfig) -> int:
    """This batch's canvas (response) length, in [min_gen, max_gen], skewed by `length_skew`."""
    return cfg.min_gen + round((cfg.max_gen - cfg.min_gen) * random.random() ** cfg.length_skew)


PROMPT_TOKENS = 16  # a typical prompt (the families' prompts have 10-22 characters): only sizes the token budget


def batch_size(cfg: TrainConfig, gen_length: int) -> int:
    """Examples in this batch: fixed, or a token budget spread over the canvas length."""
    if cfg.tokens_per_batch <= 0:
        return cfg.batch_size
    return max(cfg.batch_size // 3, cfg.tokens_per_batch // (PROMPT_TOKENS + gen_length))


def schedule_progress(cfg: TrainConfig, step: int, minutes: float) -> float:
    """Fraction of the run done: by steps, or by wall time under a time budget, whichever is further.

    The time budget lets a run on a shared CPU finish its cosine decay on time however fast it goes.
    """
    by_time = minutes / cfg.max_minutes if cfg.max_minutes > 0 else 0.0
    return min(1.0, max(step / cfg.steps, by_time))


def learning_rate(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over `warmup` steps times a cosine from `lr` to `min_lr_ratio * lr` over the run."""
    warm = min(1.0, (step + 1) / cfg.warmup)
    return cfg.lr * warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def held_out_scores(model: LLaDAModelLM, tokenizer, cfg: TrainConfig) -> dict[str, TaskScore]:
    """Threshold decoder at 0.9, gen 64, block 32, on a fixed sample of held-out prompts."""
    examples = split_examples(list(cfg.tasks), "held_out", cfg.eval_per_task, seed=cfg.seed)
    config = GenerationConfig(gen_length=64, block_length=32, decoder="threshold", threshold=0.9)
    model.eval()
    scores = evaluate(model, tokenizer, examples, config, batch_size=len(examples))
    model.train()
    return scores


def running_mean(mean: float | None, value: float) -> float:
    """The loss the logs show: an exponential moving average over about the last 50 steps."""
    return value if mean is None else 0.98 * mean + 0.02 * value


def accuracy_report(scores: dict[str, TaskScore]) -> str:
    """The held-out part of a checkpoint's log line: each family's valid rate."""
    return "acc " + " ".join(f"{k} {100 * s.accuracy:.1f}%" for k, s in scores.items())


def average_decay(decay: float, updates: int) -> float:
    """The moving average's decay at its `updates`-th update: `decay`, but smaller early on, so the
    average of a run from scratch is not held at the random initialisation for ~1/(1-decay) steps."""
    return min(decay, (1 + updates) / (10 + updates))


@torch.no_grad()
def update_average(average: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """average <- decay * average + (1 - decay) * model, parameter by parameter."""
    for mean, value in zip(average.parameters(), model.parameters()):
        mean.lerp_(value, 1 - decay)


def save_resume(
    path: Path, step: int, minutes: float, model, optimizer, sampler: ExampleSampler, generator: torch.Generator, averaged: torch.nn.Module | None = None
) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": step,
            "minutes": minutes,
            "model": model.state_dict(),
            **({"averaged": averaged.state_dict()} if averaged is not None else {}),
            "optimizer": optimizer.state_dict(),
            "sampler": sampler.state(),
            "generator": generator.get_state(),
            "python_random": random.getstate(),
        },
        tmp,
    )
    tmp.replace(path)


class Trainer:
    """One run's model, optimizer, samplers and counters, and the loop that steps, evaluates, saves
    and resumes them. `train` runs it on the ordinary objective (`sft_loss`); tinymodel.distill runs
    the same loop on a loss of its own, so both share the checkpoints, the schedule and resume."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print) -> None:
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.log = cfg, log
        self.run_dir, self.out = Path(cfg.run_dir), Path(cfg.out)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer = build_tokenizer()
        self.evaluation_tokenizer = hf_tokenizer()
        self.ids = special_ids(self.tokenizer)
        self.model = self.new_model()
        if cfg.init_from and not cfg.resume:
            warm_start(self.model, cfg.init_from)
            log(f"weights from {cfg.init_from}")
        self.model.to(cfg.device)
        # the weights' moving average (--ema-decay): what is scored and written; None when off
        self.averaged = copy.deepcopy(self.model) if cfg.ema_decay > 0 else None
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.98),
        )
        self.sampler = ExampleSampler(list(cfg.tasks), cfg.seed, weights=task_weights(cfg))
        # every random draw of the loop on the torch side (masks; distillation's pairs) comes from this
        # CPU generator, which the resume file carries
        self.generator = torch.Generator().manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.step, self.minutes_before = 0, 0.0
        self.resume_path = self.run_dir / RESUME_FILE
        if cfg.resume:
            self._restore()
        (self.run_dir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")

    def _restore(self) -> None:
        if not self.resume_path.is_file():
            raise EngineError(f"--resume given but {self.resume_path} does not exist")
        state = torch.load(self.resume_path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        if self.averaged is not None:  # a run that kept no average starts one from its weights
            self.averaged.load_state_dict(state.get("averaged", state["model"]))
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.restore(state["sampler"])
        self.generator.set_state(state["generator"])
        random.setstate(state["python_random"])
        self.step, self.minutes_before = state["step"], state["minutes"]
        self.log(f"resumed from {self.resume_path} at step {self.step}")

    def new_model(self) -> torch.nn.Module:
        """The freshly initialised model a run starts from: a LLaDA; a subclass trains another
        family (tinymodel.uniform: DiffusionGemma)."""
        model = LLaDAModelLM(model_config(self.cfg))
        init_weights(model, self.cfg.seed)
        return model

    def held_out(self, model: torch.nn.Module) -> dict[str, TaskScore]:
        """A checkpoint's held-out scores (`held_out_scores`; a subclass decodes its family its way)."""
        return held_out_scores(model, self.evaluation_tokenizer, self.cfg)

    def sft_loss(self, forward: torch.nn.Module) -> torch.Tensor:
        """One batch of the ordinary objective (LLaDA SFT masked diffusion) through `forward`."""
        cfg = self.cfg
        gen_length = gen_length_sample(cfg)
        batch, response = make_batch(self.sampler.batch(batch_size(cfg, gen_length)), self.tokenizer, gen_length, self.ids["eos_token_id"])
        return diffusion_loss(forward, batch.to(cfg.device), response.to(cfg.device), self.ids["mask_token_id"], cfg.eps, self.generator)

    @property
    def result(self) -> LLaDAModelLM:
        """The weights a checkpoint scores and writes: the moving average where one is kept."""
        return self.model if self.averaged is None else self.averaged

    def checkpoint(self, minutes: float) -> None:
        """The model folder (config, safetensors, tokenizer files) and the resume file."""
        save_model(self.result, self.out)
        save_tokenizer(self.out)
        save_resume(self.resume_path, self.step, minutes, self.model, self.optimizer, self.sampler, self.generator, self.averaged)

    def run(
        self, loss: Callable[[torch.nn.Module], torch.Tensor], report: Callable[[dict[str, TaskScore]], str] = accuracy_report
    ) -> dict:
        """Step on `loss(forward)` until the schedule ends, scoring and saving every `eval_every`
        steps and at the end; returns the summary (also written to the run folder's summary.json)."""
        cfg, model = self.cfg, self.model
        params = sum(p.numel() for p in model.parameters())
        self.log(f"model: {params / 1e6:.2f}M parameters; {cfg.steps} steps of {cfg.batch_size}")
        forward = torch.compile(model, dynamic=True) if cfg.compile else model
        model.train()

        from tqdm import tqdm

        bar = tqdm(initial=self.step, total=cfg.steps, desc="train", mininterval=10)
        t0, ema, scores = time.perf_counter(), None, {}

        def minutes() -> float:
            return self.minutes_before + (time.perf_counter() - t0) / 60

        progress = schedule_progress(cfg, self.step, minutes())
        while progress < 1.0:
            lr = learning_rate(cfg, self.step, progress)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            value = loss(forward)
            self.optimizer.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            if self.averaged is not None:
                update_average(self.averaged, model, average_decay(cfg.ema_decay, self.step))
            ema = running_mean(ema, value.item())
            self.step += 1
            bar.update()
            bar.set_postfix(loss=f"{ema:.4f}", lr=f"{lr:.2e}", refresh=False)
            progress = schedule_progress(cfg, self.step, minutes())
            if self.step % cfg.eval_every == 0 or progress >= 1.0:
                scores = self.held_out(self.result)
                self.log(f"step {self.step} loss {ema:.4f} held-out {report(scores)} ({minutes():.1f} min)")
                if self.averaged is not None:  # how far the average is from the weights it averages
                    raw = self.held_out(model)
                    self.log(f"step {self.step} weights as stepped (not the average): held-out {report(raw)}")
                self.checkpoint(minutes())
        bar.close()
        accuracy = {task: s.accuracy for task, s in scores.items()}
        summary = {"steps": self.step, "loss": ema, "held_out_accuracy": accuracy, "minutes": minutes(), "parameters": params}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> dict:
    """Run (or resume) training; returns a summary with the final loss and held-out accuracy."""
    trainer = Trainer(cfg, log)
    return trainer.run(trainer.sft_loss)


def add_config_args(parser: argparse.ArgumentParser, defaults: TrainConfig) -> None:
    """One flag per field of `defaults` (a TrainConfig or a subclass), with its default."""
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if name == "device":
            parser.add_argument(flag, type=checked_device, default=value, help="cpu, cuda, cuda:1, mps")
        elif isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        elif name == "tasks":
            parser.add_argument(flag, nargs="+", default=list(value), choices=list(TASKS))
        elif isinstance(value, tuple):
            parser.add_argument(flag, nargs="+", type=float, default=list(value))
        else:
            parser.add_argument(flag, type=type(value), default=value)


def config_from_args(parser: argparse.ArgumentParser, args: dict, cls: type[Config]) -> Config:
    """The config the parsed flags describe, checked; a bad combination is the parser's one-line error."""
    args = {**args, "tasks": tuple(args["tasks"]), "task_weights": tuple(args["task_weights"])}
    cfg = cls(**args)
    if not (1 <= cfg.min_gen <= cfg.max_gen):
        parser.error("need 1 <= --min-gen <= --max-gen")
    try:  # the sampler holds the rule for weights
        ExampleSampler(list(cfg.tasks), cfg.seed, weights=task_weights(cfg))
    except EngineError as exc:
        parser.error(f"--task-weights: {exc}")
    if cfg.length_skew <= 0:
        parser.error("--length-skew must be positive")
    if not 0 <= cfg.ema_decay < 1:
        parser.error("--ema-decay must be in [0, 1)")
    if min(cfg.steps, cfg.batch_size, cfg.eval_every, cfg.threads) < 1:
        parser.error("--steps, --batch-size, --eval-every and --threads must be positive")
    return cfg


def parse_args(argv: list[str] | None) -> TrainConfig:
    parser = OneLineParser(prog="python -m tinymodel.train", description=__doc__.split("\n\n")[0])
    add_config_args(parser, TrainConfig())
    return config_from_args(parser, vars(parser.parse_args(argv)), TrainConfig)


def one_line_errors(action: Callable[[], None]) -> int:
    """A command's exit status: 0 once `action` ran, 2 with its EngineError as one line on stderr."""
    try:
        action()
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def run_training(train_fn: Callable[[Config, Callable[[str], None]], dict], cfg: Config) -> int:
    """A training command's end: the run's log lines, then its summary as JSON (exit 0), or its
    one-line error (exit 2)."""
    return one_line_errors(lambda: print(json.dumps(train_fn(cfg, lambda m: print(m, flush=True)))))


def main(argv: list[str] | None = None) -> int:
    return run_training(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
