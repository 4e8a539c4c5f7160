"""Held-out evaluation of a model on the embedded task families, through the real engine's generate.

    python -m tinymodel.eval --model assets/tiny-llada --threads 2       # every setting, every family
    python -m tinymodel.eval --model assets/tiny-gemma --tasks add sub pairsum --gen-length 16 --block-length 16   # its sampler at 3 bounds
    python -m tinymodel.eval --settings fixed "thr 0.9" --tasks pairsum --limit 50
    python -m tinymodel.eval --model runs/x/model --split train --settings "thr 0.9" --limit 64  # choose a checkpoint

Reports, per family (arithmetic also per digit count of the first operand) and decoder setting
(`SETTINGS`): the valid rate (the family's verifier accepts the answer), tokens per forward, NFE,
TPS, the mean committed
confidence of right and of wrong answers, and accuracy by confidence bucket. Each generated
non-stop token has the probability it had when it was committed (read from the engine's trace);
an answer's mean confidence averages them, its min confidence is the weakest one (the template
tokens are near-certain, so the min is what separates right from wrong, and buckets use it).

`answer_prompts` is the one loop that evaluates prompts through the engine: this command, the
benchmarks (benchmarks/run.py) and the app's sweep (dinfer_viz/studies/sweep_study.py) all run it. It lives here,
not in engine/ (inference only) nor in benchmarks/ or dinfer_viz/ (neither imports the other),
because this package is the one both of them import.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Generic, Iterator, Sequence, TypeVar

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine.run import GenerationOutput
from engine import RunHooks, run_diffusion
from engine.models import DiffusionLM
from engine.pipeline import stop_ids_for
from engine.decoders.revising import EditDecoder, apply_preset
from engine.stats import generated_mask

from .tasks import TASKS, Example, free_text_examples, get_task, out_of_range_examples, split_examples

if TYPE_CHECKING:  # transformers is imported only where a tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

Item = TypeVar("Item")  # what a prompt comes from: a task Example, a benchmark PromptItem


@dataclass(frozen=True)
class Answer(Generic[Item]):
    """One prompt's answer: its row of one generate call."""

    item: Item
    text: str  # the row's generated tokens up to the stop token, decoded
    correct: bool | None  # the verifier's word; None where the item has no verifier
    output: GenerationOutput  # the whole call's: its stats and trace cover every row of the batch
    row: int  # this prompt's row in `output`
    wall_seconds: float  # around the generate call, trace recording included


def answer_prompts(
    generate_ids: Callable[..., GenerationOutput],
    decode: Callable[[list[int]], str],
    items: Sequence[Item],
    encoded: Sequence[list[int]],
    config: GenerationConfig,
    verify: Callable[[Item, str], bool | None],
    *,
    batch_size: int = 1,
    trace: bool = False,
    cancel: threading.Event | None = None,
) -> Iterator[Answer[Item]]:
    """Generate the items' prompts in order, `batch_size` rows a call, and yield each item's answer,
    verified, as soon as its call returns (a caller reports progress, or stops, between answers).

    `generate_ids(prompts, config, hooks=)` generates token ids with the stop ids bound and
    `decode` turns a row's ids into text: an Engine's `generate_ids` and `decode` (the app and the
    benchmarks, whose engine may run in worker processes), or engine.run_diffusion on a model with its
    `stop_ids_for` and the tokenizer's decode (`evaluate`: training evaluates a model no Engine holds).
    `encoded` is each item's prompt already tokenised: the benchmarks tokenise once before any
    timing, the app through its Engine's chat template, the eval command as the embedded model was
    trained. `cancel` set: engine.GenerationCancelled from the running call.
    """
    for start in range(0, len(items), batch_size):
        began = time.perf_counter()
        out = generate_ids(list(encoded[start : start + batch_size]), config, hooks=RunHooks(trace=trace, cancel=cancel))
        wall = time.perf_counter() - began
        for row, item in enumerate(items[start : start + batch_size]):
            text = decode(out.token_ids[row])
            yield Answer(item, text, verify(item, text), out, row, wall)


def check_answer(example: Example, text: str) -> bool:
    """The example's family's verifier; a prompt outside every family (free text) has none: wrong."""
    return example.task in TASKS and get_task(example.task).check(example, text)


CONFIDENCE_BUCKETS = (0.0, 0.5, 0.7, 0.9, 0.99, 1.0000001)


