"""Bad input at every boundary: the CLI, the Python API and the app's handlers each answer with one
line and keep working; no request can hold the engine; a stop ends even a long forward.

Every case is decided by what the engine does (a message, an exception, which layers ran), never by
how long something took.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig, RunHooks, Trace
from engine.__main__ import main as cli_main
from engine.run import GenerationCancelled

from .app_support import handmade_trace, random_char_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return random_char_model(tmp_path_factory.mktemp("char-model"))


@pytest.fixture(scope="module")
def engine(folder) -> Engine:
    return Engine(folder)


def broken_folder(base: Path, name: str, source: Path, weights: bytes | None = None, config: object = None) -> Path:
    """A copy of `source`'s JSON files with the weights and/or config.json replaced."""
    out = base / name
    out.mkdir()
    for f in source.glob("*.json"):
        (out / f.name).write_text(f.read_text())
    (out / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes() if weights is None else weights)
    if config is not None:
        (out / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return out


def _config_with(folder: Path, **changes) -> dict:
    return {**json.loads((folder / "config.json").read_text()), **changes}


def checkpoint_cases(folder: Path, base: Path) -> dict[str, Path]:
    import pickle

    weights = (folder / "model.safetensors").read_bytes()
    return {
        "truncated safetensors": broken_folder(base, "truncated", folder, weights[: len(weights) // 3]),
        "garbage safetensors": broken_folder(base, "garbage", folder, b"\x00\xff" * 500),
        "a pickle named model.safetensors": broken_folder(base, "pickle", folder, pickle.dumps({"w": [1, 2, 3]})),
        "config.json is an array": broken_folder(base, "array", folder, config=[1, 2]),
        "config.json is not JSON": broken_folder(base, "notjson", folder, config="{nope"),
        "n_heads is a word": broken_folder(base, "heads-word", folder, config=_config_with(folder, n_heads="four")),
        "n_heads is 0": broken_folder(base, "heads-zero", folder, config=_config_with(folder, n_heads=0)),
        "d_model is negative": broken_folder(base, "negative", folder, config=_config_with(folder, d_model=-64)),
        "unknown model type": broken_folder(base, "unknown", folder, config=_config_with(folder, model_type="gpt2", architectures=["GPT2"])),
    }


# ---- the CLI -----------------------------------------------------------------------------------
def _one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) if argv and argv[0] == "--argparse" else _nothing():
        code = cli_main(argv[1:] if argv and argv[0] == "--argparse" else argv)
        assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


CLI_CASES = {
    "gen length a million": (["--gen-length", "1000000", "--block-length", "1000000"], "exceeds the model's max_sequence_length"),
    "seed beyond 64 bits": (["--seed", str(2**70)], "seed must be in"),
    "negative seed": (["--seed", "-1"], "seed must be in"),
    "threshold above 1": (["--threshold", "1.5"], "threshold must be in"),
    "nan threshold": (["--threshold", "nan"], "threshold must be"),
    "infinite temperature": (["--temperature", "inf"], "temperature must be"),
    "gen length not a multiple": (["--gen-length", "30", "--block-length", "8"], "multiple of block_length"),
    "tp degree 0": (["--tp", "0"], "--tp and --ep must be >= 1"),
    "ep degree -3": (["--ep", "-3"], "--tp and --ep must be >= 1"),
    "threads 0": (["--threads", "0"], "threads must be >= 1"),
    "threshold decay above 1": (["--threshold-decay", "3"], "threshold_decay must be in"),
    "cont weight growth negative": (["--cont-weight-growth", "-0.5"], "cont_weight_init and cont_weight_growth"),
    "trace into /proc": (["--trace", "/proc/nonexistent/t.json"], "cannot write the trace"),
    "trace into a folder": (["--trace", "/tmp"], "cannot write the trace"),
    "empty prompt": (["--prompt", "   "], "empty prompt"),
    # counts past the canvas change nothing: refused by the declared bounds (engine/config.py)
    "max unroll a billion": (["--unroll", "--max-unroll", "1000000000"], "max_unroll must be at most"),
    "warmup a billion": (["--cache", "vicinity", "--warmup", "1000000000"], "warmup must be at most"),
    "prefix look a billion": (["--cache", "vicinity", "--prefix-look", "1000000000"], "prefix_look must be at most"),
    "steps a million": (["--decoder", "fixed", "--steps", "1000000"], "steps must be at most"),
    "post-edit steps a billion": (["--decoder", "edit", "--max-post-edit-steps", "1000000000"], "max_post_edit_steps must be in [0, 256]"),
    "edit threshold -5": (["--decoder", "edit", "--edit-threshold", "-5"], "edit_threshold must be in [0, 1]"),
    "entropy bound -1": (["--decoder", "entropy_bound", "--entropy-bound", "-1"], "entropy_bound must be >= 0"),
    "threads a hundred thousand": (["--threads", "100000"], "this machine's CPUs"),
    "tp degree a million": (["--tp", "1000000"], "tp_size must be a whole number in 1..64"),
    "prompt bytes not UTF-8": (["--prompt", b"Q: \xff\xfe".decode("utf-8", "surrogateescape")], "a lone surrogate"),
    "model path of 5000 characters": (["--model", "m" * 5000], "model folder not found"),
    "trace to a device": (["--trace", "/dev/full"], "not a writable regular file"),
    "trace path of 5000 characters": (["--trace", "t" * 5000], "cannot write the trace"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_answers_bad_settings_in_one_line(case, folder, capsys):
    argv, expected = CLI_CASES[case]
    base = ["generate", "--model", str(folder), "--prompt", "Q: 1+2=? A:"]
    message = _one_line_error(capsys, base + argv)
    assert expected in message, message


def test_cli_refuses_a_fifo_trace_and_says_a_full_disk_in_one_line(folder, tmp_path, capsys):
    """A FIFO would block the write forever; a write that fails (ENOSPC: /dev/full) is one line."""
    import os

    from engine.__main__ import write_trace

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    message = _one_line_error(capsys, ["generate", "--model", str(folder), "--prompt", "Q: 1+2=? A:", "--trace", str(fifo)])
    assert "not a writable regular file" in message
    with pytest.raises(EngineError, match="No space left on device"):
        write_trace(Path("/dev/full"), "{}")


def test_cli_says_a_missing_hub_model_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub's answer, without a network
    message = _one_line_error(capsys, ["generate", "--model", "nobody-here/no-such-model", "--prompt", "x"])
    assert "hub download of 'nobody-here/no-such-model' failed" in message


@pytest.mark.parametrize("case", ["truncated safetensors", "garbage safetensors", "a pickle named model.safetensors", "config.json is an array", "config.json is not JSON", "n_heads is a word", "n_heads is 0", "d_model is negative", "unknown model type"])
def test_cli_answers_a_broken_checkpoint_in_one_line(case, folder, tmp_path, capsys):
    broken = checkpoint_cases(folder, tmp_path)[case]
    message = _one_line_error(capsys, ["generate", "--model", str(broken), "--prompt", "x"])
    assert str(broken) in message or "config.json" in message or "unsupported model" in message, message


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "m", "--prompt", "x", "--gen-length", "many"],
        ["generate", "--prompt", "x", "--device", "quantum"],
        ["generate", "--prompt", "x", "--decoder", "psychic"],
        ["generate", "--prompt", "x", "--cache", "fridge"],
        ["fly"],
    ],
)
def test_cli_argument_errors_are_one_line(argv, capsys):
    _one_line_error(capsys, ["--argparse", *argv])


def test_cli_warns_about_characters_the_tokenizer_lacks(folder, capsys):
    assert cli_main(["generate", "--model", str(folder), "--prompt", "Q: 1+2=? Ä€:", "--gen-length", "8", "--block-length", "8"]) == 0
    err = capsys.readouterr().err
    assert "warning: the tokenizer has no token for 'Ä€'" in err


# ---- the Python API ----------------------------------------------------------------------------
BAD_CONFIGS = {
    "gen_length a string": {"gen_length": "64"},
    "seed 2**64": {"seed": 2**64},
    "threshold nan": {"threshold": float("nan")},
    "factor inf": {"factor": float("inf")},
    "credit_alpha inf": {"credit_alpha": float("inf")},
    "smoothing a string": {"smoothing": "yes"},
    "block_length 0": {"block_length": 0},
    "steps 0": {"steps": 0},
    "cont_weight_init 2": {"cont_weight_init": 2.0},
    "refresh_every 0": {"refresh_every": 0},
    "refresh_every a billion": {"refresh_every": 10**9},
    "warmup a billion": {"warmup": 10**9},
    "expected_tpf past the canvas": {"expected_tpf": 65},
    "max_unroll a billion": {"max_unroll": 10**9},
    "steps past the canvas": {"steps": 128},
    "prefix_look negative": {"prefix_look": -1},
}


def test_a_count_bound_by_the_generation_length_keeps_its_default_on_a_tiny_canvas():
    """`most="gen_length"`: at most gen_length, or the default where that is larger (warmup 4 on a
    canvas of 2 is the default, always valid; 5 changes nothing and is refused)."""
    GenerationConfig(gen_length=2, block_length=2).validate()
    with pytest.raises(EngineError, match=r"warmup must be at most 4 \(gen_length 2\)"):
        GenerationConfig(gen_length=2, block_length=2, warmup=5).validate()
    GenerationConfig(gen_length=64, steps=64, max_unroll=64, warmup=64, refresh_every=64, expected_tpf=64).validate()


def test_a_window_past_the_canvas_is_refused_before_any_forward(engine):
    with pytest.raises(EngineError, match=re.escape("after_look must be at most 27 (the canvas, prompt + gen_length)")):
        engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=16, block_length=8, cache="vicinity", after_look=10**6))


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_generation_config_names_the_bad_field(case):
    changes = BAD_CONFIGS[case]
    with pytest.raises(EngineError) as info:
        GenerationConfig(**changes).validate()
    assert next(iter(changes)).split("_")[0] in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("case", ["truncated safetensors", "garbage safetensors", "a pickle named model.safetensors", "config.json is an array", "n_heads is a word", "n_heads is 0"])
