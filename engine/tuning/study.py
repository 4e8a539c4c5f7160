"""The tuner's study: an Optuna multi-objective study over a SearchSpace, each trial one config
scored on the tuning split, the Pareto front judged on the held-out split (docs/tuning.md §3).

Optuna does the sampling (TPE or NSGA-II, seeded), the storage that several processes or
machines share (`open_study` joins a study of the same name, `load_if_exists`) and the front
(`study.best_trials`); this module says what a trial is. A trial's config is what `fit`
(engine/kinds/base.py) makes of the suggested settings: a setting the kind or the model refuses
is a FAIL trial (its message kept as the `refused` attribute), never an accuracy of 0. A trial
whose settings an earlier completed trial of the study already ran takes that trial's figures
(decoding is greedy, so running it again would repeat them): workers sharing a study, whose
samplers may propose the same settings, never spend two runs on one config. A trial stopped
mid-way (`cancel`) is PRUNED and the study stops.

Scoring is the caller's `Evaluate`: the prompts and their verifier belong to the caller (the
embedded tasks: tinymodel/tune_prompts.py), the engine only searches.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from ..config import GenerationConfig
from ..errors import EngineError
from ..kinds.base import ModelTraits, fit
from ..run import GenerationCancelled
from .space import SearchSpace, changed_settings

OBJECTIVES = ("accuracy", "tpf", "tps")  # TPS, noisy, only when asked
TUNING_SPLIT, HELD_OUT_SPLIT = "train", "held_out"
MAX_WRONG = 5  # wrong answers a trial keeps (prompt, answer): enough to see what goes wrong
SAMPLERS = ("tpe", "nsga2")
STORAGE_ATTEMPTS = 5  # opening a database that other workers create at the same moment
SQLITE_LOCK_SECONDS = 120
MAX_STORAGE_URL = 4096
MAX_SEED = 2**32 - 1  # NumPy's seeds (the samplers')
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")  # SQLAlchemy's, each with its optional +driver
WORKERS_SUFFIX = ":workers"  # the register of a study's workers, beside it (`claim_worker`)


@dataclass
class Figures:
    """One config's run over one split's prompts: sums, so long answers weigh more in TPF."""

    prompts: int = 0
    correct: int = 0
    tokens: int = 0
    nfe: int = 0
    seconds: float = 0.0
    wrong: list[dict[str, str]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.correct / self.prompts if self.prompts else 0.0

    @property
    def tpf(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, correct: bool, tokens: int, nfe: int, seconds: float, prompt: str, answer: str) -> None:
        self.prompts += 1
        self.correct += bool(correct)
        self.tokens, self.nfe, self.seconds = self.tokens + tokens, self.nfe + nfe, self.seconds + seconds
        if not correct and len(self.wrong) < MAX_WRONG:
            self.wrong.append({"prompt": prompt, "answer": answer})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "accuracy": self.accuracy, "tpf": self.tpf, "tps": self.tps}


# Scores one config on one split ("train": the tuning prompts; "held_out": the report's).
Evaluate = Callable[[GenerationConfig, str], Figures]


def _check_file(path: str, what: str) -> None:
    """A storage file is a regular file or not there yet (in a folder that is): a FIFO, a device
    or a folder would hang the open or fail deep inside the driver."""
    if not path:
        raise EngineError(f"--storage {what} names no file")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise EngineError(f"--storage {what} {path[:200]!r} is not a regular file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise EngineError(f"--storage {what} {path[:200]!r}: no folder {folder[:200]!r}")


def check_storage(url: str) -> None:
    """Refuse, in one line and before anything opens it, a storage URL the tuner cannot use: too
    long, of another scheme, or naming a file that is not a regular one."""
    if len(url) > MAX_STORAGE_URL:
        raise EngineError(f"--storage is longer than {MAX_STORAGE_URL} characters")
    if url.startswith("journal:"):
        _check_file(url[len("journal:"):], "journal")
        return
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] not in RDB_SCHEMES:
        raise EngineError(f"--storage must be a database URL ({', '.join(s + '://' for s in RDB_SCHEMES)}, e.g. sqlite:///tune.db) or journal:PATH, got {url[:80]!r}")
    if scheme.split("+")[0] == "sqlite" and rest.removeprefix("/") not in ("", ":memory:"):
        _check_file(rest.removeprefix("/").split("?")[0], "sqlite file")


def open_storage(url: str) -> Any:
    """An Optuna storage: an RDB URL (sqlite:///file.db, postgresql://..., mysql://...) or
    `journal:PATH`, Optuna's journal file (safe on NFS for many machines); checked first
    (`check_storage`)."""
    check_storage(url)
    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url[len("journal:"):]))
    import sqlalchemy.exc
    from optuna.storages import RDBStorage

    # SQLite's wait for another writer's lock (Python's default, 5 s, is short for workers on a
    # loaded machine: "database is locked")
    engine_kwargs = {"connect_args": {"timeout": SQLITE_LOCK_SECONDS}} if url.startswith("sqlite") else None
    for attempt in range(STORAGE_ATTEMPTS - 1):
        try:
            return RDBStorage(url, engine_kwargs=engine_kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # Workers that create a new database at once race on its schema's version row
            # (UNIQUE constraint failed: alembic_version.version_num) or its lock; the schema is
            # there once the winner commits, so opening it again joins it
            time.sleep(0.2 * (attempt + 1))
    return RDBStorage(url, engine_kwargs=engine_kwargs)  # the last attempt's error is the one said


def check_seed(seed: int) -> None:
    """The samplers' seed (and the prompts drawn) within what NumPy's generators take."""
    if not 0 <= seed <= MAX_SEED:
        raise EngineError(f"the seed must be from 0 to {MAX_SEED}, got {str(seed)[:40]}")


def worker_seed(seed: int, worker: int) -> int:
    """The sampler's seed of a study's worker `worker` (0, 1, ...): the study's own seed for the
    first, so a study of one worker samples as it always did; for the others a seed NumPy's
    SeedSequence draws from the pair, so each worker explores on its own, reproducibly."""
    return seed if worker == 0 else int(np.random.SeedSequence(seed, spawn_key=(worker,)).generate_state(1)[0])


def claim_worker(storage: Any, name: str) -> int:
    """This process's index among the workers of study `name` (0 for the first to join, then 1,
    2, ...): the number of its trial in the study's register of workers (`<name>:workers`, beside
    it in the storage), which the storage numbers atomically as it numbers any study's trials, so
    workers that join at the same moment never share one. The trial keeps the process and host."""
    register = optuna.create_study(storage=storage, study_name=name + WORKERS_SUFFIX, load_if_exists=True)
    trial = register.ask()
    trial.set_user_attr("process", f"{socket.gethostname()[:200]}:{os.getpid()}")
    register.tell(trial, float(trial.number))
    return trial.number


def open_study(storage: str | None, name: str | None, space: SearchSpace, objectives: tuple[str, ...], sampler: str = "tpe", seed: int = 0) -> optuna.Study:
    """Create the study, or join it (another worker's, or a stopped one resumed); a study that
    searches another space or other objectives, or was seeded otherwise, is refused in one line.
    The study's seed (its first worker's) draws the prompts of every worker; each worker's sampler
    draws from its own seed (`worker_seed` of the study's seed and the worker's index,
    `claim_worker`), so N workers explore N times as much. `storage` None: in memory (the app's,
    for one page's session; its one worker is 0)."""
    if sampler not in SAMPLERS:
        raise EngineError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    check_seed(seed)
    opened = open_storage(storage) if storage else None
    try:
        study = optuna.create_study(storage=opened, study_name=name, directions=["maximize"] * len(objectives), load_if_exists=True)
    except (ValueError, RuntimeError) as exc:  # Optuna's word on a study it cannot open as asked
        raise EngineError(f"cannot open study {name!r} in {(storage or 'memory')[:80]}: {exc}") from None
    except Exception as exc:  # the database driver's errors (SQLAlchemy's), in one line
        raise EngineError(f"cannot open the storage {(storage or 'memory')[:80]}: {str(exc).splitlines()[0][:200]}") from None
    directions = [d.name.lower() for d in study.directions]
    if directions != ["maximize"] * len(objectives):
        raise EngineError(f"study {study.study_name!r} is not this tuner's: its objectives' directions are {', '.join(directions)}; this tuner maximises {', '.join(objectives)}; give another --study")
    recorded = {"space": space.fingerprint(), "objectives": list(objectives), "seed": seed}
    missing = [key for key in recorded if key not in study.user_attrs]
    # a study with trials but without the tuner's records was made by another program: its trials
    # hold no config to report (an empty one is adopted: another worker may be creating it now; a
    # study that predates the recorded seed adopts this one's)
    if [key for key in missing if key != "seed"] and study.get_trials(deepcopy=False):
        raise EngineError(f"study {study.study_name!r} is not this tuner's: it has trials but no recorded {' or '.join(missing)}; give another --study")
    for key, value in recorded.items():
        if key in missing:
            study.set_user_attr(key, value)
        elif study.user_attrs[key] != value:
            raise EngineError(f"study {study.study_name!r} was started with other {key} ({str(study.user_attrs[key])[:120]}): use the same flags, or another --study")
    own = worker_seed(seed, 0 if opened is None else claim_worker(opened, study.study_name))
    study.sampler = optuna.samplers.TPESampler(seed=own) if sampler == "tpe" else optuna.samplers.NSGAIISampler(seed=own)
    return study


def trial_config(trial: FrozenTrial) -> GenerationConfig:
    """The config a completed trial ran (its stored settings over the defaults)."""
    return GenerationConfig.from_dict(trial.user_attrs["config"])


def run_trials(
    study: optuna.Study,
    space: SearchSpace,
    model: Any,
    evaluate: Evaluate,
    trials: int | None,
    timeout: float | None = None,
    cancel: threading.Event | None = None,
    on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> None:
    """Run up to `trials` trials (this worker's; others may add theirs to the same study) or until
    `timeout` seconds or `cancel`: the running trial's generation stops within a layer and the
    trial is PRUNED. `on_trial` sees each finished trial (the app's live front)."""
    traits = ModelTraits.of(model)
    objectives = tuple(study.user_attrs.get("objectives", OBJECTIVES[:2]))
    cancel = cancel or threading.Event()

    def objective(trial: optuna.Trial) -> list[float]:
        try:
            config = fit(space.suggest(trial), traits)
        except EngineError as exc:
            trial.set_user_attr("refused", str(exc))
            raise
        settings = changed_settings(config)
        trial.set_user_attr("config", settings)
        earlier = next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.user_attrs.get("config") == settings), None)
        if earlier is not None:
            figures = {k: v for k, v in earlier.user_attrs.items() if k not in ("config", "repeat_of")}
            trial.set_user_attr("repeat_of", earlier.number)
        else:
            try:
                figures = evaluate(config, TUNING_SPLIT).to_dict()
            except GenerationCancelled:
                raise optuna.TrialPruned("stopped") from None
            except EngineError as exc:  # a rule checked as the run starts (a decoder's cache modes)
                trial.set_user_attr("refused", str(exc))
                raise
        for key, value in figures.items():
            trial.set_user_attr(key, value)
        return [float(figures[name]) for name in objectives]

    def stop_when_cancelled(study: optuna.Study, trial: FrozenTrial) -> None:
        if on_trial is not None:
            on_trial(study, trial)
        if cancel.is_set():
            study.stop()

    if cancel.is_set():
        return
    # EngineError other than a stop: the settings were refused (FAIL); the study goes on
    study.optimize(objective, n_trials=trials, timeout=timeout, catch=(EngineError,), callbacks=[stop_when_cancelled])


