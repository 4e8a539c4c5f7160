"""Trajectory distillation (dInfer's TD) for the embedded model: collect the model's own verified
decoding trajectories, train it on compressed transitions between their states, compare the two.

    python -m tinymodel.distill collect --threads 2          # trajectories -> runs/tiny-llada-td/trajectories.jsonl
    python -m tinymodel.distill train --threads 2 --compile  # from assets/tiny-llada -> runs/tiny-llada-td/model
    python -m tinymodel.distill eval --threads 2             # base vs distilled, held-out prompts, one table

The three stages, the trajectory file and the defaults: docs/distillation.md (collect §1, the
file §2, train §3, eval §4); the method: docs/algorithms.md §7. `train` runs tinymodel/train.py's
loop (`Trainer`) with a loss of its own and writes a drop-in model folder of the same architecture.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.models import DiffusionLM
from engine.trace import Trace

from .eval import SETTINGS, TaskScore, _positive, evaluate, format_table, model_answers, setting_config
from .tasks import TASKS, Example, ExampleSampler, split_examples
from .train import Config, Trainer, TrainConfig, add_config_args, config_from_args, one_line_errors, run_training, running_mean, task_weights

TRAJECTORY_VERSION = 1
TRAJECTORY_FIELDS = ("version", "task", "setting", "prompt", "answer", "mask_id", "prompt_ids", "tokens", "steps")
RUN_DIR = "runs/tiny-llada-td"


# ---- the trajectory file ----------------------------------------------------------------------
@dataclass(frozen=True)
class Trajectory:
    """One prompt's verified decoding, as the order in which its canvas was filled.

    The final canvas is `prompt_ids + tokens`. `steps[k]` says when `tokens[k]` was written: at the
    row's forward number `steps[k]` (1-based, counting the forwards that committed something for this
    row), or 0 when no forward wrote it (early stop filled it with EOS after the row's last forward).
    A token never changes once written, so the canvas after step s holds `tokens[k]` where
    `1 <= steps[k] <= s` and [MASK] elsewhere: step 0 is the canvas before the first forward.
    """

    task: str
    setting: str  # the decoder setting it was decoded with (an eval.SETTINGS name, plus any sampling)
    prompt: str
    answer: str  # the decoded answer the verifier accepted
    mask_id: int
    prompt_ids: list[int]
    tokens: list[int]
    steps: list[int]

    @property
    def n_steps(self) -> int:
        return max(self.steps)

    def canvas(self, step: int) -> list[int]:
        """The engine's canvas after the row's forward number `step` (0: prompt then [MASK])."""
        return self.prompt_ids + [t if 1 <= s <= step else self.mask_id for t, s in zip(self.tokens, self.steps)]

    def final(self) -> list[int]:
        """The canvas the call returned: the last step's, plus early stop's EOS."""
        return self.prompt_ids + self.tokens

    def states(self) -> torch.Tensor:
        """Every canvas, `[n_steps + 1, len(prompt_ids) + len(tokens)]`: row s is the canvas after step s."""
        return torch.tensor([self.canvas(s) for s in range(self.n_steps + 1)])

    def to_json(self) -> str:
        return json.dumps({"version": TRAJECTORY_VERSION, **asdict(self)})

    @classmethod
    def from_dict(cls, data: Any) -> "Trajectory":
        """A trajectory from its JSON form, checked (a file may come from anywhere): EngineError naming
        the first field that is missing, of the wrong type or inconsistent."""
        _need(isinstance(data, dict), "a trajectory is a JSON object")
        _need(data.get("version") == TRAJECTORY_VERSION, f"version {data.get('version')!r} is not {TRAJECTORY_VERSION}")
        _need(set(data) == set(TRAJECTORY_FIELDS), f"the fields must be exactly {', '.join(TRAJECTORY_FIELDS)}")
        _need(all(isinstance(data[k], str) for k in ("task", "setting", "prompt", "answer")), "task, setting, prompt and answer must be strings")
        _need(_is_int(data["mask_id"]), "mask_id must be an integer")
        for name in ("prompt_ids", "tokens", "steps"):
            _need(isinstance(data[name], list) and data[name] and all(_is_int(v) for v in data[name]), f"{name} must be a non-empty list of integers")
        _need(len(data["tokens"]) == len(data["steps"]), "tokens and steps need one entry per generated position")
        _need(data["mask_id"] not in data["tokens"], "tokens must not hold [MASK]: the final canvas is complete")
        steps = set(data["steps"]) - {0}
        _need(bool(steps) and steps == set(range(1, max(steps) + 1)), "steps must number every step from 1 to the last (each step commits something)")
        written = [s > 0 for s in data["steps"]]
        _need(min(data["steps"]) >= 0 and sorted(written, reverse=True) == written, "steps must be >= 0, the 0s (early stop's fill) at the end")
        return cls(**{k: data[k] for k in TRAJECTORY_FIELDS if k != "version"})


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise EngineError(f"trajectory: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_trajectory(trace: Trace, row: int, *, task: str, setting: str, prompt: str, answer: str) -> Trajectory:
    """Row `row` of a traced generate call as a Trajectory.

    Steps count the row's own forwards that committed something (in a batch, a row sits out the
    iterations only other rows need, which would repeat its canvas). Positions no forward committed
    are early stop's EOS fill (step 0); anything else left unwritten is an error.
    """
    start = trace.prompt_lengths[row]
    steps = [0] * (trace.canvas_length - start)
    step = 0
    for rec in trace.iterations:
        if rec.committed[row]:
            step += 1
        for p in rec.committed[row]:
            steps[p - start] = step
    tokens = trace.final[row][start:]
    if step == 0 or any(s == 0 and t != trace.eos_ids[0] for s, t in zip(steps, tokens)):
        raise EngineError(f"trace row {row}: a generated position was neither committed nor filled by early stop")
    return Trajectory(task, setting, prompt, answer, trace.mask_id, trace.final[row][:start], tokens, steps)


def save_trajectories(path: str | Path, trajectories: list[Trajectory]) -> None:
    """One JSON line per trajectory, written whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(t.to_json() + "\n" for t in trajectories))
    tmp.replace(path)


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Every trajectory of a JSON-lines file, checked; EngineError names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"no trajectory file {path} (python -m tinymodel.distill collect writes it)")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_dict(json.loads(line)))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise EngineError(f"{path}:{number}: not valid JSON ({exc})") from None
        except EngineError as exc:
            raise EngineError(f"{path}:{number}: {exc}") from None
    return out