def test_loading_a_broken_checkpoint_is_an_engine_error(case, folder, tmp_path):
    with pytest.raises(EngineError):
        Engine(checkpoint_cases(folder, tmp_path)[case])


def _weights_with(folder: Path, change) -> bytes:
    from safetensors.torch import load_file, save

    tensors = load_file(folder / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = change(tensors[name])
    return save(tensors)


def garbage_cases(folder: Path, base: Path) -> dict[str, tuple[Path, str]]:
    """Checkpoints that load and then decode nothing, each with what its refusal names."""
    config = json.loads((folder / "config.json").read_text())

    def nan_first(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[0] = float("nan")
        return t

    return {
        "a NaN weight": (broken_folder(base, "nan", folder, _weights_with(folder, nan_first)), "not finite in float32"),
        "int32 weights": (broken_folder(base, "int32", folder, _weights_with(folder, lambda t: t.to(torch.int32))), "is int32, not floating point"),
        "NaN in config.json": (broken_folder(base, "nan-config", folder, config=json.dumps(config).replace(f'"rope_theta": {json.dumps(config["rope_theta"])}', '"rope_theta": NaN')), "holds NaN"),
        "mask id outside the vocabulary": (broken_folder(base, "mask-id", folder, config={**config, "mask_token_id": 10**6}), "mask_token_id 1000000 is outside the vocabulary"),
        "eos id negative": (broken_folder(base, "eos-id", folder, config={**config, "eos_token_id": -3}), "eos_token_id -3 is outside the vocabulary"),
    }


@pytest.mark.parametrize("case", ["a NaN weight", "int32 weights", "NaN in config.json", "mask id outside the vocabulary", "eos id negative"])
def test_silent_garbage_is_refused_at_load_in_one_line(case, folder, tmp_path, capsys):
    path, expected = garbage_cases(folder, tmp_path)[case]
    with pytest.raises(EngineError, match=re.escape(expected)):
        Engine(path)
    assert expected in _one_line_error(capsys, ["generate", "--model", str(path), "--prompt", "x"])


def test_a_canvas_beyond_the_model_is_refused_before_any_forward(engine):
    forwards = []
    handle = engine.model.layer_modules()[0].register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(EngineError, match="exceeds the model's max_sequence_length"):
            engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=1_000_000, block_length=1_000_000))
        with pytest.raises(EngineError, match="exceeds the model's max_sequence_length"):
            engine.generate("x" * 100_000, GenerationConfig(gen_length=32, block_length=32))
        bounded = Engine(engine.path, max_tokens=40)
        with pytest.raises(EngineError, match="--max-tokens"):
            bounded.generate("Q: 1+2=? A:", GenerationConfig(gen_length=32, block_length=32))
    finally:
        handle.remove()
    assert forwards == []
    assert engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=8, block_length=8)).output.stats.nfe >= 1  # still usable


