"""A tensor-parallel Engine in a plain script: its workers are spawned with the caller's script
hidden (engine/runtime/lifecycle.py), so a script that starts `Engine(..., tp_size=2)` at its top
level runs once and answers what one process answers. Spawn runs the caller's main script again in
each child, which started an Engine inside each worker and ended both ranks ("worker rank 0 died")
before. Real processes ("workers" lane)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a bound on a hang, not a speed
PROMPT = "Q: 14+5=? A:"
SETTINGS = "gen_length=16, block_length=8, use_chat_template=False"


def test_a_top_level_script_with_tensor_parallelism_runs_once_and_answers_as_one_process(tmp_path):
    ran = tmp_path / "ran.txt"
    script = tmp_path / "parallel.py"
    script.write_text(
        "from engine import Engine, GenerationConfig\n"
        f"open({str(ran)!r}, 'a').write('ran\\n')\n"
        f"engine = Engine({DEFAULT_MODEL!r}, tp_size=2)\n"
        f"print(repr(engine.generate({PROMPT!r}, GenerationConfig({SETTINGS})).text))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=LIMIT_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert ran.read_text() == "ran\n"  # no worker ran the script's top level again
    config = GenerationConfig(gen_length=16, block_length=8, use_chat_template=False)
    assert eval(done.stdout.strip().splitlines()[-1]) == Engine(DEFAULT_MODEL).generate(PROMPT, config).text
