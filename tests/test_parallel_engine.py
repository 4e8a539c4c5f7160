"""`Engine(..., tp_size=2)` / `ep_size=2`: worker processes on this CPU (gloo) that give the tokens,
the trace and the callbacks of one process; a cancel that stops every rank at the same check; one
EngineError line for a failure; workers that end with close() or with their caller.

Every outcome is decided by events (messages, files, process exits), never by how long anything took.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from engine import Engine, EngineError, GenerationCancelled, GenerationConfig, RunHooks, register_decoder, save_model
from engine import registry
from engine.decoders import ThresholdDecoder
from engine.runtime.workers import RankCancel, StopFlags
from tinymodel.tokenizer import save_tokenizer, special_ids

from .app_support import EMBEDDED_MODEL
from .moe_models import tiny_llada_moe

ROOT = Path(__file__).resolve().parent.parent
TURNSTILE = Path(__file__).with_name("turnstile_decoder.py")
PROMPTS = ["Q: 48+57=? A:", "Q: 3+4=? A:"]
# The decoders and cache modes each layout must reproduce; smoothing feeds embeddings, not ids.
CONFIGS = {
    "threshold, no cache": dict(decoder="threshold", cache="none"),
    "threshold, dual cache": dict(decoder="threshold", cache="dual"),
    "credit, prefix cache": dict(decoder="credit", cache="prefix"),
    "hierarchical, vicinity cache, smoothing": dict(decoder="hierarchical", cache="vicinity", smoothing=True),
}
# parallel layout -> the one-process engine it must match
LAYOUTS = {"dense tp2": "dense", "moe tp2": "moe", "moe ep2": "moe"}


def _config(**extra) -> GenerationConfig:
    return GenerationConfig(**{"gen_length": 32, "block_length": 16, "threshold": 0.7, **extra})


def _workers() -> set[int]:
    """The pids of this process's live children (multiprocessing reaps those that ended)."""
    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory) -> Path:
    """A tiny random LLaDA-MoE (4 heads, 8 experts) with the embedded model's character tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-moe")
    save_model(tiny_llada_moe(vocab_size=99, **special_ids()), folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def engines(moe_folder):
    """One-process engines and the parallel layouts; the workers load the turnstile plug-in
    (the environment at their spawn), this process does not unless a test asks."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(registry.PLUGIN_ENV, str(TURNSTILE))
        built = {
            "dense": Engine(EMBEDDED_MODEL),
            "dense tp2": Engine(EMBEDDED_MODEL, tp_size=2),
            "moe": Engine(moe_folder),
            "moe tp2": Engine(moe_folder, tp_size=2),
            "moe ep2": Engine(moe_folder, ep_size=2),
        }
    yield built
    for engine in built.values():
        engine.close()


