"""The sample traces shipped for `app.py --no-model` (assets/traces, dinfer_viz/sample_traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dinfer_viz.sample_traces import EMBEDDED_MODEL, INDEX, PROMPT, THREADS, TRACES, generate_sample, sample_settings, shipped_samples
from dinfer_viz.timeline import Timeline
from engine import Engine, Trace
from engine.cli import set_cpu_threads
from engine.cache_modes import cache_mode_names
from engine.registry import builtin_decoder_names

SAMPLES = sample_settings()


def test_one_sample_per_decoder_and_per_cache_mode_all_listed_and_small():
    assert {s["decoder"] for s in SAMPLES.values()} == set(builtin_decoder_names())
    assert {s["cache"] for s in SAMPLES.values()} == set(cache_mode_names())
    index = json.loads((TRACES / INDEX).read_text(encoding="utf-8"))
    assert [e["file"] for e in index["traces"]] == [f"{stem}.json" for stem in SAMPLES]
    assert all(e["settings"] == SAMPLES[e["file"][:-5]] and e["prompt"] == PROMPT for e in index["traces"])
    sizes = [p.stat().st_size for p in TRACES.iterdir()]
    assert sum(sizes) < 2 * 2**20  # shipped in the repository and in a Space


@pytest.mark.parametrize("stem", list(SAMPLES))
def test_shipped_trace_loads_and_its_header_matches_its_name(stem):
    trace = Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8"))  # the app's loader checks it fully
    decoder, cache = stem.split("-")
    assert (trace.config["decoder"], trace.config["cache"]) == (decoder, cache)
    assert all(trace.config[k] == v for k, v in SAMPLES[stem].items())
    assert trace.model == EMBEDDED_MODEL.name and trace.iterations and trace.stats["nfe"] == len(trace.iterations)
    tl = Timeline(trace)
    assert tl.finished and "░" not in tl.text_at(tl.iterations - 1)  # a finished run the views can show


@pytest.fixture(scope="module")
def engine():
    if not (EMBEDDED_MODEL / "model.safetensors").is_file():
        pytest.skip("the embedded model is not present")
    engine = Engine(EMBEDDED_MODEL)
    set_cpu_threads(engine.model, THREADS)
    return engine


@pytest.mark.parametrize("stem", list(SAMPLES))
def test_regenerating_a_sample_gives_the_same_tokens(engine, stem):
    shipped = Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8"))
    again = generate_sample(engine, SAMPLES[stem])
    assert again.final == shipped.final
    assert [(r.block_range, r.forward, r.committed, r.forced) for r in again.iterations] == [(r.block_range, r.forward, r.committed, r.forced) for r in shipped.iterations]


def test_shipped_samples_menu(tmp_path):
    menu = shipped_samples()
    assert [Path(path).name for _, path in menu] == [f"{stem}.json" for stem in SAMPLES]
    assert menu[0][0] == "fixed decoder, cache none: '16 + 22' in 20 iterations"
    assert all(Path(path).is_file() for _, path in menu)
    assert shipped_samples(tmp_path) == []  # no index: no menu, no error
