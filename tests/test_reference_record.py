"""Recording the reference implementations' own runs (engine/reference.py): transformers'
DiffusionGemma `generate` and diffusers' `LLaDA2Pipeline`, each on a tiny checkpoint (the parity tests' own),
give traces whose final tokens equal the library's own output and, where the parity tests say
they should, the engine's; the diff says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import GenerationConfig, RunHooks, load_model, run_diffusion, save_model
from engine.errors import EngineError
from engine.reference import NOT_EXPOSED, check_settings, record_diffusers, record_transformers
from engine.trace import Trace
from engine.trace_diff import diff_traces

from .gemma_models import CANVAS, STOP
from .moe_models import tiny_llada2
from .test_diffusers_parity import diffusers_tokens
from .test_trace_schema import validate
from .test_diffusion_gemma import checkpoint, hf_generate, reference, uniform_config  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [12, 30, 45, 9, 17]
SETTINGS = dict(max_denoising_steps=12, confidence_threshold=2.5)


@pytest.fixture(scope="module")
def llada2() -> torch.nn.Module:
    return tiny_llada2(seed=3)


@pytest.mark.parametrize("seed", [0, 1])
def test_transformers_run_equals_its_generate_and_the_engine_step_by_step(checkpoint, reference, seed):
    config = uniform_config(seed, **SETTINGS)
    recorded = record_transformers(reference, PROMPT, config, stop_ids=[STOP], pad_id=0)
    theirs = hf_generate(reference, [PROMPT], seed, 3 * CANVAS, **SETTINGS).sequences[0].tolist()
    assert recorded.final[0][: len(theirs)] == theirs and set(recorded.final[0][len(theirs):]) <= {0}
    assert len(recorded.iterations) > 3 and recorded.kind == "uniform"
    assert recorded.canvas_at(len(recorded.iterations) - 1) == recorded.final
    ours = run_diffusion(load_model(checkpoint), [PROMPT], config, stop_ids=[STOP], hooks=RunHooks(trace=True)).trace
    diff = diff_traces(ours, recorded)
    assert diff.first is None and diff.final_equal and diff.steps_equal
    for a, b in zip(ours.iterations, recorded.iterations):  # the derived acceptance is the engine's
        assert a.committed == b.committed and a.top1 == b.top1 and a.state["renoised"] == b.state["renoised"]
        if b.state["output"] is None:  # a canvas's last re-noise is never read, so never seen
            assert a.state["noise"] == b.state["noise"] and a.state["proposal"] == [[t if t != NOT_EXPOSED else a.state["proposal"][0][w] for w, t in enumerate(b.state["proposal"][0])]]
    note = recorded.config["reference"]
    assert note["library"] == "transformers" and note["absent"] and note["derived"]
    last = [rec for rec in recorded.iterations if rec.state["output"] is not None]
    assert any(NOT_EXPOSED in rec.state["proposal"][0] for rec in last)  # the unseen re-noise is marked, not invented
    assert Trace.from_json(recorded.to_json()).final == recorded.final
    validate(json.loads(recorded.to_json()))


@pytest.mark.parametrize("decoder, options, editing", [("edit", {"edit_threshold": 0.5}, 0.5), ("threshold", {}, None)])
@pytest.mark.parametrize("prompt", [[5, 6, 7, 9], [11, 3, 8, 2, 30, 14, 21, 6]], ids=["one prompt block", "two prompt blocks"])
def test_diffusers_run_equals_its_pipeline_and_the_engine(llada2, decoder, options, editing, prompt):
    config = GenerationConfig(decoder=decoder, threshold=0.7, gen_length=16, block_length=4, early_stop=False, decoder_options=options)
    recorded = record_diffusers(llada2, prompt, config)
    assert recorded.final[0][len(prompt):] == diffusers_tokens(llada2, prompt, 0.7, editing)
    assert recorded.canvas_at(len(recorded.iterations) - 1) == recorded.final
    ours = run_diffusion(llada2, [prompt], config, hooks=RunHooks(trace=True)).trace
    diff = diff_traces(ours, recorded)
    assert diff.final_equal and diff.first is None
    # editing on, both end a block with a step that changes nothing: step for step the same run;
    # editing off, diffusers still runs one forward after a block's last mask, the engine does not
    assert diff.steps_equal == (editing is not None)
    assert all(rec.candidates is not None for rec in recorded.iterations)
    validate(json.loads(recorded.to_json()))
    if editing:
        assert recorded.iterations[0].revisions is not None


def test_refusals_are_one_line(reference, llada2):
    cases = [
        (lambda: record_transformers(llada2, PROMPT, uniform_config()), "runs DiffusionGemmaForBlockDiffusion"),
        (lambda: record_diffusers(reference, [5, 6, 7, 9], GenerationConfig(block_length=4, gen_length=8)), "LLaDA2"),
        (lambda: check_settings("transformers", GenerationConfig(decoder="threshold")), "runs uniform"),
        (lambda: check_settings("diffusers", GenerationConfig(cache="prefix")), "--cache"),
        (lambda: check_settings("diffusers", GenerationConfig(smoothing=True)), "--smoothing"),
        (lambda: record_transformers(reference, PROMPT, uniform_config().replace(block_length=2 * CANVAS, gen_length=2 * CANVAS)), f"--block-length {CANVAS}"),
        (lambda: record_diffusers(llada2, [5, 6, 7], GenerationConfig(block_length=4, gen_length=8)), "whole blocks"),
        (lambda: check_settings("vllm", GenerationConfig()), "unknown reference"),
    ]
    for call, words in cases:
        with pytest.raises(EngineError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


def test_record_command_on_the_embedded_gemma_equals_transformers_generate(tmp_path):
    """The issue's "done when": the trace loads, and its final tokens are the library's own generate."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from engine.pipeline import load_tokenizer

    folder = ROOT / "assets" / "tiny-gemma"
    out = tmp_path / "ref.json"
    done = subprocess.run([sys.executable, "-m", "engine", "record", "--reference", "transformers", "--model", str(folder), "--prompt", "Q: 12+7=? A:", "--decoder", "uniform",
                           "--block-length", "16", "--gen-length", "32", "--no-use-chat-template", "--trace", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    trace = Trace.from_json(out.read_text())
    tokenizer = load_tokenizer(folder)
    ids = tokenizer("Q: 12+7=? A:", add_special_tokens=False)["input_ids"]
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, attn_implementation="eager").eval()
    torch.manual_seed(0)
    theirs = model.generate(torch.tensor([ids]), max_new_tokens=32, eos_token_id=trace.eos_ids, pad_token_id=trace.mask_id).sequences[0].tolist()
    assert trace.final[0][: len(theirs)] == theirs and trace.tokens


def test_record_command_refuses_in_one_line(tmp_path, capsys):
    """Through the command's main() in this process: the program's own exit path is the test above's."""
    from engine.__main__ import main

    for args, words in [
        (["--reference", "transformers", "--model", str(ROOT / "assets" / "tiny-llada"), "--decoder", "uniform"], "DiffusionGemma"),
        (["--reference", "diffusers", "--model", str(ROOT / "assets" / "tiny-llada"), "--smoothing"], "--smoothing"),
        (["--reference", "transformers", "--model", str(ROOT / "assets" / "tiny-gemma"), "--decoder", "wino"], "runs masked diffusion"),  # fitted as generate fits it
    ]:
        assert main(["record", *args, "--prompt", "Hi", "--trace", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err


def test_record_fits_a_uniform_state_setting_to_the_models_kind_as_generate_does(tmp_path, capsys):
    """#54: `record --reference transformers --entropy-bound 0.1` on the embedded DiffusionGemma
    checkpoint (no `--decoder uniform`): the request is fitted to the model's kind first, so the
    sampler's setting is taken, and the trace records it."""
    from engine.__main__ import main

    trace = tmp_path / "reference.json"
    assert main(["record", "--reference", "transformers", "--model", "tiny-gemma", "--entropy-bound", "0.1", "--prompt", "Q: 14+5=? A:", "--trace", str(trace)]) == 0
    recorded = Trace.from_json(trace.read_text())
    assert recorded.kind == "uniform" and recorded.config["decoder"] == "uniform" and recorded.config["decoder_options"]["entropy_bound"] == 0.1
