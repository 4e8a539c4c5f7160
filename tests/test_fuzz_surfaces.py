"""The fuzz lane (tests/conftest.py LANES), #55's other surfaces (tests/test_fuzz.py has the rest):
- the tuner's flags: one or two flags of `python -m engine tune` given drawn bad values (each
  flag's own pool: out of range, not a number, special files, URLs of no storage, settings the
  model refuses): exit 2, one line `error: ...`, and no study started (its storage never made);
- the tuner under signals: a real `tune` process given SIGINT or SIGTERM (drawn, once or twice)
  while a drawn trial runs, on a drawn storage (SQLite or a journal) and sampler: it exits with
  128 + the signal and one line saying what the study kept, no trial left RUNNING;
- every refusal of a request's settings through the server, on every embedded model: configs drawn
  from the declared values of the settings that choose what else runs (kind, decoder, cache mode,
  a switch, a decoder's or a kind's own option, a setting some kind does not read, a constraint),
  the engine's own verdict (`check_settings`) said first; the server answers each refusal with a
  400 and the engine's one line, on the plain and the streamed path, and what the engine accepts
  with no 5xx.
Each case is seeded (SEED); a failure names its case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from engine import GenerationConfig
from engine.__main__ import main as cli_main

from .test_fuzz import SEED, one_line

ROOT = Path(__file__).resolve().parent.parent
FLAG_CASES, SIGNAL_CASES, REFUSAL_CASES = 32, 3, 24  # the last per embedded model
EMBEDDED = ("tiny-llada", "tiny-llada-edit", "tiny-llada-td", "tiny-llada2", "tiny-gemma")

# each flag's bad values ({tmp}, {fifo}, {big}: made by the case)
BAD_FLAGS: dict[str, list[str]] = {
    "--seed": ["-1", str(2**32), str(2**70), str(10**400), "nan", "1.5", "", "abc", "0x10", "\ud800"],
    "--trials": ["0", "-1", "100000", str(10**400), "nan", "1.5", ""],
    "--prompts": ["0", "-5", "301", str(10**9), "x"],
    "--timeout": ["0", "-1", "nan", "inf", "-inf", "1e308", str(31 * 86400), "x"],
    "--storage": [
        "tune.db", "ftp://host/x", "journal:", "journal:/dev/zero", "journal:{fifo}", "sqlite:///{fifo}", "sqlite:///{tmp}/no/such/x.db",
        "sqlite:///{tmp}", "x" * 5000, "", "postgresql", "journal:{tmp}/no/such/x.log", "sqlite:///\ud800/x.db",
    ],
    "--study": ["", "x" * 300, "a\nb", "\x00", "\x1b[31m"],
    "--prompts-file": ["/dev/zero", "{fifo}", "{big}", "{tmp}/missing.txt", "{tmp}", "\x00"],
    "--fix": [
        "threshold", "threshold=5", "threshold=-1", "threshold=nan", "threshold=inf", "threshold=abc", "threshold=", "gen_length=0", "gen_length=-8",
        f"gen_length={10**9}", "gen_length=1e999", "temperature=-1", "temperature=nan", "decoder=sideways", "decoder=", "cache=sideways",
        "kind=nonexistent", "kind=speculative", "nonsense=1", "block_length=0", "block_length=3", "decoder=uniform", "t_min=-1",
    ],
    "--space": ["threshold=0.2:1.5", "threshold=abc:1", "threshold=", "nonsense", "temperature=5:1", "cache=sideways", "decoder=uniform", "gen_length"],
    "--decoders": ["uniform", "sideways", "threshold,,nonsense", "\ud800"],
    "--threads": ["0", "-1", str(10**6), "x"],
    "--sampler": ["random", "", "TPE"],
    "--families": ["poetry", ""],
}


@pytest.mark.parametrize("case", range(FLAG_CASES))
def test_the_tuner_answers_generated_bad_flags_with_exit_2_and_one_line_before_any_study(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a drawn relative path lands here
    rng = random.Random(f"{SEED}-tune-flags-{case}")
    fifo, big = tmp_path / "fifo", tmp_path / "big.txt"
    os.mkfifo(fifo)
    big.write_text("Q: 1+1= A: 2\n" * 100_000)
    flags = sorted(BAD_FLAGS)
    drawn = [(flag, rng.choice(BAD_FLAGS[flag]).format(tmp=tmp_path, fifo=fifo, big=big)) for flag in [flags[case % len(flags)], *rng.sample(flags, rng.randint(0, 1))]]
    storage = [] if any(flag == "--storage" for flag, _ in drawn) else ["--storage", f"sqlite:///{tmp_path}/x.db"]
    argv = ["tune", *storage, "--trials", "1", "--prompts", "1", *[part for pair in drawn for part in pair]]
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse: a value of the wrong type, an unknown choice
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and one_line(err), (drawn, code, err)
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "tune.db").exists(), drawn  # refused before any study was opened


def _running(storage: str, study: str, number: int) -> bool:
    """Whether trial `number` of the study in `storage` runs (False while the study is not there yet)."""
    import optuna
    from optuna.trial import TrialState

    from engine.tuning.study import open_storage

    try:
        trials = optuna.load_study(study_name=study, storage=open_storage(storage)).trials
    except KeyError:  # not created yet
        return False
    return any(t.number >= number and t.state == TrialState.RUNNING for t in trials)


@pytest.mark.parametrize("case", range(SIGNAL_CASES))
def test_the_tuner_ends_on_a_drawn_signal_mid_trial_with_one_line_and_its_study_consistent(case, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from engine.tuning.study import open_storage

    rng = random.Random(f"{SEED}-tune-signal-{case}")
    signum, journal = [(signal.SIGINT, False), (signal.SIGTERM, True), (signal.SIGINT, True), (signal.SIGTERM, False)][case % 4]  # each in turn, the rest drawn
    storage = f"journal:{tmp_path}/s.log" if journal else f"sqlite:///{tmp_path}/s.db"
    number, repeats, sampler = rng.randint(0, 1), rng.randint(1, 2), rng.choice(["tpe", "nsga2"])
    command = [
        sys.executable, "-m", "engine", "tune", "--storage", storage, "--study", "s", "--trials", "500", "--prompts", str(rng.randint(4, 12)),
        "--sampler", sampler, "--fix", "gen_length=32", "--fix", "cache=none", "--decoders", rng.choice(["fixed", "threshold,fixed"]),
    ]
    drawn = (signal.Signals(signum).name, storage.split(":")[0], number, repeats, sampler)
    tune = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # a hang guard on the start (torch's import, the model)
        while not _running(storage, "s", number):  # the drawn trial runs: the signal lands inside it
            assert tune.poll() is None, (drawn, tune.communicate())
            assert time.monotonic() < deadline, (drawn, "no trial started")
            time.sleep(0.2)
        for _ in range(repeats):
            tune.send_signal(signum)
        out, err = tune.communicate(timeout=120)  # a hang guard: the running generation stops within a layer
    finally:
        if tune.poll() is None:
            tune.kill()
    assert tune.returncode == 128 + signum and out == "", (drawn, tune.returncode, err[-500:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, (drawn, err[-2000:])
    states = [t.state for t in optuna.load_study(study_name="s", storage=open_storage(storage)).trials]
    completed, pruned, failed = (states.count(s) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    # the running trial was marked; or the drawn trial ended between the look and the signal (these
    # trials are short) and the signal landed between two trials: then none was cut, every one completed
    assert TrialState.RUNNING not in states and (pruned == 1 or completed == len(states) > number), (drawn, states)
    assert lines[0].startswith(f"stopped by {drawn[0]}: study 's' in {storage} keeps {completed} completed, {pruned} pruned and {failed} failed trials"), (drawn, lines[0])


# ---- every settings refusal through the server -------------------------------------------------
def _declared_value(rng: random.Random, option: Any) -> Any:
    """A value a decoder's or a kind's option declares: a choice, or an end of its range (or its default)."""
    ends = [v for v in (option.least, option.most, option.default) if v is not None and not (option.above and v == option.least)]
    return rng.choice(option.choices or tuple(ends))


def _refusal_parts(rng: random.Random, base: GenerationConfig) -> dict[str, Any]:
    """What a refusal between settings (not a range's) is made of, each drawn from its declared
    values: category -> a function drawing the request fields it sets."""
    from engine.cache_modes import cache_modes
    from engine.kinds.base import KINDS, kind_options
    from engine.registry import decoder_class, decoder_names

    switches = [f.name for f in dataclasses.fields(GenerationConfig) if isinstance(f.default, bool)]
    constraints = [{"regex": "[0-9]{1,3}"}, {"choice": ["yes", "no"]}, {"json_schema": {"type": "integer"}}]

    def decoder_option() -> dict[str, Any]:
        decoder = rng.choice([d for d in decoder_names() if decoder_class(d).options])
        name, option = rng.choice(sorted(decoder_class(decoder).options.items()))
        return {"decoder": decoder, "decoder_options": {name: _declared_value(rng, option)}}

    def kind_option() -> dict[str, Any]:
        name = rng.choice(sorted(kind_options()))
        return {"kind_options": {name: _declared_value(rng, kind_options()[name][1])}}

    return {
        "kind": lambda: {"kind": rng.choice(list(KINDS))},
        "decoder": lambda: {"decoder": rng.choice(decoder_names())},
        "cache": lambda: {"cache": rng.choice([m.name for m in cache_modes()])},
        "decoder and cache": lambda: {"decoder": rng.choice(decoder_names()), "cache": rng.choice([m.name for m in cache_modes()])},
        "switch": lambda: (lambda name: {name: not getattr(base, name)})(rng.choice(switches)),
        "a setting some kind does not read": lambda: dict([rng.choice([("threshold", 0.5), ("steps", base.gen_length), ("temperature", 0.7), ("warmup", 1), ("expected_tpf", 2)])]),
        "kind option": kind_option,
        "kind and kind option": lambda: {"kind": rng.choice(list(KINDS)), **kind_option()},
        "constraint": lambda: rng.choice(constraints),
        "kind and constraint": lambda: {"kind": rng.choice(list(KINDS)), **rng.choice(constraints)},
        "decoder option": decoder_option,
        "temperatures": lambda: {"decoder": "uniform", "decoder_options": {"t_min": 0.9, "t_max": rng.choice([0.5, 0.9])}},
    }


def _body(rng: random.Random, base: GenerationConfig, case: int) -> dict[str, Any]:
    """The request's settings: the case's category first (each category in turn), then none to two drawn ones."""
    parts = _refusal_parts(rng, base)
    names = list(parts)
    body: dict[str, Any] = {}
    for name in [names[case % len(names)], *rng.sample(names, rng.randint(0, 2))]:
        for field, value in parts[name]().items():
            body[field] = {**body.get(field, {}), **value} if field.endswith("_options") else value
    return body


@pytest.fixture(scope="module", params=EMBEDDED)
def served(request) -> Iterator[tuple[str, Any, Any]]:
    import torch
    from fastapi.testclient import TestClient

    from engine import Engine
    from engine.serving.app import create_app
    from engine.serving.limits import RequestLimits

    torch.set_num_threads(1)
    engine = Engine(str(ROOT / "assets" / request.param))
    with TestClient(create_app(engine, RequestLimits(max_gen_length=64))) as http:
        yield request.param, engine, http


def engine_lines(body: dict[str, Any], model: Any) -> list[str]:
    """The engine's refusals of a request's settings: its checks' (`check_settings`), and the
    config's own (a request's is validated as it is parsed, so a config with two faults may be
    refused for either); empty when it accepts them."""
    from engine.errors import EngineError
    from engine.generation import check_settings

    lines = []
    for check in (lambda config: check_settings(config, model), GenerationConfig.validate):
        try:
            check(GenerationConfig(**body))
        except EngineError as exc:
            lines.append(str(exc))
    return lines


@pytest.mark.parametrize("case", range(REFUSAL_CASES))
def test_every_settings_refusal_is_a_400_in_the_engines_one_line_on_every_embedded_model(case, served):
    name, engine, http = served
    rng = random.Random(f"{SEED}-refusal-{name}-{case}")
    canvas = getattr(engine.model, "canvas_length", None)
    base = {"gen_length": canvas} if canvas else {"gen_length": 8, "block_length": 8}
    body = {**base, **_body(rng, GenerationConfig(**base), case)}
    lines = engine_lines(body, engine.model)
    refusal = lines[0] if lines else None
    stream = rng.random() < 0.5
    path, prompt = rng.choice([("/v1/completions", {"prompt": "Q: 1+2=? A:"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Q: 1+2=? A:"}]})])
    reply = http.post(path, json={**body, **prompt, "stream": stream, "provisional": stream and rng.random() < 0.5})
    drawn = (name, body, path, stream, refusal)
    assert reply.status_code < 500, (drawn, reply.status_code, reply.text[:500])
    if refusal is not None:
        assert reply.status_code == 400, (drawn, reply.text[:500])
        message = json.loads(reply.text)["error"]["message"]
        assert message in lines and one_line(message), (drawn, message)


def _chooser_values(base: GenerationConfig) -> list[tuple[str, Any]]:
    """Every declared value of the settings that choose what else a run reads: each kind, decoder
    and cache mode, each switch turned over."""
    from engine.cache_modes import cache_modes
    from engine.kinds.base import KINDS
    from engine.registry import decoder_names

    switches = [f.name for f in dataclasses.fields(GenerationConfig) if isinstance(f.default, bool)]
    return [*(("kind", k) for k in KINDS), *(("decoder", d) for d in decoder_names()), *(("cache", m.name) for m in cache_modes()), *((s, not getattr(base, s)) for s in switches)]


def _refusal_shapes(model: Any, base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each distinct refusal (its line with the quoted values and numbers blanked) that one or two
    choosing settings make on `model` -> the first request settings (in declared order) that make it."""
    import itertools
    import re

    from engine.errors import EngineError
    from engine.generation import check_settings

    values = _chooser_values(GenerationConfig(**base))
    shapes: dict[str, dict[str, Any]] = {}
    for combo in [*((v,) for v in values), *itertools.combinations(values, 2)]:
        if len({name for name, _ in combo}) < len(combo):
            continue
        body = {**base, **dict(combo)}
        try:
            check_settings(GenerationConfig(**body), model)
        except EngineError as exc:
            shapes.setdefault(re.sub(r"'[^']*'|\d+", "_", str(exc)), body)
    return shapes


def test_each_distinct_refusal_of_one_or_two_choosing_settings_is_a_400_on_every_embedded_model(served):
    """Not drawn but enumerated: every kind, decoder, cache mode and switch, alone and in pairs,
    through the engine's checks; one request for each distinct refusal they make (on the plain
    and the streamed path, alternately) answered 400 with the engine's line."""
    name, engine, http = served
    canvas = getattr(engine.model, "canvas_length", None)
    shapes = _refusal_shapes(engine.model, {"gen_length": canvas} if canvas else {"gen_length": 8, "block_length": 8})
    assert len(shapes) >= 3, shapes
    for i, body in enumerate(shapes.values()):
        stream = i % 2 == 1
        reply = http.post("/v1/completions", json={**body, "prompt": "Q: 1+2=? A:", "stream": stream, "provisional": stream})
        assert reply.status_code == 400, (name, body, reply.status_code, reply.text[:500])
        message = json.loads(reply.text)["error"]["message"]
        assert message in engine_lines(body, engine.model) and one_line(message), (name, body, message)