# ---- collection -------------------------------------------------------------------------------
# Several decoders and thresholds: the same prompt decoded in different orders and jump sizes (the
# aggressive ones' verified trajectories are already compressed; fixed x4 has many small steps).
COLLECT_SETTINGS = ("thr 0.3", "thr 0.5", "thr 0.7", "thr 0.9", "hierarchical", "credit", "fixed x4")


def training_prompts(tasks: list[str], per_task: int, seed: int) -> list[Example]:
    """`per_task` distinct training-split prompts of each family, in family order (fewer where the
    split has fewer: pair-sum has 165 training sums). Decoding is deterministic per prompt and
    setting, so a repeated prompt would only repeat a trajectory."""
    out: list[Example] = []
    for name in tasks:
        sampler, chosen = ExampleSampler([name], seed, split="train"), {}
        for _ in range(per_task * 20):  # enough draws to exhaust a small split
            example = sampler.sample()
            chosen.setdefault(example.prompt, example)
            if len(chosen) == per_task:
                break
        out += chosen.values()
    return out


@dataclass
class CollectCount:
    prompts: int = 0
    kept: int = 0
    steps: int = 0  # summed over kept trajectories


def collect(
    model: DiffusionLM,
    tokenizer: Any,
    examples: list[Example],
    settings: list[tuple[str, GenerationConfig]],
    batch_size: int,
    log: Callable[[str], None] = print,
) -> tuple[list[Trajectory], dict[tuple[str, str], CollectCount]]:
    """Decode every example under every setting; keep the rows the verifier accepts, each distinct
    trajectory once (several settings often decode a prompt identically). Returns the trajectories
    and the counts per (setting, family), duplicates included."""
    kept: dict[tuple, Trajectory] = {}
    counts: dict[tuple[str, str], CollectCount] = {}
    for name, config in settings:
        began = time.perf_counter()
        for answer in model_answers(model, tokenizer, examples, config, batch_size):
            count = counts.setdefault((name, answer.item.task), CollectCount())
            count.prompts += 1
            if not answer.correct:
                continue
            t = record_trajectory(answer.output.trace, answer.row, task=answer.item.task, setting=name, prompt=answer.item.prompt, answer=answer.text)
            count.kept += 1
            count.steps += t.n_steps
            kept.setdefault((tuple(t.prompt_ids), tuple(t.tokens), tuple(t.steps)), t)
        log(f"{name}: {sum(c.kept for (n, _), c in counts.items() if n == name)} of {len(examples)} verified ({time.perf_counter() - began:.0f} s)")
    return list(kept.values()), counts


