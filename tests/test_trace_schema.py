"""The trace as an interchange format: docs/trace.schema.json accepts every shipped sample trace,
a real engine trace, the example writer's output and the docs' hand-written trace, which all load
with Trace.from_json; the writer imports nothing of the project."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import GenerationConfig, RunHooks, run_diffusion
from engine.trace import Trace

from .conftest import tiny_llada

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "docs" / "trace.schema.json").read_text())
SAMPLES = sorted(p for p in (ROOT / "assets" / "traces").glob("*.json") if p.name != "index.json")


def validate(data: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(data)


def test_the_schema_is_valid():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_shipped_sample_traces_validate(path):
    data = json.loads(path.read_text())
    validate(data)
    trace = Trace.from_dict(data)
    validate(trace.to_dict())  # and once upgraded to the current version
    assert trace.to_json() == json.dumps(trace.to_dict())  # written from its own values, as from the copy


def test_a_real_trace_validates_and_a_broken_one_does_not():
    trace = run_diffusion(tiny_llada(), [[3, 4, 5]], GenerationConfig(gen_length=8, block_length=4, decoder="edit", threshold=0.5), hooks=RunHooks(trace=True)).trace
    data = json.loads(trace.to_json())
    validate(data)
    for broken in ({**data, "version": 9}, {**data, "extra": 1}, {**data, "iterations": [{**data["iterations"][0], "top1": "x"}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_the_writer_is_standalone_and_its_trace_loads(tmp_path):
    source = ROOT / "examples" / "write_trace.py"
    imported = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in getattr(n, "names", [])}
    assert imported <= {"__future__", "json", "sys"}, imported
    out = tmp_path / "w.json"
    subprocess.run([sys.executable, str(source), str(out)], check=True, timeout=60)
    data = json.loads(out.read_text())
    validate(data)
    trace = Trace.from_json(out.read_text())
    assert trace.canvas_at(len(trace.iterations) - 1) == trace.final


def test_the_docs_hand_written_trace_loads():
    text = (ROOT / "docs" / "analysis.md").read_text()
    block = re.findall(r"```json\n(.*?)```", text, re.S)[-1]
    validate(json.loads(block))
    trace = Trace.from_json(block)
    from engine.analysis import analyze

    result = analyze(trace)
    assert result["finalized_fraction"] == [0.5, 1.0] and result["order_correlation"] == 1.0
