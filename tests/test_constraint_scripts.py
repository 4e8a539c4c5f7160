"""A constraint in a plain script (issue 54 item 1): its automaton is built by a fresh interpreter
(engine/constraints/builder.py) that never imports the caller's main module, so a script that
works at its top level, `python -c` and a script read from standard input all run it, each once;
no build outlives the script, even one killed outright mid-build; and the build server's
interpreter never loads torch.

Real processes, each importing torch afresh ("processes" lane). Each sets its own automata folder
(DINFER_VIZ_CACHE), so its automaton is built, never read from the disk store.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.serve import children

from .conftest import assert_processes_end

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a bound on a hang, not a speed
REGEX = r" \d{1,3} \+ \d{1,3}"


def _script(ran: Path) -> str:
    """The newcomer's script, at its top level, noting each run of that top level in `ran`."""
    return (
        "from engine import Engine, GenerationConfig\n"
        f"open({str(ran)!r}, 'a').write('ran\\n')\n"
        f"print(repr(Engine('tiny-llada').generate('Q: ?+?=38 A:', GenerationConfig(regex={REGEX!r})).texts[0]))\n"
    )


def _environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DINFER_VIZ_CACHE": str(tmp_path / "automata")}


@pytest.mark.parametrize("how", ["file", "-c", "stdin"])
def test_a_top_level_script_with_a_regex_runs_once_and_obeys_it(tmp_path, how):
    ran = tmp_path / "ran.txt"
    script = _script(ran)
    path = tmp_path / "newcomer.py"
    path.write_text(script)
    command = {"file": [sys.executable, str(path)], "-c": [sys.executable, "-c", script], "stdin": [sys.executable, "-"]}[how]
    done = subprocess.run(command, input=script if how == "stdin" else None, capture_output=True, text=True, cwd=tmp_path, env=_environment(tmp_path), timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = eval(done.stdout.strip().splitlines()[-1])  # the repr the script printed
    assert re.fullmatch(REGEX, answer), answer
    assert ran.read_text() == "ran\n"  # the script's top level ran once: no build imported it again
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_no_build_outlives_a_script_killed_mid_build(tmp_path):
    """SIGKILL to a script while its build runs (a regex outlines-core builds for minutes): the
    build server sees its control socket close and ends, and the build's child dies with it."""
    script = tmp_path / "killed.py"
    script.write_text(
        "import threading, time\n"
        "from engine import GenerationConfig\n"
        "from engine.constraints import bounded\n"
        "threading.Thread(target=lambda: GenerationConfig(regex='(a|b)*a(a|b){24}').validate(), daemon=True).start()\n"
        "while not bounded.building():\n"
        "    time.sleep(0.05)\n"
        "print('building', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=_environment(tmp_path))
    try:
        assert process.stdout.readline().strip() == "building"
        servers = children(process.pid)
        builds = [pid for server in servers for pid in children(server)]
        assert len(servers) == 1 and len(builds) == 1, (servers, builds)
        assert "engine.constraints.builder" in Path(f"/proc/{servers[0]}/cmdline").read_text()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=LIMIT_S)
    start = time.monotonic()
    assert_processes_end(servers + builds, LIMIT_S, "the killed script")
    print(f"the build server and its build ended {time.monotonic() - start:.2f} s after the script")  # printed, never asserted


def test_the_build_server_starts_without_torch_and_a_bare_config_knows_every_decoder():
    """The build server's interpreter imports what builds run and nothing that loads torch (the
    whole engine took 1.5 s of its start): `import engine` imports nothing on its own, so the
    registry finds the engine's own decoders at its first question, in a bare script too."""
    from engine.registry import builtin_decoder_names

    probe = (
        "import sys\n"
        "import engine.constraints.builder\n"
        "print('torch' in sys.modules)\n"
        "from engine import GenerationConfig\n"
        "from engine.registry import decoder_names\n"
        "GenerationConfig(decoder='wino').validate()\n"
        "print(' '.join(decoder_names()))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DINFER_VIZ_DECODERS"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    imported_torch, names = done.stdout.splitlines()
    assert imported_torch == "False"
    assert {*builtin_decoder_names("masked"), *builtin_decoder_names("uniform")} <= set(names.split()), names