def front(study: optuna.Study) -> list[FrozenTrial]:
    """The study's Pareto front (Optuna's `best_trials`), by TPF: one trial per point, the first
    to reach it (trials of other settings but equal figures tie on the front: with a few prompts,
    dozens of them, each of which the report would run again on the held-out split)."""
    seen: set[tuple[float, ...]] = set()
    out = []
    for trial in sorted(study.best_trials, key=lambda t: (t.user_attrs["tpf"], t.number)):
        key = tuple(trial.values)
        if key not in seen:
            seen.add(key)
            out.append(trial)
    return out


def _point(config: dict[str, Any], tuned: dict[str, Any], held_out: Figures) -> dict[str, Any]:
    return {
        "config": config, "accuracy": tuned["accuracy"], "tpf": tuned["tpf"], "tps": tuned["tps"],
        "held_out_accuracy": held_out.accuracy, "held_out_tpf": held_out.tpf, "held_out_tps": held_out.tps,
    }


def report(study: optuna.Study, model: Any, evaluate: Evaluate) -> dict[str, Any]:
    """`{trials, front, default}`: the study's completed trials (number, config, figures), its
    front with each point also run on the held-out split, and the engine's default settings
    (fitted to the model) on both splits."""
    trials = [
        {"number": t.number, "config": t.user_attrs["config"], **{k: v for k, v in t.user_attrs.items() if k != "config"}}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ]
    points = [_point(t.user_attrs["config"], t.user_attrs, evaluate(trial_config(t), HELD_OUT_SPLIT)) | {"trial": t.number} for t in front(study)]
    default = fit(GenerationConfig(), ModelTraits.of(model))
    default_point = _point(changed_settings(default), evaluate(default, TUNING_SPLIT).to_dict(), evaluate(default, HELD_OUT_SPLIT))
    return {"study": study.study_name, "trials": trials, "front": points, "default": default_point}


