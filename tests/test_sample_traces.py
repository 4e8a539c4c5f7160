"""The sample traces shipped for `app.py --no-model` (assets/traces, dinfer_viz/sample_traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dinfer_viz.sample_traces import EMBEDDED_MODEL, INDEX, SAMPLE_RUNS, TRACES, generate_sample, sample_engine, sample_run, sample_settings, shipped_samples
from dinfer_viz.ui import Handlers
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.reading.timeline import Timeline
from engine import Engine, Trace
from engine.cache_modes import cache_mode_names
from engine.registry import builtin_decoder_names

SAMPLES = sample_settings()


def test_one_sample_per_decoder_and_per_cache_mode_all_listed_and_small():
    assert {s["decoder"] for s in SAMPLES.values()} == set(builtin_decoder_names())
    assert {s["cache"] for s in SAMPLES.values()} == set(cache_mode_names())
    index = json.loads((TRACES / INDEX).read_text(encoding="utf-8"))
    assert [e["file"] for e in index["traces"]] == [f"{stem}.json" for stem in SAMPLES]
    assert all(e["settings"] == SAMPLES[e["file"][:-5]] and (e["model"], e["prompt"]) == _run(e["file"][:-5]) for e in index["traces"])
    sizes = [p.stat().st_size for p in TRACES.iterdir()]
    assert sum(sizes) < 2 * 2**20  # shipped in the repository and in a Space


@pytest.mark.parametrize("stem", list(SAMPLES))
def test_shipped_trace_loads_and_its_header_matches_its_name(stem):
    trace = Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8"))  # the app's loader checks it fully
    decoder, cache = stem.split("-")
    assert (trace.config["decoder"], trace.config["cache"]) == (decoder, cache)
    assert all(trace.config[k] == v for k, v in SAMPLES[stem].items())
    assert trace.model == sample_run(stem)[0].name and trace.iterations and trace.stats["nfe"] == len(trace.iterations)
    tl = Timeline(trace)
    assert tl.finished and "░" not in tl.text_at(tl.iterations - 1)  # a finished run the views can show


def _run(stem: str) -> tuple[str, str]:
    folder, prompt = sample_run(stem)
    return folder.name, prompt


@pytest.fixture(scope="module")
def engines():
    """The engines the samples were made with, by model name, loaded as asked."""
    made: dict[str, Engine] = {}

    def get(folder: Path) -> Engine:
        if not (folder / "model.safetensors").is_file():
            pytest.skip(f"{folder.name} is not present")
        if folder.name not in made:
            made[folder.name] = sample_engine(folder)
        return made[folder.name]

    return get


@pytest.mark.parametrize("stem", list(SAMPLES))
def test_regenerating_a_sample_gives_the_same_tokens(engines, stem):
    shipped = Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8"))
    folder, prompt = sample_run(stem)
    again = generate_sample(engines(folder), SAMPLES[stem], prompt)
    assert again.final == shipped.final
    assert [(r.block_range, r.forward, r.committed, r.forced) for r in again.iterations] == [(r.block_range, r.forward, r.committed, r.forced) for r in shipped.iterations]


def test_the_edit_sample_is_an_edit_that_repairs_the_answer_on_the_edit_model():
    """#34 item 5: on the model trained to edit, the edit decoder takes a committed token back and
    the answer is right (41), where the threshold decoder's is not."""
    trace = Trace.from_json((TRACES / "edit-none.json").read_text(encoding="utf-8"))
    assert trace.model == SAMPLE_RUNS["edit-none"][0] and trace.config["decoder"] == "edit"
    edits = [r for rec in trace.iterations for row in rec.revisions or [] for r in row]
    assert edits, "the edit sample edits nothing"
    numbers = [int(n) for n in Timeline(trace).text_at(len(trace.iterations) - 1).replace("+", " ").split()]
    assert sum(numbers) == 41 and len(numbers) == 2


@pytest.mark.parametrize("stem", list(SAMPLES))
def test_every_sample_loads_with_its_output_and_a_caption_matching_its_run(stem):
    """#34 item 5: the menu's caption says the trace's own decoder, model, cache, answer and
    iteration count, and loading it fills the Output box with that answer."""
    trace = Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8"))
    tl = Timeline(trace)
    answer = tl.text_at(tl.iterations - 1)
    caption = dict((Path(path).name, label) for label, path in shipped_samples())[f"{stem}.json"]
    on = "" if trace.model == EMBEDDED_MODEL.name else f" on {trace.model}"
    iterations = f"{tl.iterations} iteration{'s' if tl.iterations != 1 else ''}"
    assert caption == f"{trace.config['decoder']} decoder{on}, cache {trace.config['cache']}: {answer.strip()!r} in {iterations}"
    handlers = Handlers(EngineHost(ModelSpec(str(EMBEDDED_MODEL))))  # not loaded: a sample needs no model
    shown = dict(zip(handlers.loaded_slots, handlers.load_sample(f"{stem}.json")))
    assert answer.strip() and shown["text"] == answer and f"{tl.iterations} iterations" in shown["message"]


def test_shipped_samples_menu(tmp_path):
    menu = shipped_samples()
    assert [Path(path).name for _, path in menu] == [f"{stem}.json" for stem in SAMPLES]
    assert menu[0][0] == "fixed decoder, cache none: '16 + 22' in 20 iterations"
    assert all(Path(path).is_file() for _, path in menu)
    assert shipped_samples(tmp_path) == []  # no index: no menu, no error