def format_counts(counts: dict[tuple[str, str], CollectCount], trajectories: list[Trajectory]) -> str:
    # sampled settings are named like "hierarchical T1 s0": the column fits the longest name
    width = max([len("setting"), *(len(name) for name, _ in counts)]) + 2
    lines = [f"{'setting':<{width}}{'family':<10}{'prompts':>8}{'kept':>6}{'kept %':>8}{'steps':>7}"]
    for (name, task), c in counts.items():
        lines.append(f"{name:<{width}}{task:<10}{c.prompts:>8}{c.kept:>6}{100 * c.kept / c.prompts:>8.1f}{c.steps / max(c.kept, 1):>7.1f}")
    usable = sum(t.n_steps >= 2 for t in trajectories)
    lines.append(f"{len(trajectories)} distinct trajectories, {usable} with two or more steps (the ones pairs come from)")
    return "\n".join(lines)


# ---- compressed transitions -------------------------------------------------------------------
def sample_steps(n_steps: int, generator: torch.Generator) -> tuple[int, int]:
    """(i, j), 0 <= i, i + 1 < j <= n_steps: i uniform, then j uniform over the states after i + 1."""
    i = int(torch.randint(0, n_steps - 1, (1,), generator=generator))
    return i, int(torch.randint(i + 2, n_steps + 1, (1,), generator=generator))


