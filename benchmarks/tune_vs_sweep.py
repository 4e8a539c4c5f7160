"""The tuner against the threshold sweep at the same number of runs (issue #45, docs/tuning.md §6).

    nice python -m benchmarks.tune_vs_sweep --model tiny-llada --families pairsum --trials 32 --prompts 8

Both search on the families' tuning (train) split with `--trials` configs each: the tuner's study
(`python -m engine tune`'s, engine/tuning/) over the whole declared space, and the threshold sweep:
the default settings with `--trials` thresholds spread evenly over the range the tuner searches
(engine/tuning/space.py UNDECLARED_RANGES). Each side's Pareto front on the tuning split
(Optuna's `best_trials`: the sweep's points are added to a study of their own as completed trials)
is then run on the held-out split, and the two held-out fronts are scored by Optuna's hypervolume
over (accuracy, TPF) from the reference point (0, 0). Beside them, the default settings and the
tuned front's point of best held-out accuracy, and its fastest point at least as accurate as the
default, on the held-out split. Figures are reproducible: greedy decoding and a seeded sampler.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

import numpy as np
import optuna
from optuna._hypervolume import compute_hypervolume  # Optuna's own (no public name in 4.x)
from optuna.distributions import FloatDistribution

from engine.cli import OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.config import GenerationConfig
from engine.kinds.base import ModelTraits, fit
from engine.models import model_skeleton
from engine.pipeline import Engine
from engine.tuning.space import UNDECLARED_RANGES, build_space, changed_settings
from engine.tuning.study import OBJECTIVES, TUNING_SPLIT, Evaluate, open_study, report, run_trials
from tinymodel.tune_prompts import make_evaluator

REFERENCE = (0.0, 0.0)  # accuracy, TPF: the hypervolume's corner


def hypervolume(points: list[dict[str, Any]]) -> float:
    """Optuna's hypervolume of the held-out (accuracy, TPF) points, both maximised."""
    if not points:
        return 0.0
    losses = np.array([[-p["held_out_accuracy"], -p["held_out_tpf"]] for p in points])
    return float(compute_hypervolume(losses, -np.array(REFERENCE)))


def sweep_study(model: Any, evaluate: Evaluate, runs: int) -> optuna.Study:
    """The threshold sweep as a study: `runs` thresholds on the default settings, each a completed
    trial with the tuner's attributes, so the report treats both alike."""
    study = optuna.create_study(directions=["maximize"] * 2)
    low, high = UNDECLARED_RANGES["threshold"]
    for threshold in np.linspace(low, high, runs):
        config = fit(replace(GenerationConfig(), threshold=float(threshold)), ModelTraits.of(model))
        figures = evaluate(config, TUNING_SPLIT).to_dict()
        study.add_trial(optuna.trial.create_trial(
            values=[figures["accuracy"], figures["tpf"]], params={"threshold": float(threshold)},
            distributions={"threshold": FloatDistribution(low, high)}, user_attrs={"config": changed_settings(config), **figures},
        ))
    return study


def best_points(front: list[dict[str, Any]], default: dict[str, Any]) -> dict[str, Any]:
    """The tuned front's most accurate point on the held-out split (ties: the faster), and its
    fastest point at least as accurate there as the default settings (None when no point is)."""
    accurate = max(front, key=lambda p: (p["held_out_accuracy"], p["held_out_tpf"]))
    as_good = [p for p in front if p["held_out_accuracy"] >= default["held_out_accuracy"]]
    return {"most_accurate": accurate, "fastest_as_accurate_as_default": max(as_good, key=lambda p: p["held_out_tpf"]) if as_good else None}


def compare(args: argparse.Namespace) -> dict[str, Any]:
    skeleton = model_skeleton(args.model)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    set_cpu_threads(skeleton, args.threads)
    with Engine(args.model, **apply_runtime(args)) as engine:
        evaluate = make_evaluator(engine, args.families, args.prompts, args.seed)
        study = open_study(None, None, build_space(skeleton), OBJECTIVES[:2], args.sampler, args.seed)
        run_trials(study, build_space(skeleton), skeleton, evaluate, args.trials)
        tuned = report(study, skeleton, evaluate)
        swept = report(sweep_study(skeleton, evaluate, args.trials), skeleton, evaluate)
    refused = sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
    return {
        "model": args.model, "families": args.families, "trials": args.trials, "prompts": args.prompts, "seed": args.seed, "sampler": args.sampler,
        "refused": refused, "tuned": {"hypervolume": hypervolume(tuned["front"]), "front": tuned["front"]},
        "sweep": {"hypervolume": hypervolume(swept["front"]), "front": swept["front"]},
        "default": tuned["default"], **best_points(tuned["front"], tuned["default"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.tune_vs_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-llada")
    parser.add_argument("--families", nargs="+", default=["pairsum"])
    parser.add_argument("--trials", type=int, default=32, help="configs each side runs on the tuning split")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per family on each split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", choices=["tpe", "nsga2"], default="tpe")
    add_runtime_args(parser)
    print(json.dumps(compare(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
