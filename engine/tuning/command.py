"""`python -m engine tune`: a multi-objective Optuna study of decoder settings (docs/tuning.md).

The prompts and their verifiers come from a scorer module loaded by name at run time
(`SCORER_MODULE`, or $DINFER_VIZ_TUNE_SCORER): by default the embedded tasks'
(tinymodel/tune_prompts.py), which the engine never imports (tests/test_layout.py). A scorer
module offers `make_evaluator(engine, families, per_family, seed, prompts_file, cancel)`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import stat
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ..cli import DEFAULT_MODEL, MODEL_HELP, add_runtime_args, apply_runtime, check_threads, set_cpu_threads
from ..errors import EngineError

SCORER_MODULE = "tinymodel.tune_prompts"
SCORER_ENV = "DINFER_VIZ_TUNE_SCORER"
DEFAULT_STORAGE = "sqlite:///tune.db"  # beside where the command runs (its output)
MAX_TRIALS = 10_000
MAX_PROMPTS = 300  # per family: what every family holds (tinymodel/tasks.py)
MAX_PROMPTS_FILE_BYTES = 2**20  # a prompts file holds at most 300 prompts (tinymodel/tune_prompts.py)
MAX_TIMEOUT = 30 * 86400.0
MAX_STUDY_NAME = 256
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def parse_pairs(items: list[str] | None, what: str, need_value: bool) -> dict[str, str]:
    """NAME=VALUE items as a dict (with `need_value` False, NAME alone: an empty value); `what`
    names them in the error (the flag, the app's box)."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not name.strip() or (need_value and not sep):
            raise EngineError(f"{what} takes NAME=VALUE, got {item[:60]!r}")
        out[name.strip().replace("-", "_")] = value.strip()
    return out


def add_tune_command(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser("tune", help="search decoder settings for accuracy and tokens per forward (an Optuna study; docs/tuning.md)")
    tune.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    tune.add_argument("--families", nargs="+", default=["pairsum"], metavar="FAMILY", help="the embedded task families whose prompts score a trial (default: pairsum)")
    tune.add_argument("--prompts-file", metavar="FILE", help="instead of --families: one prompt a line, each of some family (its verifier scores it)")
    tune.add_argument("--prompts", type=int, default=8, metavar="N", help="prompts per family on each split (default 8)")
    tune.add_argument("--trials", type=int, default=20, metavar="N", help="trials this process runs (other workers of the study add theirs; default 20)")
    tune.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="stop starting trials after this long")
    tune.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL", help=f"an Optuna storage: a database URL or journal:PATH (default {DEFAULT_STORAGE})")
    tune.add_argument("--study", default=None, metavar="NAME", help="the study to create, resume or join (default: a new one, named in the output)")
    tune.add_argument("--seed", type=int, default=0, help="the study's seed: the prompts drawn, and with each worker's index its sampler's seed (workers of one study share it; docs/tuning.md §4)")
    tune.add_argument("--sampler", choices=["tpe", "nsga2"], default="tpe", help="Optuna's sampler (default tpe)")
    tune.add_argument("--tps", action="store_true", help="maximise tokens per second too (a third objective; noisy)")
    tune.add_argument("--decoders", metavar="A,B", help="search only these decoders")
    tune.add_argument("--fix", action="append", metavar="NAME=VALUE", help="hold a setting at a value (repeat the flag)")
    tune.add_argument("--space", action="append", metavar="NAME[=LOW:HIGH|=A,B]", help="add a setting to the search with its declared range, or narrow one (repeat the flag)")
    tune.add_argument("--json", action="store_true", help="print one JSON object: trials, front, default")
    tune.add_argument("--front-out", metavar="FILE", help="also write the front (each point's settings and figures, most accurate first) for serve --front (docs/tuning.md §1)")
    add_runtime_args(tune)
    tune.set_defaults(run=tune_command)


def load_scorer() -> Any:
    """The scorer module; EngineError in one line when it is not installed."""
    name = os.environ.get(SCORER_ENV) or SCORER_MODULE
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise EngineError(f"cannot load the tuner's scorer {name!r} ({exc}): install the project's tinymodel package or set ${SCORER_ENV}") from None


def _say_refused(study: Any, trial: Any) -> None:
    if "refused" in trial.user_attrs:
        print(f"trial {trial.number} refused: {trial.user_attrs['refused']}", file=sys.stderr)


def check_prompts_file(path: str) -> None:
    """A prompts file is a regular file of at most MAX_PROMPTS_FILE_BYTES (a FIFO or a device such
    as /dev/zero would block or fill memory in the read)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read --prompts-file {path[:200]}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise EngineError(f"--prompts-file {path[:200]} is not a regular file")
    if info.st_size > MAX_PROMPTS_FILE_BYTES:
        raise EngineError(f"--prompts-file {path[:200]} holds {info.st_size:,} bytes, more than {MAX_PROMPTS_FILE_BYTES:,}")


def check_front_out(path: str) -> None:
    """`--front-out` names a file that can be written once the study ends (checked before it starts:
    no study's hours lost to a typo in a folder's name)."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise EngineError(f"--front-out {path[:200]}: not a file in a writable folder")


def write_front(path: str, model: str, result: dict[str, Any]) -> None:
    """The report's front as `serve --front` reads it (engine/serving/front.py): its points in the
    report's order, fewest tokens per forward (the most accurate) first."""
    try:
        with open(path, "w") as f:
            json.dump({"model": model, "study": result["study"], "front": result["front"]}, f, indent=1)
    except OSError as exc:
        raise EngineError(f"cannot write --front-out {path[:200]}: {exc.strerror or exc}") from None


@contextmanager
def stopped_by_signals(cancel: threading.Event) -> Iterator[list[int]]:
    """While the study runs, SIGINT and SIGTERM set `cancel` (the running trial's generation stops
    within a layer, the trial is PRUNED, the study stops) instead of killing the process mid-write;
    the list yielded gets the signals received. The previous handlers come back after."""
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        cancel.set()

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS} if threading.current_thread() is threading.main_thread() else {}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def kept_line(study: Any, storage: str, signum: int) -> str:
    """What a study stopped by a signal kept: its trials by state, and how to resume it."""
    from optuna.trial import TrialState

    counts = {state: len(study.get_trials(deepcopy=False, states=(state,))) for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    return (
        f"stopped by {signal.Signals(signum).name}: study {study.study_name!r} in {storage[:200]} keeps {counts[TrialState.COMPLETE]} completed, "
        f"{counts[TrialState.PRUNED]} pruned and {counts[TrialState.FAIL]} failed trials; run again with --study {study.study_name} to go on"
    )


def tune_command(args: argparse.Namespace) -> int:
    import optuna

    from ..models import model_skeleton
    from ..pipeline import Engine
    from ..run import GenerationCancelled
    from .space import build_space
    from .study import OBJECTIVES, check_storage, format_report, open_study, report, run_trials

    if not 1 <= args.trials <= MAX_TRIALS:
        raise EngineError(f"--trials must be from 1 to {MAX_TRIALS}, got {args.trials}")
    if not 1 <= args.prompts <= MAX_PROMPTS:
        raise EngineError(f"--prompts must be from 1 to {MAX_PROMPTS}, got {args.prompts}")
    if args.timeout is not None and not 0 < args.timeout <= MAX_TIMEOUT:
        raise EngineError(f"--timeout must be above 0 and at most {MAX_TIMEOUT} seconds, got {args.timeout}")
    if args.study is not None and not (0 < len(args.study) <= MAX_STUDY_NAME and args.study.isprintable()):
        raise EngineError(f"--study must be 1 to {MAX_STUDY_NAME} printable characters, got {args.study[:40]!r}")
    if args.prompts_file:
        check_prompts_file(args.prompts_file)
    if args.front_out is not None:
        check_front_out(args.front_out)
    check_threads(args.threads)
    skeleton = model_skeleton(args.model)
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()] if args.decoders else None
    space = build_space(skeleton, decoders=decoders, fix=parse_pairs(args.fix, "--fix", True), space=parse_pairs(args.space, "--space", False))
    scorer = load_scorer()
    objectives = OBJECTIVES if args.tps else OBJECTIVES[:2]
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the table and the JSON are the output; refusals get one line each
    check_storage(args.storage)
    set_cpu_threads(skeleton, args.threads)
    cancel = threading.Event()
    with stopped_by_signals(cancel) as received, Engine(args.model, **apply_runtime(args)) as engine:
        # the prompts first: a family the scorer does not know is refused before any study is opened
        evaluate = scorer.make_evaluator(engine, args.families, args.prompts, args.seed, args.prompts_file, cancel)
        study = open_study(args.storage, args.study, space, objectives, args.sampler, args.seed)
        run_trials(study, space, skeleton, evaluate, args.trials, args.timeout, cancel=cancel, on_trial=_say_refused)
        if not received and not study.best_trials:
            raise EngineError(f"study {study.study_name!r} has no completed trial (every setting tried was refused: narrow the space)")
        try:
            result = None if received else report(study, skeleton, evaluate)
        except GenerationCancelled:  # a signal during the report's held-out runs
            result = None
    if result is None:  # stopped by a signal: the study keeps what it has (its running trial PRUNED)
        print(kept_line(study, args.storage, received[0]), file=sys.stderr)
        return 128 + received[0]
    if args.front_out is not None:
        write_front(args.front_out, args.model, result)
    print(json.dumps(result) if args.json else format_report(result))
    if not args.json:
        print(f"[storage {args.storage}  study {study.study_name}]", file=sys.stderr)
    return 0