def test_a_stop_inside_a_forward_ends_it_at_the_next_layer(engine):
    """The cancel arrives while layer 0 of the first forward runs: no later layer runs, and the
    engine is usable at once (the hooks are gone)."""
    cancel = threading.Event()
    layers = engine.model.layer_modules()
    ran: list[int] = []
    def after(index: int):
        def hook(module, args, output) -> None:
            ran.append(index)
            if index == 0:
                cancel.set()

        return hook

    handles = [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]
    try:
        with pytest.raises(GenerationCancelled):
            engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=32, block_length=32), hooks=RunHooks(cancel=cancel))
    finally:
        for h in handles:
            h.remove()
    assert ran == [0]
    assert all(not layer._forward_pre_hooks for layer in layers)
    assert engine.generate("Q: 1+2=? A:", GenerationConfig(gen_length=8, block_length=8)).output.stats.nfe >= 1


BAD_TRACES = {
    "null": "null",
    "an array": "[1, 2]",
    "a string": '"abc"',
    "not JSON": "{",
    "wrong version": json.dumps({"version": 99}),
    "initial is a string": None,
    "top1 too short": None,
    "commit outside its block": None,
    "unknown field": None,
    "tokens not strings": None,
    "stats hold a string": None,
}


def _bad_trace(case: str) -> str:
    if BAD_TRACES[case] is not None:
        return BAD_TRACES[case]
    data = handmade_trace().to_dict()
    if case == "initial is a string":
        data["initial"] = "abc"
    elif case == "top1 too short":
        data["iterations"][0]["top1"] = [[1]]
    elif case == "commit outside its block":
        data["iterations"][0]["committed"] = [[99]]
    elif case == "unknown field":
        data["script"] = "alert(1)"
    elif case == "tokens not strings":
        data["tokens"] = {"0": 5}
    elif case == "stats hold a string":
        data["stats"] = {**data["stats"], "nfe": "many"}
    return json.dumps(data)


