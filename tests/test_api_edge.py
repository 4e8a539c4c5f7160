"""The Python API's edge (#43 item 7; engine/arguments.py): every wrong type or value given to
`Engine`, `Engine.generate`, `generate_ids`, `GenerationConfig` and `RunHooks` is an EngineError in
one line, never a TypeError, AttributeError, AssertionError or IndexError from inside, and the
engine goes on answering."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig, RunHooks


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine("tiny-llada")


def refused(call, words: str) -> None:
    with pytest.raises(EngineError, match=words) as caught:
        call()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda e: e.generate(None), "prompts must be a text or a non-empty list of texts"),
        (lambda e: e.generate(123), "prompts must be"),
        (lambda e: e.generate([]), "prompts must be"),
        (lambda e: e.generate(["ok", 5]), "prompts must be"),
        (lambda e: e.generate("Q: 1+1=? A:", {"gen_length": 8}), "config must be a GenerationConfig"),
        (lambda e: e.generate("Q: 1+1=? A:", GenerationConfig(gen_length=8, block_length=8), {"trace": True}), "hooks must be a RunHooks"),
        (lambda e: e.generate_ids([[1, 2, 10**9]], GenerationConfig(gen_length=8, block_length=8)), "token id 1000000000 is outside the vocabulary"),
        (lambda e: e.generate_ids([[1, -3]], GenerationConfig(gen_length=8, block_length=8)), "token id -3 is outside"),
        (lambda e: e.generate_ids("abc", GenerationConfig(gen_length=8, block_length=8)), "lists of token ids"),
        (lambda e: e.generate_ids([[1.5]], GenerationConfig(gen_length=8, block_length=8)), "lists of token ids"),
        # issue #55: the four that leaked a TypeError or AttributeError from inside
        (lambda e: e.generate("Q: 1+1=? A:", GenerationConfig(gen_length=8, block_length=8), expected=5), "expected must be a text or a list of texts"),
        (lambda e: e.generate(["Q: 1+1=? A:", "Q: 2+2=? A:"], GenerationConfig(gen_length=8, block_length=8), expected=["2", 4]), "expected must be"),
        (lambda e: e.encode(123), "the prompt must be a text, got int"),
        (lambda e: e.decode(["a"]), "ids must be a list of token ids"),
        (lambda e: e.decode([-1]), "token id -1 is outside the vocabulary"),
        (lambda e: e.decode([2**70]), "is outside the vocabulary"),
        (lambda e: e.generate("Q: 1+1=? A:", GenerationConfig(kind=["masked"])), "kind must be a string, got list"),
        (lambda e: e.generate("Q: 1+1=? A:", GenerationConfig(decoder=["threshold"])), "decoder must be a string, got list"),
        (lambda e: e.generate_ids([[1, 2]], GenerationConfig(kind=["masked"])), "kind must be a string"),
    ],
)
def test_a_call_with_a_wrong_argument_is_one_line(engine, call, words):
    refused(lambda: call(engine), words)
    assert engine.generate("Q: 1+1=? A:", GenerationConfig(gen_length=8, block_length=8)).texts[0]  # it goes on


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"path": 123}, "the model must be a folder"),
        ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "cuda:99"}, "CUDA device"),
        ({"device": 5}, "device must be a text"),
        ({"dtype": "float8"}, "dtype 'float8' is not one of"),
        ({"dtype": torch.int64}, "dtype must be one of"),
        ({"max_tokens": -1}, "max_tokens must be a positive integer"),
        ({"tp_size": 0}, "tp and ep must be >= 1"),
        ({"compile": "yes"}, "compile and cuda_graphs must be true or false"),
    ],
)
def test_an_engine_with_a_wrong_argument_is_one_line(kwargs, words):
    arguments = {"path": "tiny-llada", **kwargs}
    refused(lambda: Engine(arguments.pop("path"), **arguments), words)


def test_the_dtype_may_be_named():
    assert Engine("tiny-llada", dtype="float32").model.dtype == torch.float32


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: GenerationConfig(unknown=1), "unknown generation setting\\(s\\): unknown; the settings: kind, gen_length"),
        (lambda: GenerationConfig(temperature=1e308).validate(), "temperature must be <= 100"),
        (lambda: GenerationConfig(decoder="edit", decoder_options={"repetition_penalty": 1e308}).validate(), "repetition_penalty must be in \\[0, 100\\]"),
        (lambda: RunHooks(cancel=True), "RunHooks.cancel must be a threading.Event"),
        (lambda: RunHooks(trace="yes"), "RunHooks.trace must be True or False"),
        (lambda: RunHooks(on_iteration=5), "RunHooks.on_iteration must be a function"),
        (lambda: RunHooks(max_tokens=0), "RunHooks.max_tokens must be a positive integer"),
        (lambda: RunHooks(constraints=(".*",)), "RunHooks.constraints must be a tuple of ConstraintSpec"),
    ],
)
def test_a_config_or_hooks_with_a_wrong_value_is_one_line(make, words):
    refused(make, words)
    RunHooks(cancel=threading.Event(), on_iteration=print, max_tokens=64)  # the right kinds pass


@pytest.mark.parametrize(
    "change, words",
    [
        ({"n_layers": 1_000_000}, "n_layers 1000000 is beyond any checkpoint"),
        ({"vocab_size": 2**40}, "vocab_size 1099511627776 is beyond"),
        ({"max_sequence_length": 10**12}, "max_sequence_length 1000000000000 is beyond"),
        ({"rope_theta": "NaN"}, "rope_theta must be a finite number"),
    ],
)
def test_a_config_json_out_of_bounds_is_refused_before_anything_is_built(tmp_path, change, words):
    """#43 item 5: `n_layers: 1000000` gave no answer in 120 s (a million layers built), a string
    rope_theta a TypeError; 2**40 vocabulary rows and a 10**12 canvas were accepted."""
    import json
    import shutil

    from engine.models.loader import EMBEDDED_ROOT

    folder = tmp_path / "model"
    shutil.copytree(EMBEDDED_ROOT / "tiny-llada", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    refused(lambda: Engine(str(folder)), words)


def test_files_that_are_not_regular_or_too_long_are_refused_before_reading(tmp_path, capsys):
    """#43 item 6: `--json-schema FIFO` and `analyze FIFO` hung; `analyze /dev/zero` read until
    memory ran out; a trace holding a 5,000-digit integer was a ValueError."""
    import os

    from engine.__main__ import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    huge.write_text('{"version": ' + "9" * 5000 + "}")
    cases = [
        (["analyze", str(fifo)], "is not a regular file"),
        (["analyze", "/dev/zero"], "is not a regular file"),
        (["analyze", str(huge)], "trace: "),
        (["generate", "--json-schema", str(fifo), "--prompt", "x"], "is not a regular file"),
    ]
    for argv, words in cases:
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own refusals exit
            status = exc.code
        err = capsys.readouterr().err.strip()
        assert status == 2 and words in err and "\n" not in err, (argv, status, err)


def test_a_model_name_no_file_system_takes_is_one_line_in_the_app():
    """#43 item 6: a 5,000-character model path in the app was "internal error: OSError"."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec("tiny-llada")))
    for name in ("a" * 5000, "folder/" + "b" * 300):
        refused(lambda: h.parse({"model": {"path": name}}), "the model name is")  # what Run and every settings check call