def format_report(result: dict[str, Any]) -> str:
    """The front and the default as a table: tuning-split and held-out figures side by side."""
    def row(label: str, p: dict[str, Any]) -> str:
        settings = settings_text(p["config"])
        return f"{label:>7}  {p['accuracy']:6.1%}  {p['tpf']:5.2f}  {p['tps']:7.1f}  {p['held_out_accuracy']:8.1%}  {p['held_out_tpf']:6.2f}  {settings}"

    lines = [
        f"study {result['study']}: {len(result['trials'])} completed trials; the front ({len(result['front'])} points) and the default settings",
        f"{'trial':>7}  {'acc':>6}  {'tpf':>5}  {'tps':>7}  {'held acc':>8}  {'held tpf':>6}  settings",
    ]
    lines += [row(f"#{p['trial']}", p) for p in result["front"]]
    lines.append(row("default", result["default"]))
    return "\n".join(lines)


def settings_text(config: dict[str, Any]) -> str:
    """A trial's settings in one line, a decoder's options among them ("(defaults)" for none)."""
    flat = {**{k: v for k, v in config.items() if k != "decoder_options"}, **config.get("decoder_options", {})}
    return ", ".join(f"{k}={f'{v:.3g}' if isinstance(v, float) else v}" for k, v in sorted(flat.items())) or "(defaults)"