@pytest.mark.parametrize("case", list(BAD_TRACES))
def test_a_bad_trace_is_one_engine_error(case):
    with pytest.raises(EngineError) as info:
        Trace.from_json(_bad_trace(case))
    assert str(info.value).startswith("trace:") and "\n" not in str(info.value)


# ---- the app's handlers ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def handlers(folder):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    host = EngineHost(ModelSpec(str(folder)))
    host.preload()
    return Handlers(host, fps=1000, plot_hz=1000, max_prompt_chars=200, max_gen_length=64)


def _last(stream) -> tuple:
    out = None
    for out in stream:
        pass
    return out


def _message(handlers, view: tuple) -> str:
    from dinfer_viz.tabs.run import RUN_VIEW

    return str(view[RUN_VIEW.index("message")])


APP_RUN_CASES = {
    "gen length a million": ({"config": {"gen_length": 1_000_000}}, "above this server's limit"),
    "gen length inf": ({"config": {"gen_length": "inf"}}, "gen_length: expected a finite int"),
    "threshold a word": ({"config": {"threshold": "high"}}, "threshold: expected a finite float"),
    "device cuda without cuda": ({"model": {"device": "cuda:7"}}, "device"),
    "device nonsense": ({"model": {"device": "toaster"}}, "device"),
    "unknown model key": ({"model": {"turbo": True}}, "unknown model setting 'turbo'"),
    "unavailable option": ({"model": {"cuda_graphs": True}}, "CUDA graphs is unavailable"),
    "settings not an object": ([1, 2], "settings must be a JSON object"),
    "config not an object": ({"config": "fast"}, "'config' must be an object"),
    "unknown config key": ({"config": {"warp": 9}}, "unknown generation setting"),
    "unknown dtype": ({"model": {"dtype": "float8"}}, "unknown dtype"),
    "seed beyond 64 bits": ({"config": {"seed": 2**70}}, "seed must be in"),
    "tp_size -1": ({"model": {"tp_size": -1}}, "tp_size must be a whole number in 1..64"),
    "warmup a billion": ({"config": {"cache": "vicinity", "warmup": 10**9}}, "warmup must be at most"),
}


