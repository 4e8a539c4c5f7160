"""One way to name a model everywhere (#34 item 7): the embedded models by name or as
`assets/<name>` from any directory, in the CLI, the Python API and the server (the app: through
dinfer_viz/live/host.py, tests/test_app_models.py); a name that is neither a folder nor on the hub gets
one line saying both. Every `generate` and `serve` flag has help (#34 item 8). No network: the hub
is asked offline (HF_HUB_OFFLINE), which answers from the local cache at once."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine import Engine
from engine.__main__ import build_parser, main
from engine.models.loader import EMBEDDED_ROOT, embedded_models, resolve_model_path

EMBEDDED = ("tiny-llada", "tiny-llada-td", "tiny-llada-edit", "tiny-gemma")
ROOT = EMBEDDED_ROOT.parent
pytestmark = pytest.mark.skipif(not set(EMBEDDED) <= set(embedded_models()), reason="the embedded models are not shipped in this checkout")


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working directory outside the repository, with the hub offline."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.parametrize("name", EMBEDDED)
def test_an_embedded_name_and_its_assets_path_resolve_from_any_directory(name, elsewhere):
    assert resolve_model_path(name) == EMBEDDED_ROOT / name
    assert resolve_model_path(f"assets/{name}") == EMBEDDED_ROOT / name


def test_a_folder_in_the_working_directory_wins_over_an_embedded_name(elsewhere):
    (elsewhere / "tiny-llada").mkdir()
    assert resolve_model_path("tiny-llada") == Path("tiny-llada")


def test_the_python_api_takes_a_name_and_the_readme_path_from_any_directory(elsewhere):
    assert Engine("tiny-llada").name == Engine("assets/tiny-llada").name


@pytest.mark.parametrize("name", ["tiny-gemma", "tiny-llada-edit"])
def test_the_cli_generates_on_an_embedded_name(name, elsewhere, capsys):
    argv = ["generate", "--model", name, "--prompt", "Q: 7+58=? A:", "--gen-length", "16", "--block-length", "16", "--json"]
    assert main(argv + (["--decoder", "uniform"] if name == "tiny-gemma" else [])) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("nobody-here/no-such-model", ["no folder here nor an embedded model", "hub download of 'nobody-here/no-such-model' failed"]),
        ("./no/such/folder", ["no folder here, no embedded model", "no hub id"]),
        ("tiny-lada", ["no folder here, no embedded model (tiny-gemma, tiny-llada"]),
    ],
)
def test_a_name_that_is_nowhere_gets_one_line_saying_so(model, said, elsewhere, capsys):
    assert main(["generate", "--model", model, "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model folder not found") and "\n" not in err, err
    assert all(s in err for s in said), err


def test_the_server_serves_an_embedded_name_from_any_directory(tmp_path):
    import socket

    with socket.socket() as s:  # a port free now; serve refuses 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", "tiny-llada-edit", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the model is loaded and the port bound
        assert line.startswith("serving"), (line, proc.stderr.read() if proc.poll() is not None else "")
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert "tiny-llada-edit" in json.dumps(models)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _flags(command: str) -> list[argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if a.option_strings and "--help" not in a.option_strings]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_every_flag_has_help(command):
    bare = [a.option_strings[0] for a in _flags(command) if not a.help or a.help == argparse.SUPPRESS]
    assert not bare, f"{command} flags without help: {bare}"
