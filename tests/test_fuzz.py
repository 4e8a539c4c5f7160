"""The fuzz lane (tests/conftest.py LANES): generated bad inputs against the one-line contract of
every interface, so a setting added later cannot reopen what #33 closed.

Each case is drawn from a seeded generator (the same cases on every run; a failure names its seed
and case number) and mutates one or two settings of a small valid request with a hostile value:
numbers past every integer type, NaN, negative counts, lone surrogates, wrong types. The contract:
- the CLI exits 0, or 2 with one line `error: ...` on stderr (never a traceback);
- the server answers 2xx or 4xx with OpenAI's one-line error body, never a 5xx;
- the app's page shows its message in one line, never "internal error".
A request that the checks accept runs on a tiny model (its work bounded by the declared limits),
so the lane's time is bounded by its case count, not by what the values ask for.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from engine import GenerationConfig
from engine.__main__ import main as cli_main
from engine.registry import decoder_options

from .app_support import handmade_trace, random_char_model

SEED = 33
CASES = 40  # per interface

# what a hostile client sends: past every integer type, not finite, negative, empty, not text
HOSTILE_NUMBERS: list[Any] = [-1, 0, 10**9, 2**63, 2**70, 10**400, -(10**30), 1e308, -1e-308, 0.5, True]
HOSTILE_TEXT = ["", " ", "\ud800", "\udcff x", "x" * 5000, "nan", "inf", "-inf", "1e999", "abc", "💥", "0x10", "None"]
HOSTILE_JSON: list[Any] = [*HOSTILE_NUMBERS, *HOSTILE_TEXT, None, [], [1, 2], {}, {"a": 1}, [[[[]]]]]
BASE = {"gen_length": 8, "block_length": 8}  # small enough that an accepted case costs little

SETTINGS = [f.name for f in dataclasses.fields(GenerationConfig)]


def _draw(rng: random.Random, pool: list[Any]) -> Any:
    value = rng.choice(pool)
    return float("nan") if value == "nan" and rng.random() < 0.3 else value


def _mutations(rng: random.Random) -> dict[str, Any]:
    """One or two settings (a config field, or a decoder's own option) set to hostile values."""
    names = SETTINGS + list(decoder_options())
    return {rng.choice(names): _draw(rng, HOSTILE_JSON) for _ in range(rng.randint(1, 2))}


def _request(rng: random.Random) -> dict[str, Any]:
    """A config as JSON (the server's fields, the app's settings), a decoder's options nested."""
    options = decoder_options()
    body: dict[str, Any] = dict(BASE)
    for name, value in _mutations(rng).items():
        if name in options:
            body["decoder"] = options[name][0]
            body.setdefault("decoder_options", {})[name] = value
        else:
            body[name] = value
    return body


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message.strip() and "Traceback" not in message


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return random_char_model(tmp_path_factory.mktemp("fuzz-model"))


def _flag_value(rng: random.Random) -> str:
    value = _draw(rng, [*HOSTILE_NUMBERS, *HOSTILE_TEXT])
    return str(value) if not isinstance(value, float) or value == value else "nan"


@pytest.mark.parametrize("case", range(CASES))
def test_the_cli_answers_generated_bad_flags_with_exit_2_and_one_line(case, folder, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a drawn `--trace <text>` writes a file there, never into the checkout
    rng = random.Random(f"{SEED}-cli-{case}")
    flags = ["--" + name.replace("_", "-") for name in (*SETTINGS, *decoder_options(), "threads", "tp", "trace", "model") if name != "decoder_options"]
    argv = ["generate", "--model", str(folder), "--prompt", "Q: 1+2=? A:", "--gen-length", "8", "--block-length", "8"]
    for _ in range(rng.randint(1, 2)):
        argv += [rng.choice(flags), _flag_value(rng)]
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse: a value of the wrong type, an unknown choice
        code = exc.code
    err = capsys.readouterr().err
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("error:") and one_line(err), (argv, err)


@pytest.fixture(scope="module")
def client(folder):
    from fastapi.testclient import TestClient

    from engine import Engine
    from engine.serving.app import create_app
    from engine.serving.limits import RequestLimits

    app = create_app(Engine(folder), RequestLimits(max_gen_length=64))
    with TestClient(app) as http:
        yield http, app.state.server


@pytest.mark.parametrize("case", range(CASES))
def test_the_server_answers_generated_bad_bodies_with_a_4xx_in_one_line_never_a_5xx(case, client):
    http, server = client
    rng = random.Random(f"{SEED}-server-{case}")
    body = {"prompt": "Q: 1+2=? A:", **_request(rng)}
    if rng.random() < 0.3:  # an OpenAI field or the prompt itself hostile too
        body[rng.choice(["prompt", "max_tokens", "stop", "stream", "model", "n", "seed"])] = _draw(rng, HOSTILE_JSON)
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    if rng.random() < 0.2:  # the body itself broken: cut short, or bytes that are not UTF-8
        raw = raw[: rng.randint(0, len(raw))] if rng.random() < 0.5 else raw.replace(b'"', b'"\xff', 1)
    reply = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code < 500, (body, reply.status_code, reply.text)
    if reply.status_code >= 400:
        assert one_line(reply.json()["error"]["message"]), reply.text
    assert server.pending == 0


@pytest.fixture(scope="module")
def handlers(folder):
    from dinfer_viz.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    host = EngineHost(ModelSpec(str(folder)))
    host.preload()
    return Handlers(host, fps=1000, plot_hz=1000, max_prompt_chars=200, max_gen_length=64)


def _page_message(view: tuple) -> str:
    from dinfer_viz.tabs.run import RUN_VIEW

    return str(view[RUN_VIEW.index("message")])


@pytest.mark.parametrize("case", range(CASES))
def test_the_app_answers_generated_bad_settings_in_one_line_in_the_page(case, handlers):
    rng = random.Random(f"{SEED}-app-{case}")
    settings: dict[str, Any] = {"config": _request(rng)}
    if rng.random() < 0.3:  # a model setting too: the system options' degrees and switches
        settings["model"] = {rng.choice(["tp_size", "ep_size", "compile", "dtype", "device"]): _draw(rng, HOSTILE_JSON)}
    prompt = rng.choice(["Q: 1+2=? A:", "\ud800", "Q: \udcff A:", " ", "x" * 300])
    view = None
    for view in handlers.run(prompt, settings):
        pass
    message = _page_message(view)
    assert one_line(message) and "internal error" not in message, (prompt, settings, message)


@pytest.mark.parametrize("case", range(CASES))
def test_the_app_answers_generated_bad_traces_in_one_line_in_the_page(case, handlers, tmp_path):
    """A trace with one field (of the header, or of a record) replaced by a hostile value loads
    or is refused in one line; it never reaches a view as a TypeError."""
    rng = random.Random(f"{SEED}-trace-{case}")
    data = handmade_trace().to_dict()
    target = data if rng.random() < 0.5 else rng.choice(data["iterations"])
    key = rng.choice(sorted(target))
    if isinstance(target[key], dict) and target[key] and rng.random() < 0.5:  # inside an object: stats, config
        target[key][rng.choice(sorted(target[key]))] = _draw(rng, HOSTILE_JSON)
    else:
        target[key] = _draw(rng, HOSTILE_JSON)
    file = tmp_path / "t.json"
    file.write_bytes(json.dumps(data, allow_nan=True).encode("utf-8", "surrogatepass"))
    message = _page_message(handlers.load_trace(str(file)))
    assert one_line(message) and "internal error" not in message and "cannot show" not in message, (key, target.get(key), message)