@pytest.mark.parametrize("case", list(APP_RUN_CASES))
def test_app_run_answers_bad_settings_in_the_page(case, handlers):
    settings, expected = APP_RUN_CASES[case]
    message = _message(handlers, _last(handlers.run("Q: 1+2=? A:", settings)))
    assert expected in message and "\n" not in message and "internal error" not in message, message


def test_app_answers_a_prompt_with_a_lone_surrogate_in_the_page(handlers):
    message = _message(handlers, _last(handlers.run("Q: \ud800? A:", {"config": {"gen_length": 8, "block_length": 8}})))
    assert "a lone surrogate" in message and "internal error" not in message, message


def test_app_refuses_an_oversized_prompt_and_stays_usable(handlers):
    message = _message(handlers, _last(handlers.run("x" * 100_000, {})))
    assert "this server takes at most 200" in message
    done = _message(handlers, _last(handlers.run("Q: 1+2=? A:", {"config": {"gen_length": 16, "block_length": 16}})))
    assert done.startswith("done")


@pytest.mark.parametrize("case", list(BAD_TRACES))
def test_app_load_trace_answers_in_the_page(case, handlers, tmp_path):
    file = tmp_path / "t.json"
    file.write_text(_bad_trace(case))
    message = _message(handlers, handlers.load_trace(str(file)))
    assert "cannot load this trace: trace:" in message, message


def test_app_load_model_failures_keep_the_loaded_engines(handlers, folder, tmp_path):
    before = dict(handlers.host._engines)
    for broken in list(checkpoint_cases(folder, tmp_path).values())[:4]:
        *_, message = handlers.load_model(str(broken), "cpu", "auto", *[None] * len(handlers.option_names))
        assert message.startswith("**⚠") and "\n" not in message, message
    *_, message = handlers.load_model(str(folder), "cuda:7", "auto", *[None] * len(handlers.option_names))
    assert "device" in message
    assert dict(handlers.host._engines) == before


def test_replay_of_nonsense_is_a_message(handlers):
    message = _message(handlers, handlers.replay("abc", None))
    assert "nothing to replay" in message