@dataclass(frozen=True)
class ScoredAnswer:
    """One answer as a TaskScore keeps it: its mean and weakest committed confidence, the verdict,
    and the prompt and text `--show-wrong` prints."""

    mean: float
    min: float
    right: bool
    prompt: str = ""
    text: str = ""  # the answer as generated


@dataclass
class TaskScore:
    """Running totals of one task under one generation config."""

    n: int = 0
    correct: int = 0
    tokens: int = 0
    nfe: int = 0  # forwards each row would take alone (see per_row_commits)
    seconds: float = 0.0  # each row's share of its batch's wall time
    answers: list[ScoredAnswer] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def tpf(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def mean_confidence(self, right: bool, kind: str = "mean") -> float | None:
        """Mean over right (or wrong) answers of their `kind` ("mean" or "min") confidence."""
        values = [getattr(a, kind) for a in self.answers if a.right == right]
        return sum(values) / len(values) if values else None

    def buckets(self) -> list[tuple[float, float, int, float]]:
        """(low, high, count, accuracy) for each non-empty bucket of answer min confidence."""
        out = []
        for low, high in zip(CONFIDENCE_BUCKETS, CONFIDENCE_BUCKETS[1:]):
            inside = [a.right for a in self.answers if low <= a.min < high]
            if inside:
                out.append((low, min(high, 1.0), len(inside), sum(inside) / len(inside)))
        return out


def per_row_commits(output: GenerationOutput, stop_ids: list[int], mask_id: int) -> list[tuple[list[float], int]]:
    """Per row, from the trace: (confidence at commit time of each generated non-stop token,
    forwards the row would take alone).

    The loop marks in each record the rows that took part (`IterationRecord.active`: those a row's
    solo run would make), so a row's forwards are its active records, plus, for a uniform-state
    row, one encoder forward per canvas it denoised (docs/counting.md §9). TPF computed from it does
    not depend on the evaluation batch size. A commit's confidence is the probability of the token
    it wrote (a uniform step's accepted proposal; an edit's score replaces it).
    """
    trace = output.trace
    at_commit: list[dict[int, float]] = [{} for _ in output.prompt_lengths]
    forwards = [0] * len(output.prompt_lengths)
    for rec in trace.iterations:
        s = rec.block_range[0]
        written = rec.state["proposal_probability"] if rec.state is not None else rec.confidence
        for row, positions in enumerate(rec.committed):
            if not rec.active[row]:
                continue
            forwards[row] += 1 + (rec.state is not None and rec.state["step"] == 0)
            for p in positions:
                at_commit[row][p] = written[row][p - s]
            for revision in (rec.revisions or [[]] * len(rec.committed))[row]:
                if revision["kind"] == "edit":
                    at_commit[row][revision["position"]] = revision["score"]
    keep = generated_mask(output.canvas, output.prompt_lengths, stop_ids, mask_id).cpu()
    out = []
    for row, kept in enumerate(keep):
        out.append(([at_commit[row][p] for p in kept.nonzero().flatten().tolist() if p in at_commit[row]], forwards[row]))
    return out


def model_answers(
    model: DiffusionLM, tokenizer: PreTrainedTokenizerBase, examples: list[Example], config: GenerationConfig, batch_size: int = 1
) -> Iterator[Answer[Example]]:
    """`answer_prompts` for task examples on a bare model (no Engine), traced, verified by their
    family: what `evaluate` scores and tinymodel.distill collects trajectories from."""
    # the embedded model was trained on bare prompts (its tokenizer has no chat template either)
    encoded = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    stop_ids = stop_ids_for(model, tokenizer)  # the rule Engine.stop_ids follows

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)  # as Engine.decode

    return answer_prompts(partial(run_diffusion, model, stop_ids=stop_ids), decode, examples, encoded, config, check_answer, batch_size=batch_size, trace=True)