def revealed_positions(x_i: torch.Tensor, x_j: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Where the transition i -> j wrote a token: masked in x_i, filled in x_j."""
    return (x_i == mask_id) & (x_j != mask_id)


@dataclass
class PairBatch:
    inputs: torch.Tensor  # [B, W] x_i, right-padded with [MASK]
    targets: torch.Tensor  # [B, W] x_j, right-padded with [MASK]
    revealed: torch.Tensor  # [B, W] the positions the loss reads
    pairs: list[tuple[Trajectory, int, int]]  # each row's trajectory and (i, j)


def pair_batch(pairs: list[tuple[Trajectory, int, int]]) -> PairBatch:
    """The rows' states side by side. A shorter canvas is padded with [MASK]: a longer canvas whose
    tail is still masked is what the engine's batch canvas holds (docs/algorithms.md §1.1). The
    padding, like early stop's fill, is masked in x_j too, so it is never a target: the targets are
    what the decoder's forwards wrote."""
    mask_id = pairs[0][0].mask_id
    width = max(len(t.prompt_ids) + len(t.tokens) for t, _, _ in pairs)
    inputs = torch.full((len(pairs), width), mask_id, dtype=torch.long)
    targets = inputs.clone()
    for row, (t, i, j) in enumerate(pairs):
        x_i, x_j = t.canvas(i), t.canvas(j)
        inputs[row, : len(x_i)], targets[row, : len(x_j)] = torch.tensor(x_i), torch.tensor(x_j)
    return PairBatch(inputs, targets, revealed_positions(inputs, targets, mask_id), pairs)


def transition_loss(logits: torch.Tensor, targets: torch.Tensor, revealed: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of x_j's tokens over the revealed positions of the batch: one forward
    from x_i learns every token the trajectory took j - i forwards to write."""
    return F.cross_entropy(logits[revealed].float(), targets[revealed])


class PairSampler:
    """Pairs for training: a family by the run's task weights, one of its trajectories uniformly,
    then `sample_steps`. Trajectories of one step hold no pair with j > i + 1 and are left out."""

    def __init__(self, trajectories: list[Trajectory], tasks: list[str], weights: list[float]) -> None:
        groups = {name: [t for t in trajectories if t.task == name and t.n_steps >= 2] for name in tasks}
        self.groups = [(name, group) for name, group in groups.items() if group]
        self.weights = torch.tensor([w for name, w in zip(tasks, weights) if groups[name]], dtype=torch.float)
        if not self.groups or float(self.weights.sum()) <= 0:
            raise EngineError(f"no trajectory of {', '.join(tasks)} with two or more steps: collect more (python -m tinymodel.distill collect)")
        mask_ids = {t.mask_id for _, group in self.groups for t in group}
        if len(mask_ids) != 1:
            raise EngineError(f"the trajectories come from models with different [MASK] ids: {sorted(mask_ids)}")
        self.mask_id = mask_ids.pop()

    def describe(self) -> str:
        return ", ".join(f"{name} {len(group)}" for name, group in self.groups)

    def sample(self, size: int, generator: torch.Generator) -> PairBatch:
        pairs = []
        for family in torch.multinomial(self.weights, size, replacement=True, generator=generator).tolist():
            group = self.groups[family][1]
            trajectory = group[int(torch.randint(len(group), (1,), generator=generator))]
            pairs.append((trajectory, *sample_steps(trajectory.n_steps, generator)))
        return pair_batch(pairs)


@dataclass
class DistillConfig(TrainConfig):
    """train.py's settings with this stage's defaults (a short fine-tune from the shipped weights),
    plus the pairs and the mix."""

    out: str = f"{RUN_DIR}/model"
    run_dir: str = RUN_DIR
    init_from: str = DEFAULT_MODEL
    max_minutes: float = 25.0  # + one held-out check and the saves: within 30 minutes on 2 CPU cores
    # 2e-4: a restart of the base model at 5.6e-4 erased most of what it knew in 150 steps
    # (assets/tiny-llada/README.md); 1.9e-4 kept it
    lr: float = 2e-4
    # the base model's last training segment's mix, so the ordinary objective keeps the balance the
    # shipped weights were trained to (and the pairs are drawn by family with the same weights)
    default_weights: ClassVar[dict[str, float]] = {"add": 1.0, "sub": 1.5, "pairsum": 2.5, "rhyme": 0.5, "grammar": 1.0}
    warmup: int = 50
    tokens_per_batch: int = 4000  # the ordinary objective's batch; the pairs add about as many tokens
    eval_every: int = 300
    eval_per_task: int = 24
    trajectories: str = f"{RUN_DIR}/trajectories.jsonl"
    pairs_per_batch: int = 48
    sft_weight: float = 1.0  # weight of the ordinary masked-diffusion loss next to the transition loss


class DistillLoss:
    """One step's loss: the transition loss on a batch of pairs plus `sft_weight` times the ordinary
    objective on fresh examples; keeps a running mean of each for the checkpoint log."""

    def __init__(self, trainer: Trainer, pairs: PairSampler) -> None:
        self.trainer, self.pairs = trainer, pairs
        self.transition: float | None = None
        self.sft: float | None = None

    def __call__(self, forward: torch.nn.Module) -> torch.Tensor:
        cfg: DistillConfig = self.trainer.cfg
        batch = self.pairs.sample(cfg.pairs_per_batch, self.trainer.generator)
        logits = forward(input_ids=batch.inputs.to(cfg.device)).logits
        loss = transition_loss(logits, batch.targets.to(cfg.device), batch.revealed.to(cfg.device))
        self.transition = running_mean(self.transition, loss.item())
        if cfg.sft_weight == 0:
            return loss
        sft = self.trainer.sft_loss(forward)
        self.sft = running_mean(self.sft, sft.item())
        return loss + cfg.sft_weight * sft

    def report(self, scores: dict[str, TaskScore]) -> str:
        sft = "-" if self.sft is None else f"{self.sft:.4f}"
        return f"(transition {self.transition:.4f} sft {sft}) acc/TPF " + " ".join(f"{k} {100 * s.accuracy:.1f}%/{s.tpf:.2f}" for k, s in scores.items())


def distill(cfg: DistillConfig, log: Callable[[str], None] = print) -> dict:
    """Train compressed transitions from `cfg.trajectories` (train.py's loop); returns its summary."""
    pairs = PairSampler(load_trajectories(cfg.trajectories), list(cfg.tasks), task_weights(cfg))
    trainer = Trainer(cfg, log)
    if pairs.mask_id != trainer.ids["mask_token_id"]:
        raise EngineError(f"the trajectories' [MASK] id {pairs.mask_id} is not this tokenizer's {trainer.ids['mask_token_id']}")
    log(f"pairs from trajectories of two or more steps: {pairs.describe()}")
    loss = DistillLoss(trainer, pairs)
    return trainer.run(loss, report=loss.report)


# ---- base vs distilled ------------------------------------------------------------------------
EVAL_SETTINGS = ("thr 0.9", "thr 0.7", "thr 0.5", "hierarchical", "credit")
Row = tuple[str, GenerationConfig, dict[str, TaskScore]]


def compare(models: list[tuple[str, DiffusionLM, Any]], examples: list[Example], configs: list[tuple[str, GenerationConfig]], batch_size: int) -> list[Row]:
    """eval.py's rows for every (setting, model), named "<model> <setting>". The models alternate
    family by family, so a change in a shared machine's load reaches both alike (TPS); each
    generate call holds one family."""
    scores: dict[tuple[str, str], dict[str, TaskScore]] = {(label, name): {} for name, _ in configs for label, _, _ in models}
    for name, config in configs:
        for task in dict.fromkeys(e.task for e in examples):
            subset = [e for e in examples if e.task == task]
            for label, model, tokenizer in models:
                scores[(label, name)].update(evaluate(model, tokenizer, subset, config, batch_size))
    return [(f"{label} {name}", config, scores[(label, name)]) for name, config in configs for label, _, _ in models]


def pooled(scores: dict[str, TaskScore]) -> dict[str, TaskScore]:
    """Per family, its groups (arithmetic's digit counts) summed."""
    out: dict[str, TaskScore] = {}
    for key, s in scores.items():
        total = out.setdefault(key.split()[0], TaskScore())
        total.n += s.n
        total.correct += s.correct
        total.tokens += s.tokens
        total.nfe += s.nfe
        total.seconds += s.seconds
    return out


def format_comparison(rows: list[Row], base: str, other: str) -> str:
    """Per setting and family (groups pooled): valid rate of both models and its change in points,
    TPF of both and their ratio."""
    by_name = {name: pooled(scores) for name, _, scores in rows}
    settings = [name[len(base) + 1 :] for name, _, _ in rows if name.startswith(base + " ")]
    header = f"{'setting':<14}{'family':<10}{'n':>5}{'valid % ' + base:>14}{other:>8}{'pts':>7}{'TPF ' + base:>10}{other:>8}{'ratio':>7}"
    lines = [f"{other} against {base}, families pooled", header, "-" * len(header)]
    for setting in settings:
        ours, theirs = by_name[f"{base} {setting}"], by_name[f"{other} {setting}"]
        for family in sorted(ours.keys() & theirs.keys()):
            a, b = ours[family], theirs[family]
            ratio = f"{b.tpf / a.tpf:.2f}" if a.tpf else "-"
            lines.append(
                f"{setting:<14}{family:<10}{a.n:>5}{100 * a.accuracy:>14.1f}{100 * b.accuracy:>8.1f}{100 * (b.accuracy - a.accuracy):>+7.1f}"
                f"{a.tpf:>10.2f}{b.tpf:>8.2f}{ratio:>7}"
            )
    return "\n".join(lines)


# ---- command line -----------------------------------------------------------------------------
def _settings(names: list[str], gen_length: int, block_length: int) -> list[tuple[str, GenerationConfig]]:
    return [(name, setting_config(name, gen_length, block_length)) for name in names]


def load_for_eval(path: str, args: argparse.Namespace) -> tuple[DiffusionLM, Any]:
    """A model folder's model (on the runtime flags' device and threads) and its tokenizer."""
    from engine.models import load_model
    from engine.pipeline import load_tokenizer

    model = load_model(path, **apply_runtime(args))
    set_cpu_threads(model, args.threads)
    return model, load_tokenizer(path)


def run_collect(args: argparse.Namespace) -> None:
    model, tokenizer = load_for_eval(args.model, args)
    settings = _settings(args.settings, args.gen_length, args.block_length)
    if args.temperature > 0:  # sampled: each seed decodes every prompt again
        settings = [(f"{name} T{args.temperature:g} s{seed}", c.replace(temperature=args.temperature, seed=seed)) for name, c in settings for seed in range(args.samples)]
    examples = training_prompts(args.tasks, args.per_task, args.seed)
    trajectories, counts = collect(model, tokenizer, examples, settings, args.batch_size, log=lambda m: print(m, flush=True))
    save_trajectories(args.out, trajectories)
    print(format_counts(counts, trajectories))
    print(f"wrote {args.out}")


def run_eval(args: argparse.Namespace) -> None:
    models = [(label, *load_for_eval(path, args)) for label, path in (("base", args.base), ("TD", args.distilled))]
    examples = split_examples(args.tasks, "held_out", args.limit)
    rows = compare(models, examples, _settings(args.settings, args.gen_length, args.block_length), args.batch_size)
    print(format_table(rows, args.batch_size))
    print()
    print(format_comparison(rows, "base", "TD"))


def build_parser() -> tuple[OneLineParser, OneLineParser]:
    """The command's parser and its `train` stage's (which checks the config it builds)."""
    parser = OneLineParser(prog="python -m tinymodel.distill", description=__doc__.split("\n\n")[0])
    stages = parser.add_subparsers(dest="stage", required=True, parser_class=OneLineParser)

    c = stages.add_parser("collect", help="decode training prompts, keep the verified trajectories")
    c.add_argument("--model", default=DEFAULT_MODEL, help="model folder to decode with")
    c.add_argument("--out", default=DistillConfig.trajectories, help="the JSON-lines file to write")
    c.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    c.add_argument("--per-task", type=_positive, default=200, help="distinct training prompts per family")
    c.add_argument("--settings", nargs="+", default=list(COLLECT_SETTINGS), choices=list(SETTINGS), metavar="SETTING", help=f"decoder settings, from: {', '.join(SETTINGS)}")
    c.add_argument("--temperature", type=float, default=0.0, help="> 0: sample (Gumbel) instead of greedy, --samples seeds per setting")
    c.add_argument("--samples", type=_positive, default=1, help="with --temperature: decodes of each prompt per setting")
    c.add_argument("--gen-length", type=_positive, default=64)
    c.add_argument("--block-length", type=_positive, default=32)
    c.add_argument("--batch-size", type=_positive, default=64)
    c.add_argument("--seed", type=int, default=0, help="which training prompts")
    add_runtime_args(c)

    t = stages.add_parser("train", help="train compressed transitions (tinymodel/train.py's flags, these defaults)")
    add_config_args(t, DistillConfig())

    e = stages.add_parser("eval", help="base vs distilled on held-out prompts")
    e.add_argument("--base", default=DEFAULT_MODEL)
    e.add_argument("--distilled", default=DistillConfig.out)
    e.add_argument("--settings", nargs="+", default=list(EVAL_SETTINGS), choices=list(SETTINGS), metavar="SETTING", help=f"from: {', '.join(SETTINGS)}")
    e.add_argument("--gen-length", type=_positive, default=64)
    e.add_argument("--block-length", type=_positive, default=32)
    add_comparison_args(e, list(TASKS))
    return parser, t


def add_comparison_args(stage: argparse.ArgumentParser, tasks: list[str]) -> None:
    """The flags of a stage that compares two models on held-out prompts (here and tinymodel.edit)."""
    stage.add_argument("--tasks", nargs="+", default=tasks, choices=list(TASKS))
    stage.add_argument("--limit", type=_positive, default=48, help="held-out prompts per family (fewer where the split has fewer)")
    stage.add_argument("--batch-size", type=_positive, default=64)
    add_runtime_args(stage)


def stage_config(train_parser: OneLineParser, args: argparse.Namespace, cls: type[Config]) -> Config:
    """The train stage's config from the parsed flags (the stage's own name dropped), checked."""
    return config_from_args(train_parser, {k: v for k, v in vars(args).items() if k != "stage"}, cls)


def main(argv: list[str] | None = None) -> int:
    parser, train_parser = build_parser()
    args = parser.parse_args(argv)
    if args.stage == "collect":
        if args.temperature < 0:
            parser.error("--temperature must be >= 0")
        return one_line_errors(lambda: run_collect(args))
    if args.stage == "train":
        cfg = stage_config(train_parser, args, DistillConfig)
        if cfg.pairs_per_batch < 1 or cfg.sft_weight < 0:
            train_parser.error("--pairs-per-batch must be positive and --sft-weight >= 0")
        return run_training(distill, cfg)
    return one_line_errors(lambda: run_eval(args))


if __name__ == "__main__":
    sys.exit(main())
