"""`python app.py`: bad input ends with one line on stderr and exit status 2 (no server started)."""

from __future__ import annotations

import pytest

import app


def test_missing_model_is_one_line_and_status_2(tmp_path, capsys):
    assert app.main(["--model", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model folder not found") and "--no-model" in err[0]


def test_bad_numbers_are_refused(capsys):
    assert app.main(["--fps", "0"]) == 2
    assert app.main(["--threads", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_unknown_flag_is_one_line(capsys):
    try:
        app.main(["--nonsense"])
    except SystemExit as exc:
        assert exc.code == 2
    assert capsys.readouterr().err.strip().startswith("error: unrecognized arguments")


def test_gradio_environment_settings_win_unless_a_flag_is_given(monkeypatch, capsys):
    """A Hugging Face Space sets GRADIO_SERVER_NAME/PORT: left to Gradio unless --host/--port say
    otherwise, and a non-loopback address from the environment turns public mode on too."""
    import socket

    import gradio as gr

    launched: list[dict] = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.append(kw))
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    with socket.socket() as s:  # a free port: the app checks that it can bind the address it is given
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("GRADIO_SERVER_PORT", str(s.getsockname()[1]))
    assert app.main(["--no-model"]) == 0
    assert launched[-1]["server_name"] is None and launched[-1]["server_port"] is None  # Gradio reads the environment
    assert "serving 0.0.0.0 to the network" in capsys.readouterr().err
    assert app.main(["--no-model", "--host", "127.0.0.1", "--port", "7000"]) == 0
    assert (launched[-1]["server_name"], launched[-1]["server_port"]) == ("127.0.0.1", 7000)
    assert "to the network" not in capsys.readouterr().err


def test_the_server_listens_where_the_environment_says(tmp_path):
    """The real thing: `python app.py` with only GRADIO_SERVER_PORT set answers on that port."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "app.py", "--no-model"], cwd=os.path.dirname(app.__file__) or ".", env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a start-up bound, not a speed assertion
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/config", timeout=5) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the app never answered on $GRADIO_SERVER_PORT"
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_model_and_device_defaults_come_from_the_environment(monkeypatch, tmp_path, capsys):
    """A Space starts `python app.py` with no arguments: its variables choose the model."""
    monkeypatch.setenv("DINFER_VIZ_MODEL", str(tmp_path / "from-env"))
    assert app.main([]) == 2  # the variable's folder is what it tried to load
    assert str(tmp_path / "from-env") in capsys.readouterr().err


@pytest.mark.parametrize("port", ["99999", "0", "-5", "http"])
def test_a_port_out_of_range_is_one_line_and_status_2(port, capsys):
    """#43 item 6: --port 99999 was an AttributeError traceback, --port 0 an httpx one."""
    try:
        status = app.main(["--port", port])
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and "--port" in err and "\n" not in err, err