def test_a_replay_outside_the_run_is_one_line():
    """#43 item 6: `/replay -5` returned a bare update; an iteration past the run's too."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.run_view import RUN_VIEW
    from dinfer_viz.tabs.shown import FINISHED, RunState
    from dinfer_viz.reading.timeline import Timeline
    from dinfer_viz.ui import Handlers

    from .app_support import handmade_trace

    h = Handlers(EngineHost(ModelSpec("/nonexistent")), no_model=True)
    state = RunState(Timeline(handmade_trace()), None, FINISHED)
    for number in (-5, 5, 10**30):
        message = dict(zip(RUN_VIEW, h.replay(number, state)))["message"]
        assert "the iteration to show must be from 0" in message and "\n" not in message.strip()
    assert dict(zip(RUN_VIEW, h.replay(4, state)))["grid"]  # the last iteration shows


@pytest.mark.parametrize("change, field", [
    ({"gen_length": 10**30}, "config.gen_length must be a finite number of at most 2**53"),
    ({"gen_length": -5}, "config.gen_length must be an integer from 1 to canvas_length"),
    ({"gen_length": 10**6}, "config.gen_length must be an integer from 1 to canvas_length"),
    ({"threshold": float("nan")}, "config.threshold must be a finite number"),
    ({"temperature": float("inf")}, "config.temperature must be a finite number"),
    ({"temperature": -1.0}, "config.temperature must be at least 0.0"),
    ({"decoder_options": {"alpha": 1e300}}, "config.decoder_options.alpha must be a finite number of at most 2**53"),
])
def test_a_trace_whose_config_no_run_could_hold_is_refused_naming_the_field(tmp_path, change, field):
    """#55 (was #43 item 6: a config's gen_length 10**30 reached the page's box): a recorded
    config with NaN, a negative or a huge number is refused as the trace loads, in one line naming
    the field, by the engine's loader and so by the app's."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers
    from engine.trace import Trace

    from .app_support import handmade_trace

    trace = handmade_trace()
    trace.config = {**trace.config, **change}
    path = tmp_path / "odd.json"
    path.write_text(trace.to_json())
    refused(lambda: Trace.from_json(path.read_text()), "trace: " + re.escape(field))
    h = Handlers(EngineHost(ModelSpec("/nonexistent")), no_model=True)
    message = dict(zip(h.loaded_slots, h.load_trace(str(path))))["message"]
    assert "cannot load this trace" in message and "config." in message and "\n" not in message.strip()
