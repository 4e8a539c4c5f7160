"""`Engine(..., tp_size=2)` / `ep_size=2`, end to end: torch worker processes on this CPU (gloo) that
give the tokens, the trace and the callbacks of one process; a cancel that stops every rank at the
same check; one EngineError line for a failure of the real loader; the app's runs and sweeps.

The processes' life (restart after a failure, a dying or frozen rank, a rank that cannot load, the
caller's death) is engine/runtime/lifecycle.py's, tested with plain Python workers in
tests/test_lifecycle.py; this file is the `workers` lane (tests/conftest.py).

Every outcome is decided by events (messages, files, process exits), never by how long anything took.
"""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from engine import Engine, EngineError, GenerationCancelled, GenerationConfig, RunHooks, save_model
from engine import registry
from tinymodel.tokenizer import save_tokenizer, special_ids

from .app_support import EMBEDDED_MODEL
from .moe_models import tiny_llada_moe

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


def test_a_rank_that_cannot_load_is_one_error_line_and_leaves_no_process(tmp_path):
    """The real loader's EngineError, as is (a request a rank fails takes the same path:
    engine/runtime/lifecycle.py `one_line`; restarts are tests/test_lifecycle.py's)."""
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


def test_the_app_runs_and_sweeps_a_parallel_engine_and_ends_its_workers_when_it_loads_another():
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.studies.sweep_study import run_sweep
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