def evaluate(
    model: DiffusionLM,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[Example],
    config: GenerationConfig,
    batch_size: int = 1,
    progress: bool = False,
) -> dict[str, TaskScore]:
    """Score `examples` (any mix of tasks) with `config`; rows are batched in order."""
    stop_ids = stop_ids_for(model, tokenizer)
    answers = model_answers(model, tokenizer, examples, config, batch_size)
    if progress:
        from tqdm import tqdm

        answers = tqdm(answers, total=len(examples), desc=f"{config.decoder} gen {config.gen_length} block {config.block_length}", leave=False)
    scores: dict[str, TaskScore] = {}
    for answer in answers:
        if answer.row == 0:  # a new batch: read its trace once for all of its rows
            commits = per_row_commits(answer.output, stop_ids, model.mask_token_id)
        confidences, forwards = commits[answer.row]
        stats = answer.output.stats
        score = scores.setdefault(f"{answer.item.task} {answer.item.group}".strip(), TaskScore())
        score.n += 1
        score.correct += answer.correct
        score.tokens += len(answer.output.token_ids[answer.row])
        score.nfe += forwards
        score.seconds += stats.seconds / stats.batch  # this row's share of its batch's time
        mean = sum(confidences) / len(confidences) if confidences else 0.0
        score.answers.append(ScoredAnswer(mean, min(confidences, default=0.0), answer.correct, answer.item.prompt, answer.text))
    return scores


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# The decoder settings the eval command compares (name -> GenerationConfig changes). "fixed" commits
# one token per forward (LLaDA's steps = gen_length); "fixed x4" four, the most parallel fixed
# schedule; the thresholds span what the app's sweep shows; hierarchical and credit at defaults.
ENTROPY_BOUNDS = (0.1, 0.5, 2.0)
SETTINGS: dict[str, dict] = {
    "fixed": {"decoder": "fixed"},
    "fixed x4": {"decoder": "fixed", "steps_divisor": 4},
    **{f"thr {tau:g}": {"decoder": "threshold", "threshold": tau} for tau in (0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95)},
    # the edit decoder (engine/decoders/revising.py) at diffusers' edit threshold, and its published sets
    **{f"edit {tau:g}": {"decoder": "edit", "threshold": tau, "decoder_options": {"edit_threshold": 0.5}} for tau in (0.05, 0.1, 0.3, 0.5, 0.7, 0.9)},
    **{f"edit {name}": {"decoder": "edit", "preset": name} for name in EditDecoder.presets},
    "hierarchical": {"decoder": "hierarchical"},
    "credit": {"decoder": "credit"},
    # ReMDM on "fixed x4"'s schedule (its eta 0 is that setting): cap at the authors' loop eta, and a bolder one
    "remdm x4": {"decoder": "remdm", "steps_divisor": 4},
    "remdm x4 eta 0.1": {"decoder": "remdm", "steps_divisor": 4, "decoder_options": {"remdm_eta": 0.1}},
    # WINO at the authors' wide-in threshold, and a bolder one (narrow-out at its default 0.9)
    "wino 0.6": {"decoder": "wino", "threshold": 0.6},
    "wino 0.3": {"decoder": "wino", "threshold": 0.3},
    # EB-Sampler on masked models, and a uniform-state model's sampler, at three entropy bounds (nats)
    **{f"eb {bound:g}": {"decoder": "entropy_bound", "decoder_options": {"entropy_bound": bound}} for bound in ENTROPY_BOUNDS},
    **{f"uniform {bound:g}": {"decoder": "uniform", "decoder_options": {"entropy_bound": bound}} for bound in ENTROPY_BOUNDS},
}


def settings_for(kind: str) -> list[str]:
    """The SETTINGS a model of diffusion `kind` runs: the uniform sampler's for a uniform-state
    model, every other for a masked one."""
    return [name for name, changes in SETTINGS.items() if (changes.get("decoder") == "uniform") == (kind == "uniform")]


def setting_config(name: str, gen_length: int, block_length: int) -> GenerationConfig:
    """The GenerationConfig of one named setting at this canvas."""
    if name not in SETTINGS:
        raise EngineError(f"unknown setting '{name}'; choose from {', '.join(SETTINGS)}")
    changes = dict(SETTINGS[name])
    divisor = changes.pop("steps_divisor", None)
    if divisor:
        changes["steps"] = gen_length // divisor
    preset = changes.pop("preset", None)
    config = GenerationConfig(gen_length=gen_length, block_length=block_length, **changes)
    return (apply_preset(config, preset) if preset else config).validate()