def test_an_unexpected_exception_in_a_handler_is_one_line_in_the_page(handlers, monkeypatch):
    import dinfer_viz.tabs.run_view as module  # the run's final view reads the readout there

    monkeypatch.setattr(module, "readout", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    message = _message(handlers, _last(handlers.run("Q: 1+2=? A:", {"config": {"gen_length": 8, "block_length": 8}})))
    assert message == "**⚠ internal error: RuntimeError: boom**"
    monkeypatch.undo()
    assert _message(handlers, _last(handlers.run("Q: 1+2=? A:", {"config": {"gen_length": 8, "block_length": 8}}))).startswith("done")


def test_a_live_run_keeps_yielding_during_a_long_forward_and_closing_it_frees_the_engine(handlers):
    """A forward blocked inside layer 0 produces no iteration events; the live stream must still
    yield (so Gradio can close it), and closing it must free the engine lock."""
    from dinfer_viz.live.runner import run_live

    host = handlers.host
    engine = host.get(host.default)
    inside, release = threading.Event(), threading.Event()

    def hold(module, args):
        inside.set()
        release.wait(timeout=60)

    handle = engine.model.layer_modules()[0].register_forward_pre_hook(hold)
    try:
        stream = run_live(host, host.default, "Q: 1+2=? A:", GenerationConfig(gen_length=16, block_length=16), fps=1000, plot_hz=1000)
        busy = next(f for f in stream if f.stage == "busy")  # a heartbeat while the forward is held
        assert inside.is_set() and "forward is running" in busy.message
        stream.close()  # what Gradio does on Stop: the worker's cancel is set
    finally:
        handle.remove()
        release.set()
    assert host.lock.acquire(timeout=60), "the engine stayed locked after the stream was closed"
    host.lock.release()


def test_download_files_are_pruned(tmp_path):
    import os

    from dinfer_viz.tabs.common import KEEP_FILES_SECONDS, prune

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text("x")
    new.write_text("y")
    os.utime(old, (1, 1))
    prune(tmp_path, now=1 + KEEP_FILES_SECONDS + 1)
    assert not old.exists() and new.exists()


def test_resume_files_load_without_pickle(tmp_path):
    from tinymodel.train import RESUME_FILE, TrainConfig, train

    cfg = TrainConfig(out=str(tmp_path / "m"), run_dir=str(tmp_path / "r"), d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=32,
                      batch_size=4, tokens_per_batch=0, steps=1, max_minutes=0.0, eval_every=1, eval_per_task=1, threads=1)
    train(cfg, log=lambda _: None)
    torch.load(tmp_path / "r" / RESUME_FILE, weights_only=True)  # raises if anything needs pickle


# ---- public mode -------------------------------------------------------------------------------
def test_public_mode_loads_only_allow_listed_models_and_shows_no_paths(folder, tmp_path):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers, build_demo

    host = EngineHost(ModelSpec(str(folder)), allowed={"tiny": str(folder)})
    handlers = Handlers(host, fps=1000, plot_hz=1000)
    for path in ("/etc", str(tmp_path), "GSAI-ML/LLaDA-8B-Instruct"):
        message = _message(handlers, _last(handlers.run("Q: 1+2=? A:", {"model": {"path": path}})))
        assert "this server loads only these models: tiny" in message
        assert "loads only" in list(handlers.load_model(path, "cpu", "auto", *[None] * len(handlers.option_names)))[-1]
    done = _message(handlers, _last(handlers.run("Q: 1+2=? A:", {"model": {"path": "tiny"}, "config": {"gen_length": 8, "block_length": 8}})))
    assert done.startswith("done")
    assert list(host._engines) == [host.default]  # "tiny" is the default engine, not a second copy
    assert str(folder) not in handlers.model_status()
    assert str(folder) not in json.dumps(build_demo(handlers).config, default=str)  # what /config serves


def test_app_command_line_public_helpers():
    import app

    assert app.is_loopback("127.0.0.1") and app.is_loopback("localhost") and not app.is_loopback("0.0.0.0")
    assert app.allow_list("/x/assets/tiny-llada", ["big=/models/llada-8b"]) == {"tiny-llada": "/x/assets/tiny-llada", "big": "/models/llada-8b"}
    with pytest.raises(ValueError):
        app.allow_list("/x/m", ["nameonly"])
    assert app.parse_auth("ann:secret") == ("ann", "secret") and app.parse_auth(None) is None
    with pytest.raises(ValueError):
        app.parse_auth("ann")


def test_a_loaded_trace_whose_every_string_carries_markup_shows_it_as_text(tmp_path):
    """#43 item 2: a trace file's config held `<img src=...>` (chromium fetched it) and links (live
    in the page). Every string field the trace holds here (the model, every config value, every
    token string) carries a tag, a Markdown link, an image and an autolink to a beacon; no
    output of loading it, or of scrubbing it with a position's details pinned, holds a live one."""
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.run_view import RUN_VIEW
    from dinfer_viz.ui import Handlers

    from .markup_support import BEACON, live_markup, marked_trace, strings

    path = tmp_path / "markup.json"
    path.write_text(json.dumps(marked_trace()))  # every string field of the schema
    h = Handlers(EngineHost(ModelSpec("/nonexistent")), no_model=True)
    loaded = h.load_trace(str(path))
    assert any(BEACON[7:] in t for t in strings(loaded))  # the strings are shown, as text
    live = live_markup(h.loaded_slots, loaded)
    state = next(v for v in loaded if type(v).__name__ == "RunState")
    for step in range(state.timeline.iterations + 1):
        live += live_markup(RUN_VIEW, h.replay(step, state, 5))  # every iteration, position 5's details pinned
    assert not live, sorted(set(live))
