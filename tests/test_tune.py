"""The tuner (docs/tuning.md): its space from the declarations, refusals as FAIL trials, the
front non-dominated with held-out figures, the splits apart, two processes on one study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from engine import Engine, GenerationConfig
from engine.__main__ import main
from engine.kinds.base import KINDS, ModelTraits, fit, kind_decoders
from engine.models import model_skeleton
from engine.registry import builtin_decoder_names, decoder_class
from engine.tuning.space import STEPS_PER_BLOCK, build_space
from engine.tuning.study import HELD_OUT_SPLIT, TUNING_SPLIT, WORKERS_SUFFIX, front, open_study, report, run_trials, trial_config, worker_seed
from tinymodel.tasks import get_task
from tinymodel.tune_prompts import evaluator, file_examples, tune_examples

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"gen_length": "32"}  # short canvases keep each trial to a few forwards


@pytest.fixture(scope="module")
def engine():
    with Engine("tiny-llada") as eng:
        yield eng


@pytest.fixture(scope="module")
def evaluate(engine):
    return evaluator(engine, {s: tune_examples(["pairsum"], s, 2) for s in (TUNING_SPLIT, HELD_OUT_SPLIT)})


def _ask(space, n: int, seed: int = 0) -> list[tuple[dict, GenerationConfig]]:
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        out.append((trial.params, config))
        study.tell(trial, [0.0, 0.0])
    return out


def test_the_space_is_the_declarations_and_a_decoders_options_appear_only_when_chosen():
    skeleton = model_skeleton("tiny-llada")
    runnable = {k for k in KINDS if KINDS[k].refuses(ModelTraits.of(skeleton)) is None}
    assert {d.name: d for d in build_space(skeleton, fix=SMALL).dimensions}["kind"].choices == tuple(k for k in KINDS if k in runnable)
    space = build_space(skeleton, fix={**SMALL, "kind": "masked"})  # the masked kind's decoders and their options
    dims = {d.name: d for d in space.dimensions}
    assert dims["decoder"].choices == tuple(builtin_decoder_names("masked"))  # plug-ins join when named
    assert dims["block_length"].choices == (1, 2, 4, 8, 16, 32)  # the divisors of gen_length 32
    assert "kind" not in dims  # fixed
    assert set(dims["cache"].choices) == {"none", "prefix", "dual", "vicinity"}
    for params, config in _ask(space, 60):
        for name in params:
            if "." in name:  # <decoder>.<option>: only the chosen decoder's, in its declared range
                owner, option = name.split(".")
                assert owner == config.decoder and option in decoder_class(owner).options
                decoder_class(owner).options[option].check(option, params[name])
        assert set(config.decoder_options) == set(decoder_class(config.decoder).options)
        assert (STEPS_PER_BLOCK in params) == (config.decoder in ("fixed", "remdm"))  # the decoders that read steps
        assert ("threshold" in params) == ("threshold" in decoder_class(config.decoder).settings)
        assert config.gen_length % config.block_length == 0


def test_a_block_causal_model_searches_its_kinds_and_its_cache_modes():
    space = build_space(model_skeleton("tiny-llada2"))
    dims = {d.name: d for d in space.dimensions}
    assert set(dims["kind"].choices) == {"masked", "speculative"}
    assert set(dims["cache"].choices) == {"none", "prefix"}  # LLaDA2's block-causal modes
    for params, config in _ask(space, 30):
        assert ("verify" in params) == (params["kind"] == "speculative")
        assert config.kind == ("speculative" if params["kind"] == "speculative" else None)


def test_fix_decoders_and_space_narrow_it_and_bad_ones_say_so():
    skeleton = model_skeleton("tiny-llada")
    space = build_space(skeleton, decoders=["threshold", "hierarchical"], fix={"cache": "dual"}, space={"threshold": "0.5:0.9", "temperature": ""})
    dims = {d.name: d for d in space.dimensions}
    assert dims["decoder"].choices == ("threshold", "hierarchical") and "cache" not in dims and space.base.cache == "dual"
    assert (dims["threshold"].low, dims["threshold"].high) == (0.5, 0.9)
    assert (dims["temperature"].low, dims["temperature"].high) == (0.0, 100.0)  # its declared range
    for params, config in _ask(space, 20):
        assert 0.5 <= config.threshold <= 0.9 and config.cache == "dual"
    from engine.errors import EngineError

    for kwargs, words in (
        ({"fix": {"nonsense": "1"}}, "no setting 'nonsense'"),
        ({"space": {"threshold": "0.2:1.5"}}, "not inside"),
        ({"decoders": ["uniform"]}, "no decoder 'uniform'"),
        ({"fix": {"cache": "sideways"}}, "cache must be one of"),
    ):
        with pytest.raises(EngineError, match=words):
            build_space(skeleton, **kwargs)


def test_a_plug_in_decoder_is_searched_when_named_and_its_unbounded_option_says_how(own_registry):
    """A plug-in loaded in the process stays out of the default space (the example's max_per_step
    declares no range); named with --decoders it joins, and that option needs its range or a fix."""
    from engine.errors import EngineError
    from engine.registry import load_plugins

    load_plugins(str(Path(__file__).resolve().parent.parent / "examples" / "entropy_decoder.py"))
    skeleton = model_skeleton("tiny-llada")
    assert "entropy" in kind_decoders("masked")
    masked = {**SMALL, "kind": "masked"}  # a trial of a kind without decoders suggests none
    assert "entropy" not in {d.name: d for d in build_space(skeleton, fix=masked).dimensions}["decoder"].choices
    with pytest.raises(EngineError, match="max_per_step declares no upper bound"):
        _ask(build_space(skeleton, decoders=["entropy"], fix=masked), 1)
    space = build_space(skeleton, decoders=["entropy", "threshold"], fix={**masked, "max_per_step": "2"})
    chosen = {config.decoder for _, config in _ask(space, 12)}
    assert chosen == {"entropy", "threshold"}
    assert all(config.decoder_options == {"max_per_step": 2} for _, config in _ask(space, 12) if config.decoder == "entropy")


def test_fixed_settings_the_model_refuses_are_refused_before_the_study_in_one_line():
    from engine.errors import EngineError

    skeleton = model_skeleton("tiny-llada")
    # fit refuses the speculative kind on a bidirectional model; WINO refuses a cache mode
    for fix, words in (({"kind": "speculative"}, "kind 'speculative' cannot run on this model"), ({"decoder": "wino", "cache": "dual"}, "cache 'dual' is not supported")):
        with pytest.raises(EngineError, match=f"^the fixed settings leave this model nothing to run: .*{words}"):
            build_space(skeleton, fix={**fix, **SMALL})


def test_a_setting_refused_as_its_run_starts_is_a_failed_trial_not_an_accuracy_of_zero(tmp_path, evaluate):
    """The space offers nothing the settings' checks refuse; what only a prompt decides (the
    canvas, prompt + gen_length, past the model's positions) is refused as the run starts: a FAIL
    trial with its message, and the study goes on."""
    skeleton = model_skeleton("tiny-llada")
    space = build_space(skeleton, decoders=["threshold"], fix={"gen_length": str(skeleton.max_positions - 2)})
    study = open_study(f"sqlite:///{tmp_path}/refused.db", "refused", space, ("accuracy", "tpf"))
    run_trials(study, space, skeleton, evaluate, 2)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all(t.values is None and "exceeds the model's max_sequence_length" in t.user_attrs["refused"] for t in study.trials)


def test_the_front_is_non_dominated_reproducible_and_carries_held_out_and_default_figures(tmp_path, evaluate):
    skeleton = model_skeleton("tiny-llada")
    space = build_space(skeleton, decoders=["threshold", "fixed", "factor"], fix={"cache": "none", "smoothing": "false", "unroll": "false", **SMALL})
    study = open_study(f"sqlite:///{tmp_path}/front.db", "front", space, ("accuracy", "tpf"), seed=3)
    run_trials(study, space, skeleton, evaluate, 8)
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert done
    result = report(study, skeleton, evaluate)
    points = [(p["accuracy"], p["tpf"]) for p in result["front"]]

    def dominates(a, b):
        return a[0] >= b[0] and a[1] >= b[1] and a != b

    assert not any(dominates(a, b) for a in points for b in points)
    for t in done:  # every trial off the front is dominated by (or equal to) a point on it
        mine = (t.user_attrs["accuracy"], t.user_attrs["tpf"])
        assert mine in points or any(dominates(p, mine) for p in points)
    for p in result["front"]:
        assert 0 <= p["held_out_accuracy"] <= 1 and p["held_out_tpf"] > 0
    assert result["default"]["config"] == {} and result["default"]["held_out_tpf"] > 0
    assert {t["number"] for t in result["trials"]} == {t.number for t in done}
    # a trial's stored settings reproduce its figures (greedy decoding)
    first = front(study)[0]
    again = evaluate(fit(trial_config(first), skeleton), TUNING_SPLIT)
    assert (again.accuracy, again.tpf) == (first.user_attrs["accuracy"], first.user_attrs["tpf"])


def test_a_stop_prunes_the_running_trial_and_ends_the_study(tmp_path, engine):
    skeleton = model_skeleton("tiny-llada")
    cancel = threading.Event()
    scored = evaluator(engine, {TUNING_SPLIT: tune_examples(["pairsum"], TUNING_SPLIT, 2)}, cancel)

    def evaluate(config, split):  # the stop arrives while the second trial runs
        if len(study.trials) == 2:
            cancel.set()
        return scored(config, split)

    space = build_space(skeleton, decoders=["threshold"], fix=SMALL)
    study = open_study(f"sqlite:///{tmp_path}/stop.db", "stop", space, ("accuracy", "tpf"))
    run_trials(study, space, skeleton, evaluate, 10, cancel=cancel)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED]


def test_a_study_of_another_space_is_not_joined(tmp_path):
    skeleton = model_skeleton("tiny-llada")
    from engine.errors import EngineError

    open_study(f"sqlite:///{tmp_path}/s.db", "one", build_space(skeleton), ("accuracy", "tpf"))
    with pytest.raises(EngineError, match="other space"):
        open_study(f"sqlite:///{tmp_path}/s.db", "one", build_space(skeleton, decoders=["fixed"]), ("accuracy", "tpf"))


def test_held_out_prompts_are_never_tuning_prompts(tmp_path):
    for family in ("add", "pairsum", "rhyme", "grammar"):
        tuning = {e.prompt for e in tune_examples([family], TUNING_SPLIT, 40)}
        held = {e.prompt for e in tune_examples([family], HELD_OUT_SPLIT, 40)}
        assert tuning and held and not tuning & held
    lines = [get_task("pairsum").example(n).prompt for n in range(60)]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(lines))
    tuning, held = ({e.prompt for e in file_examples(str(path), s)} for s in (TUNING_SPLIT, HELD_OUT_SPLIT))
    assert tuning and held and not tuning & held and tuning | held == set(lines)


@pytest.mark.parametrize("argv, words", [
    (["--fix", "threshold"], "--fix takes NAME=VALUE"),
    (["--fix", "decoder=sideways"], "decoder must be one of"),
    (["--trials", "0"], "--trials must be from 1"),
    (["--storage", "tune.db"], "--storage must be a database URL"),
    (["--families", "poetry"], "unknown task 'poetry'"),
])
def test_bad_tune_arguments_are_one_line_and_exit_2(argv, words, tmp_path, capsys):
    assert main(["tune", "--storage", f"sqlite:///{tmp_path}/x.db", "--trials", "1", "--prompts", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, words", [
    (["--seed", "-1"], "the seed must be from 0 to 4294967295"),
    (["--seed", str(2**70)], "the seed must be from 0 to 4294967295"),
    (["--prompts-file", "/dev/zero"], "is not a regular file"),
    (["--prompts-file", "{fifo}"], "is not a regular file"),
    (["--prompts-file", "{big}"], "more than 1,048,576"),
    (["--storage", "journal:{fifo}"], "is not a regular file"),
    (["--storage", "sqlite:///{fifo}"], "is not a regular file"),
    (["--storage", "sqlite:///{tmp}/no/such/folder/x.db"], "no folder"),
    (["--storage", "ftp://host/x"], "--storage must be a database URL"),
    (["--fix", f"gen_length={10**9}"], "gen_length must be below the model's max_sequence_length"),
    (["--fix", "threshold=5"], "threshold"),
    (["--fix", "temperature=nan"], "temperature"),
    (["--timeout", "nan"], "--timeout must be above 0"),
    (["--study", "x" * 300], "--study must be 1 to 256"),
])
def test_every_tune_flag_is_checked_before_the_study_in_one_line(argv, words, tmp_path, capsys):
    fifo, big = tmp_path / "fifo", tmp_path / "big.txt"
    os.mkfifo(fifo)
    big.write_text("Q: 1+1= A: 2\n" * 100_000)
    argv = [a.format(fifo=fifo, big=big, tmp=tmp_path) for a in argv]
    storage = [] if argv[0] == "--storage" else ["--storage", f"sqlite:///{tmp_path}/x.db"]
    assert main(["tune", *storage, "--trials", "1", "--prompts", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.db").exists()  # refused before any study was opened


@pytest.mark.parametrize("directions, trial", [(["maximize"], False), (["minimize", "maximize"], False), (["maximize", "maximize"], True)])
def test_a_study_another_program_made_is_refused_in_one_line(directions, trial, tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/foreign.db"
    foreign = optuna.create_study(storage=url, study_name="theirs", directions=directions)
    if trial:  # their trials hold no config: joining them would end in a KeyError in the report
        foreign.optimize(lambda t: [t.suggest_float("x", 0, 1)] * len(directions), n_trials=2)
    before = [(t.number, t.state) for t in foreign.trials]
    assert main(["tune", "--storage", url, "--study", "theirs", "--trials", "1", "--prompts", "1", "--fix", "gen_length=32"]) == 2
    err = capsys.readouterr().err
    assert "study 'theirs' is not this tuner's" in err and err.count("\n") == 1
    after = optuna.load_study(study_name="theirs", storage=url)
    assert [(t.number, t.state) for t in after.trials] == before and "space" not in after.user_attrs  # left as it was


def test_workers_that_create_one_new_database_at_once_all_open_it(tmp_path):
    # Optuna's RDBStorage alone fails here in all but one thread (the schema's tables and its
    # version row created at once: "table already exists", "UNIQUE constraint failed")
    from engine.tuning.study import open_storage

    url, errors, start = f"sqlite:///{tmp_path}/new.db", [], threading.Barrier(8)

    def open_it():
        start.wait()
        try:
            open_study(url, "race", build_space(model_skeleton("tiny-llada")), ("accuracy", "tpf"))
        except Exception as exc:  # noqa: BLE001 (the test reports whichever it is)
            errors.append(repr(exc))

    workers = [threading.Thread(target=open_it) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))] == ["race", "race" + WORKERS_SUFFIX]
    register = optuna.load_study(study_name="race" + WORKERS_SUFFIX, storage=url)
    assert sorted(t.number for t in register.trials) == list(range(8))  # each worker its own index


def test_two_tune_processes_on_one_storage_complete_one_study_of_all_their_trials(tmp_path):
    """#58 item 3: two processes started with the same command split the work: each claims its
    own worker index and samples from its own seed, so their trials try (nearly) as many settings
    as there are trials, and the space offers no setting the engine refuses (no FAIL trial), over
    every kind and decoder the model runs."""
    storage = f"sqlite:///{tmp_path}/shared.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "engine", "tune", "--storage", storage, "--study", "shared", "--trials", "4", "--prompts", "2", "--json", "--fix", "gen_length=32"]
    workers = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=600) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err[-500:] for _, err in outputs]
    study = optuna.load_study(study_name="shared", storage=storage)
    assert len(study.trials) == 8 and all(t.state == TrialState.COMPLETE for t in study.trials), [(t.state, t.user_attrs.get("refused")) for t in study.trials]
    assert len({json.dumps(t.user_attrs["config"], sort_keys=True) for t in study.trials}) >= 7
    register = optuna.load_study(study_name="shared" + WORKERS_SUFFIX, storage=storage)
    assert sorted(t.number for t in register.trials) == [0, 1] and len({t.user_attrs["process"] for t in register.trials}) == 2
    numbers = {t.number for t in study.trials}
    for out, _ in outputs:
        result = json.loads(out)
        assert {t["number"] for t in result["trials"]} <= numbers and result["front"]
    last = json.loads(outputs[0][0] if len(json.loads(outputs[0][0])["trials"]) >= len(json.loads(outputs[1][0])["trials"]) else outputs[1][0])
    assert {t["number"] for t in last["trials"]} == numbers  # the one that finished last saw every trial


def test_each_worker_samples_from_its_own_seed_drawn_from_the_studys_and_its_index(tmp_path):
    space = build_space(model_skeleton("tiny-llada"), fix=SMALL)
    url = f"sqlite:///{tmp_path}/seeds.db"
    seeds = [worker_seed(7, worker) for worker in range(4)]
    assert seeds[0] == 7 and len(set(seeds)) == 4 and seeds == [worker_seed(7, worker) for worker in range(4)]
    first, second = (open_study(url, "seeded", space, ("accuracy", "tpf"), seed=7) for _ in range(2))
    asked = [[space.suggest(study.ask()) for _ in range(3)] for study in (first, second)]
    assert asked[0] != asked[1]  # worker 1 draws its own settings
    alone = open_study(None, None, space, ("accuracy", "tpf"), seed=7)  # worker 0 samples as a study of one always did
    assert [space.suggest(alone.ask()) for _ in range(3)] == asked[0]
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="was started with other seed"):  # every worker draws the study's prompts
        open_study(url, "seeded", space, ("accuracy", "tpf"), seed=8)


def _running_trial(storage: str, study: str) -> bool:
    """Whether the study in `storage` has a trial running (False while the study is not there yet)."""
    try:
        return any(t.state == TrialState.RUNNING for t in optuna.load_study(study_name=study, storage=storage).trials)
    except KeyError:  # not created yet
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_ends_the_running_trial_and_says_what_the_study_kept(signum, tmp_path):
    storage = f"sqlite:///{tmp_path}/signal.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tune = subprocess.Popen(
        [sys.executable, "-m", "engine", "tune", "--storage", storage, "--study", "s", "--trials", "500", "--prompts", "40", "--decoders", "fixed", "--fix", "gen_length=64"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 600  # a hang guard on the start (torch's import, the model)
        while not _running_trial(storage, "s"):  # the study runs a trial: the signal lands inside it
            assert tune.poll() is None, tune.communicate()
            assert time.monotonic() < deadline, "no trial started"
            time.sleep(0.2)
        tune.send_signal(signum)
        out, err = tune.communicate(timeout=120)  # a hang guard: the running generation stops within a layer
    finally:
        if tune.poll() is None:
            tune.kill()
    assert tune.returncode == 128 + signum and out == ""
    line = err.strip().splitlines()[-1]
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states  # consistent: the running trial was marked
    completed, pruned, failed = (states.count(s) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    name = signal.Signals(signum).name
    assert line == f"stopped by {name}: study 's' in {storage} keeps {completed} completed, {pruned} pruned and {failed} failed trials; run again with --study s to go on"
    assert completed + pruned + failed < 500