def format_table(rows: list[tuple[str, GenerationConfig, dict[str, TaskScore]]], batch_size: int) -> str:
    # the setting column fits the longest row name (tinymodel.distill prefixes the model's)
    width = max([13] + [len(name) + 1 for name, _, _ in rows])
    header = (
        f"{'setting':<{width}}{'family':<16}{'n':>5}{'valid %':>9}{'TPF':>7}{'NFE':>7}{'TPS':>9}"
        f"{'mean conf R/W':>16}{'min conf R/W':>16}"
    )
    lines = [header, "-" * len(header)]
    for name, config, scores in rows:
        for task, s in sorted(scores.items()):
            lines.append(
                f"{name:<{width}}{task:<16}{s.n:>5}{100 * s.accuracy:>9.1f}{s.tpf:>7.2f}{s.nfe / max(s.n, 1):>7.1f}{s.tps:>9.1f}"
                f"{_fmt(s.mean_confidence(True)) + '/' + _fmt(s.mean_confidence(False)):>16}"
                f"{_fmt(s.mean_confidence(True, 'min')) + '/' + _fmt(s.mean_confidence(False, 'min')):>16}"
            )
    config = rows[0][1] if rows else GenerationConfig()
    lines.append(
        f"gen {config.gen_length}, block {config.block_length}. valid: the family's verifier accepts the answer (arithmetic: "
        "the exact result). TPF: generated non-EOS tokens per forward of one row; NFE: forwards per prompt; "
        f"TPS: tokens per second per sequence at batch size {batch_size}"
    )
    lines.append("")
    lines.append("accuracy by answer min confidence (families pooled): [low, high) answers acc%")
    for name, config, scores in rows:
        pooled = TaskScore(answers=[a for s in scores.values() for a in s.answers])
        cells = "  ".join(f"[{lo:g},{hi:g}) {n} {100 * acc:.1f}" for lo, hi, n, acc in pooled.buckets())
        lines.append(f"{name:<{width}}  {cells}")
    return "\n".join(lines)


def format_wrong(rows: list[tuple[str, GenerationConfig, dict[str, TaskScore]]]) -> str:
    """Every wrong answer, by setting and family: `prompt -> answer` (Python reprs, so spaces and
    newlines show), with its weakest committed confidence."""
    lines = ["wrong answers (prompt -> answer, min confidence):"]
    for name, _, scores in rows:
        for task, s in sorted(scores.items()):
            lines += [f"{name} | {task} | {a.prompt!r} -> {a.text!r}  {a.min:.3f}" for a in s.answers if not a.right]
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m tinymodel.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model folder (config.json, safetensors, tokenizer)")
    parser.add_argument("--settings", nargs="+", default=None, choices=list(SETTINGS), metavar="SETTING", help=f"decoder settings to compare: {', '.join(SETTINGS)} (default: all those of the model's kind of diffusion)")
    parser.add_argument("--gen-length", type=_positive, default=64)
    parser.add_argument("--block-length", type=_positive, default=32)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--limit", type=_positive, default=None, help="prompts per family of the split (seeded sample); default 300, or all where fewer")
    parser.add_argument(
        "--split",
        choices=["held_out", "train", "out_of_range", "free_text"],
        default="held_out",
        help="held_out: prompts never trained on; train: training-split prompts (to choose between checkpoints without looking at the held-out figures you report); out_of_range: arithmetic with a four-digit operand (--limit per family, default 200); free_text: prompts outside every family (no verifier: read the confidence columns)",
    )
    parser.add_argument("--show-wrong", action="store_true", help="also print every wrong answer under the table")
    parser.add_argument("--batch-size", type=_positive, default=64, help="rows per generate call; TPF does not depend on it, TPS is per sequence at this batch size (1: as one user sees it)")
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    try:
        from engine.models import load_model
        from engine.pipeline import load_tokenizer

        runtime = apply_runtime(args)
        if args.split in ("held_out", "train"):
            examples = split_examples(args.tasks, args.split, args.limit)
        elif args.split == "out_of_range":
            examples = out_of_range_examples(args.tasks, args.limit or 200)
        else:
            examples = free_text_examples()
        model = load_model(args.model, **runtime)
        names = args.settings or settings_for(model.diffusion_kind)
        configs = [(name, setting_config(name, args.gen_length, args.block_length)) for name in names]
        set_cpu_threads(model, args.threads)
        tokenizer = load_tokenizer(args.model)
        rows = [(name, c, evaluate(model, tokenizer, examples, c, args.batch_size, progress=True)) for name, c in configs]
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows, args.batch_size))
    if args.show_wrong:
        print()
        print(format_wrong(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