@pytest.fixture
def own_registry(monkeypatch):
    """Decoders a test registers in this process vanish after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded_plugins", set(registry._loaded_plugins))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("setting", CONFIGS)
def test_parallel_engines_decide_what_one_process_decides(engines, layout, setting):
    config = _config(**CONFIGS[setting])
    one = engines[LAYOUTS[layout]].generate(PROMPTS, config, hooks=RunHooks(trace=True))
    headers, records = [], []
    par = engines[layout].generate(PROMPTS, config, hooks=RunHooks(trace=True, on_start=headers.append, on_iteration=records.append))
    assert par.texts == one.texts and par.output.token_ids == one.output.token_ids
    assert par.output.stats.nfe == one.output.stats.nfe
    assert [r.committed for r in par.output.trace.iterations] == [r.committed for r in one.output.trace.iterations]
    assert [r.top1 for r in par.output.trace.iterations] == [r.top1 for r in one.output.trace.iterations]
    # the callbacks saw rank 0's trace, and the live header's token strings grew as with one process
    assert records == par.output.trace.iterations and len(headers) == 1
    assert headers[0].tokens == {k: v for k, v in par.output.trace.tokens.items() if k in headers[0].tokens}
    assert set(headers[0].tokens) == set(one.output.trace.tokens)


def test_a_stop_lands_on_the_same_check_for_every_rank():
    """Rank 0 has made 5 checks, rank 1 only 3, when the stop comes: both stop at check 6, so
    neither leaves a forward that the other is still in."""
    flags = StopFlags(mp.get_context("spawn"), 2)
    flags.reset()
    ahead, behind = RankCancel(flags, 0), RankCancel(flags, 1)
    assert not any(ahead.is_set() for _ in range(5)) and not any(behind.is_set() for _ in range(3))
    flags.stop()
    assert ahead.is_set()
    assert [behind.is_set() for _ in range(3)] == [False, False, True]


def test_a_cancel_mid_generation_stops_every_rank_and_the_engine_goes_on(engines, own_registry, tmp_path):
    """The ranks may decode iteration n + 1 only once this process has read record n - 1 (the
    turnstile), so the cancel set on reading record 2 finds them mid-generation, whatever their speed."""
    registry.load_plugins(str(TURNSTILE))  # this process validates the config
    gates = tmp_path
    (gates / "1").touch()
    cancel, seen = threading.Event(), []

    def on_iteration(record):
        seen.append(record.iteration)
        if record.iteration == 2:
            cancel.set()
        (gates / str(record.iteration + 2)).touch()

    config = _config(decoder="turnstile", cache="dual", decoder_options={"gates": str(gates)})  # 32 iterations
    with pytest.raises(GenerationCancelled):
        engines["dense tp2"].generate(PROMPTS[0], config, hooks=RunHooks(on_iteration=on_iteration, cancel=cancel))
    assert seen == list(range(len(seen))) and 3 <= len(seen) <= 5
    again = _config(cache="dual")
    assert engines["dense tp2"].generate(PROMPTS, again).texts == engines["dense"].generate(PROMPTS, again).texts


def test_a_callback_that_raises_stops_the_ranks_and_its_exception_comes_back(engines):
    def fail(record):
        raise ValueError("the viewer broke")

    with pytest.raises(ValueError, match="the viewer broke"):
        engines["dense tp2"].generate(PROMPTS, _config(), hooks=RunHooks(on_iteration=fail))
    assert engines["dense tp2"].generate(PROMPTS[0], _config()).text == engines["dense"].generate(PROMPTS[0], _config()).text


def test_a_bad_request_is_refused_here_and_the_workers_stay(engines):
    before = _workers()
    with pytest.raises(EngineError, match="exceeds the model's max_sequence_length"):
        engines["dense tp2"].generate(PROMPTS[0], _config(gen_length=1024, block_length=32))
    with pytest.raises(EngineError, match="empty prompt"):
        engines["dense tp2"].generate("  ", _config())
    assert _workers() == before


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(ep_size=2), "expert parallelism needs an MoE model; LLaDAModelLM is dense"),
        (dict(tp_size=4), "tp=4 does not divide the 6 attention heads"),
        (dict(tp_size=2, ep_size=3), "each must be 1 or the number of processes"),
        (dict(tp_size=0), "tp and ep must be >= 1"),
        (dict(tp_size="2"), "tp and ep must be whole numbers, got tp='2'"),
    ],
)
def test_degrees_the_model_cannot_take_are_refused_before_any_process_starts(options, message):
    before = _workers()
    with pytest.raises(EngineError, match=message):
        Engine(EMBEDDED_MODEL, **options)
    assert _workers() == before


def test_a_rank_that_cannot_load_is_one_error_line_and_leaves_no_process(tmp_path):
    broken = tmp_path / "truncated"
    broken.mkdir()
    for f in EMBEDDED_MODEL.glob("*.json"):
        (broken / f.name).write_text(f.read_text())
    weights = (EMBEDDED_MODEL / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 3])
    before = _workers()
    with pytest.raises(EngineError) as failure:
        Engine(broken, tp_size=2)
    assert "model.safetensors" in str(failure.value) and "\n" not in str(failure.value)
    assert _workers() == before


def test_a_failing_request_restarts_the_workers_and_close_ends_them(own_registry):
    @register_decoder
    class CallerOnly(ThresholdDecoder):  # registered here, unknown to the workers
        name = "caller-only"

    before = _workers()
    engine = Engine(EMBEDDED_MODEL, tp_size=2)
    first = _workers() - before
    assert len(first) == 2
    with pytest.raises(EngineError, match="unknown decoder 'caller-only'"):
        engine.generate(PROMPTS[0], _config(decoder="caller-only"))
    assert _workers() == before  # a failure ends the whole group
    assert engine.generate(PROMPTS[0], _config()).text  # ... and the next request starts a fresh one
    second = _workers() - before
    assert len(second) == 2 and not second & first
    engine.close()
    assert _workers() == before
    for pid in second:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(EngineError, match="closed"):
        engine.generate(PROMPTS[0], _config())


def test_the_workers_end_when_their_caller_dies():
    script = (
        "import multiprocessing, os, signal, sys\n"
        "from engine import Engine\n"
        "engine = Engine(sys.argv[1], tp_size=2)\n"
        "print(' '.join(str(p.pid) for p in multiprocessing.active_children()), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    caller = subprocess.run([sys.executable, "-c", script, str(EMBEDDED_MODEL)], cwd=ROOT, capture_output=True, text=True)
    pids = [int(p) for p in caller.stdout.split()]
    assert caller.returncode == -9 and len(pids) == 2, caller.stderr[-2000:]
    for pid in pids:  # each pidfd turns readable when its process ends
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], 600)[0], f"worker {pid} outlived its caller"  # a bound on a hang, not a speed
        finally:
            os.close(fd)


def test_the_app_runs_and_sweeps_a_parallel_engine_and_ends_its_workers_when_it_loads_another():
    from dinfer_viz.host import EngineHost, ModelSpec
    from dinfer_viz.sweep import run_sweep
    from dinfer_viz.tabs.run import RUN_VIEW
    from dinfer_viz.ui import Handlers
    from tinymodel.tasks import split_examples

    handlers = Handlers(EngineHost(ModelSpec(str(EMBEDDED_MODEL))), fps=1000, plot_hz=1000)
    config = {"gen_length": 32, "block_length": 16, "cache": "dual"}

    def run(model: dict) -> tuple[str, str]:
        *_, last = handlers.run(PROMPTS[0], {"model": model, "config": config})
        return str(last[RUN_VIEW.index("text")]), str(last[RUN_VIEW.index("message")])

    before = _workers()
    one_text, one_message = run({})
    two_text, two_message = run({"tp_size": 2})
    assert two_message.startswith("done") and two_text == one_text, two_message
    assert len(_workers() - before) == 2
    examples = split_examples(["pairsum"], "held_out", limit=2)
    sweeps = [list(run_sweep(handlers.host, spec, GenerationConfig(**config), "threshold", [0.9], examples))[-1] for spec in (
        ModelSpec(str(EMBEDDED_MODEL)), ModelSpec(str(EMBEDDED_MODEL), options=(("tp_size", 2),)))]
    assert all(s.done and not s.failed for s in sweeps), [s.message for s in sweeps]
    assert [o.text for o in sweeps[1].outcomes] == [o.text for o in sweeps[0].outcomes] and len(sweeps[1].outcomes) == 2
    _, refused = run({"ep_size": 2})  # another model setting: the tp=2 engine makes way first
    assert "expert parallelism needs an MoE model" in refused and "\n" not in refused
    assert _workers() == before
