"""`python -m engine generate`: JSON output on a tiny checkpoint; one-line errors with exit 2."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import save_model
from engine.__main__ import main
from tinymodel.tokenizer import save_tokenizer, special_ids

from .conftest import tiny_llada


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-ckpt")
    save_model(tiny_llada(vocab_size=99, embedding_size=99, **special_ids()), folder)
    save_tokenizer(folder)
    return folder


def test_generate_json_in_a_real_process(checkpoint, tmp_path):
    trace_file = tmp_path / "trace.json"
    cmd = [sys.executable, "-m", "engine", "generate", "--model", str(checkpoint), "--prompt", "Q: 12+34=? A:",
           "--gen-length", "16", "--block-length", "8", "--threshold", "0.5", "--trace", str(trace_file), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {"text", "token_ids", "nfe", "tokens", "seconds", "tps", "tpf"} <= set(out)
    assert out["tokens"] == len(out["token_ids"]) and out["nfe"] >= 2
    assert out["tpf"] == pytest.approx(out["tokens"] / out["nfe"])
    trace = json.loads(trace_file.read_text())
    assert len(trace["iterations"]) == out["nfe"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gen-length", "10", "--block-length", "4"], "gen_length (10) must be a multiple of block_length (4)"),
        (["--threshold", "0"], "threshold must be in (0, 1]"),
        (["--threshold", "1.5"], "threshold must be in (0, 1]"),
        (["--decoder", "greedy"], "invalid choice: 'greedy'"),  # the choices come from the decoder registry
        (["--prompt", "   "], "empty prompt"),
        (["--model", "./no/such/folder"], "model folder not found: ./no/such/folder"),
        (["--steps", "3"], "steps (3) must be a positive multiple of the number of blocks (2)"),
        (["--threads", "0"], "threads must be >= 1"),
    ],
)
def test_bad_arguments_exit_nonzero_with_one_line(checkpoint, capsys, args, message):
    argv = ["generate", "--model", str(checkpoint), "--prompt", "hi", "--gen-length", "64", "--block-length", "32", *args]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (a choice outside the registry) exit
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_unparseable_number_exits_nonzero_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt", "hi", "--gen-length", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gen-length" in err


def test_model_folder_without_tokenizer_is_named(tmp_path, capsys):
    save_model(tiny_llada(), tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--gen-length", "8", "--block-length", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer.json" in err


@pytest.mark.parametrize(
    "device,message",
    [("foo", "'foo' is not a device"), ("cuda:99", "cuda:99"), ("xla", "only cpu, cuda and mps")],
)
def test_bad_device_exits_nonzero_with_one_line(capsys, device, message):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt", "hi", "--device", device])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_checked_device_accepts_the_cpu_and_names_a_missing_gpu():
    import argparse

    from engine.cli import checked_device

    assert checked_device("cpu") == "cpu"
    if not __import__("torch").cuda.is_available():
        with pytest.raises(argparse.ArgumentTypeError, match="no CUDA device"):
            checked_device("cuda")


def test_help_lists_every_decoder_and_cache_mode_with_defaults_and_who_reads_a_setting(capsys):
    from engine import decoder_names
    from engine.cache_modes import cache_mode_names

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--decoder {" + ",".join(decoder_names()) + "}" in text and "(default: threshold)" in text
    assert "--cache {" + ",".join(cache_mode_names()) + "}" in text and "(default: none)" in text
    readers = re.search(r"--steps INT .*?\[read by: ([^\]]*)\] \(default: None\)", text)  # from the decoders' declarations
    assert readers and "fixed" in readers.group(1).split(", ")
    assert "[read by: cache vicinity]" in text  # --prefix-look


def test_a_plug_in_decoder_and_its_declared_settings_reach_the_cli_and_the_app(own_registry, monkeypatch, capsys):
    """The decoder declares what it reads; the CLI's help and the app's visible controls follow."""
    from dinfer_viz.settings import sweep_setting, visible_fields
    from engine import registry

    plugin = Path(__file__).resolve().parent.parent / "examples" / "entropy_decoder.py"
    monkeypatch.setenv("DINFER_VIZ_DECODERS", str(plugin))
    registry.load_plugins()
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "entropy" in capsys.readouterr().out
    shown = visible_fields("entropy", "none", smoothing=False, unroll=False)
    assert "threshold" in shown and "steps" not in shown and "decoder_options.credit_alpha" not in shown
    assert sweep_setting("fixed") == "steps" and sweep_setting("factor") == "decoder_options.factor" and sweep_setting("entropy") == "threshold"


def test_a_plug_in_decoders_own_setting_reaches_the_cli_the_app_and_the_rule(own_registry, monkeypatch, capsys, checkpoint):
    """examples/entropy_decoder.py declares `max_per_step` (engine/registry.py: DecoderOption): the CLI
    has a flag for it, the app a control shown only for that decoder, both put it in
    config.decoder_options, the decoder's rule reads it, and a wrong value is one EngineError."""
    from dinfer_viz.settings import all_controls, build_config, visible_fields
    from engine import EngineError, GenerationConfig

    monkeypatch.setenv("DINFER_VIZ_DECODERS", str(Path(__file__).resolve().parent.parent / "examples" / "entropy_decoder.py"))
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--max-per-step" in capsys.readouterr().out
    assert "decoder_options.max_per_step" in {c.field for c in all_controls()}
    assert "decoder_options.max_per_step" in visible_fields("entropy", "none", smoothing=False, unroll=False)
    assert "decoder_options.max_per_step" not in visible_fields("threshold", "none", smoothing=False, unroll=False)
    # the page sends every control: the option is kept for its decoder only
    assert build_config({"decoder": "entropy", "decoder_options.max_per_step": "1"}).decoder_options == {"max_per_step": 1}
    assert build_config({"decoder": "threshold", "decoder_options.max_per_step": 1}).decoder_options == {}
    with pytest.raises(EngineError, match="decoder 'threshold' has no setting 'max_per_step'"):
        GenerationConfig(decoder_options={"max_per_step": 1}).validate()
    with pytest.raises(EngineError, match="max_per_step must be an integer"):
        GenerationConfig(decoder="entropy", decoder_options={"max_per_step": 1.5}).validate()

    # the rule reads it: with a cap of 1 every forward commits one token (threshold 0.01 would
    # otherwise let the entropy budget take several at once)
    def run(*extra: str) -> dict:
        assert main(["generate", "--model", str(checkpoint), "--prompt", "Q: 12+34=? A:", "--decoder", "entropy",
                     "--threshold", "0.01", "--gen-length", "16", "--block-length", "16", "--no-early-stop", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    assert run()["nfe"] < 16
    assert run("--max-per-step", "1")["nfe"] == 16


def test_cpu_threads_follow_the_model_size_unless_asked(checkpoint, tmp_path):
    """The rule (engine/cli.py, measured by benchmarks/threads.py): one thread below 50M parameters,
    torch's own count above; --threads wins. The app applies it per run (EngineHost.get)."""
    import torch

    from dinfer_viz.live.host import EngineHost, ModelSpec
    from engine.cli import SMALL_MODEL_PARAMETERS, TORCH_DEFAULT_THREADS, cpu_threads_for

    assert cpu_threads_for(SMALL_MODEL_PARAMETERS - 1) == 1
    assert cpu_threads_for(SMALL_MODEL_PARAMETERS) == TORCH_DEFAULT_THREADS
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        EngineHost(ModelSpec(str(checkpoint))).get(ModelSpec(str(checkpoint)))
        assert torch.get_num_threads() == 1  # a tiny model
        EngineHost(ModelSpec(str(checkpoint)), threads=2).get(ModelSpec(str(checkpoint)))
        assert torch.get_num_threads() == 2  # --threads
    finally:
        torch.set_num_threads(before)
