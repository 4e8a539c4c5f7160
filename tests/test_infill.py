"""Text pinned after and between holes (docs/algorithms.md §11): every masked decoder and cache mode
leaves pinned positions as the request wrote them and fills only the holes; the model sees the
pinned text; early stop never fills a later hole; every kind and model that cannot fill holes
refuses in one line; the trace records the pinned positions."""

from __future__ import annotations

import json

import pytest

from engine import Engine, GenerationConfig, RunHooks
from engine.__main__ import main
from engine.cache_modes import cache_mode_names
from engine.cli import DEFAULT_MODEL
from engine.errors import EngineError
from engine.infill import Layout, template_holes, template_pieces
from engine.registry import decoder_class, decoder_names
from engine.trace import Trace

PROMPT = "Q: ?+?=38 A:"
MASKED_DECODERS = [name for name in decoder_names() if decoder_class(name).kind == "masked"]


@pytest.fixture(scope="module")
def embedded() -> Engine:
    return Engine(DEFAULT_MODEL)


def hole_positions(out, row: int, layout: Layout) -> set[int]:
    start = out.prompt_lengths[row]
    return {start + p for a, b in layout.holes for p in range(a, b)}


def test_a_template_is_split_into_pinned_text_and_holes():
    assert template_pieces('{"a": {{hole:3}}, "b": {{hole:12}}}') == ['{"a": ', 3, ', "b": ', 12, "}"]
    assert template_holes(" {{hole:3}} + 22") == [3]
    assert GenerationConfig(template="x{{hole:3}}y{{hole:5}}", block_length=4).gen_length == 8
    assert GenerationConfig(template="x{{hole:3}}y{{hole:5}}", block_length=4).num_blocks() == 1 + 2
    for bad, message in (("no hole", "template: no hole in it"), ("{{hole:0}}", "template: a hole needs at least one position")):
        with pytest.raises(EngineError, match=message):
            GenerationConfig(template=bad)


@pytest.mark.parametrize("decoder", MASKED_DECODERS)
def test_every_decoder_fills_only_the_holes_and_keeps_the_pinned_text(embedded, decoder):
    config = GenerationConfig(template=" {{hole:3}} + {{hole:3}}!", block_length=4, decoder=decoder, threshold=0.5, use_chat_template=False)
    result = embedded.generate([PROMPT, "Q: 4+5=? A:"], config, RunHooks(trace=True))
    layout, out = embedded.layout(config), result.output
    for row in range(2):
        start = out.prompt_lengths[row]
        area = out.canvas[row, start : start + layout.length].tolist()
        holes = hole_positions(out, row, layout)
        assert [t for p, t in enumerate(area) if start + p not in holes] == [t for t in layout.area(embedded.model.mask_token_id) if t != embedded.model.mask_token_id]
        assert embedded.model.mask_token_id not in out.canvas[row].tolist()  # every hole filled
        assert out.token_ids[row] == [t for p, t in enumerate(out.canvas[row].tolist()) if p in holes and t not in embedded.stop_ids]
        assert len(result.holes[row]) == 2 and result.texts[row] == embedded.decode(out.token_ids[row])
        written = {w for rec in out.trace.iterations for w in rec.committed[row]}
        assert written <= holes  # no step wrote a pinned position
    assert out.trace.pinned == [sorted(set(range(out.prompt_lengths[r], out.canvas.shape[1])) - hole_positions(out, r, layout)) for r in range(2)]


@pytest.mark.parametrize("cache", cache_mode_names())
def test_every_cache_mode_keeps_the_pinned_text_and_measures_its_staleness(embedded, cache):
    config = GenerationConfig(gen_length=6, block_length=4, suffix=" + 22", cache=cache, warmup=0, measure_staleness=cache != "none", use_chat_template=False)
    out = embedded.generate(PROMPT, config).output
    suffix = embedded.layout(config).pieces[1]
    start = out.prompt_lengths[0] + 6
    assert tuple(out.canvas[0, start : start + len(suffix)].tolist()) == suffix
    if cache != "none":
        kl = [v for rec in out.trace.iterations for row in rec.extras["staleness_kl"] for v in row if v is not None]
        assert kl and all(v >= 0 for v in kl)


def test_the_model_sees_the_suffix(embedded):
    """The hole's first prediction changes with the text pinned after it (full attention)."""
    seen = []
    for suffix in (" + 22", " +  1"):
        config = GenerationConfig(gen_length=3, block_length=3, suffix=suffix, decoder="fixed", use_chat_template=False)
        seen.append(embedded.generate(PROMPT, config, RunHooks(trace=True)).output.trace.iterations[0].confidence)
    assert seen[0] != seen[1]


def test_early_stop_in_the_first_hole_leaves_the_second_to_the_model(embedded):
    """A hole holding end-of-text ends nothing while a later hole is open: the second hole's first
    position is committed by a step, not filled by early stop (which may end the last hole itself)."""
    config = GenerationConfig(template="{{hole:16}} then{{hole:4}}", block_length=4, use_chat_template=False)
    out = embedded.generate(PROMPT, config, RunHooks(trace=True)).output
    layout = embedded.layout(config)
    first = layout.holes[0]
    start = out.prompt_lengths[0]
    assert any(t in embedded.stop_ids for t in out.canvas[0, start + first[0] : start + first[1]].tolist())  # the model ended the first hole early
    committed = {w for rec in out.trace.iterations for w in rec.committed[0]}
    assert start + layout.holes[1][0] in committed


def test_a_hole_need_not_be_whole_blocks_and_steps_none_is_one_position_a_step(embedded):
    config = GenerationConfig(gen_length=3, block_length=8, suffix=" + 22", decoder="fixed", use_chat_template=False)
    out = embedded.generate(PROMPT, config, RunHooks(trace=True)).output
    assert out.stats.nfe == 3 and [len(rec.committed[0]) for rec in out.trace.iterations] == [1, 1, 1]
    with pytest.raises(EngineError, match="must be a multiple of block_length"):
        GenerationConfig(gen_length=3, block_length=8).validate()


@pytest.mark.parametrize(
    ("model", "settings", "message"),
    [
        ("tiny-llada2", {}, "this model's attention is block-causal: a block sees only the text before it"),
        ("tiny-gemma", {}, "uniform diffusion fills no holes"),
        ("tiny-llada2", {"kind": "speculative"}, "speculative diffusion fills no holes"),
        ("tiny-llada", {"kind": "chain"}, "chain diffusion fills no holes"),
        ("tiny-llada", {"regex": "[0-9]+"}, "a constraint holds the answer to the canvas's end"),
        ("tiny-llada", {"template": " {{hole:2}}"}, "give either suffix or template"),
    ],
)
def test_what_cannot_fill_holes_refuses_in_one_line(model, settings, message):
    with pytest.raises(EngineError) as refused:
        Engine(model).generate(PROMPT, GenerationConfig(gen_length=4, block_length=4, suffix=" + 22", **settings))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_block_causal_model_fills_a_template_with_text_only_before_its_hole():
    engine = Engine("tiny-llada2")
    out = engine.generate(PROMPT, GenerationConfig(template=" {{hole:8}}", block_length=8, use_chat_template=False)).output
    start = out.prompt_lengths[0]
    assert out.canvas[0, start] == engine.layout(GenerationConfig(template=" {{hole:8}}")).pieces[0][0]  # the pinned space
    assert engine.model.mask_token_id not in out.canvas[0].tolist()


def test_the_trace_records_the_pinned_positions_and_older_traces_load(embedded):
    out = embedded.generate(PROMPT, GenerationConfig(gen_length=4, block_length=4, suffix=" + 22", use_chat_template=False), RunHooks(trace=True)).output
    data = json.loads(out.trace.to_json())
    start = out.prompt_lengths[0] + 4
    assert data["version"] == 7 and data["pinned"] == [list(range(start, out.canvas.shape[1]))]
    assert Trace.from_json(json.dumps(data)).pinned == data["pinned"]
    older = {**data, "version": 6}
    del older["pinned"]
    assert Trace.from_json(json.dumps(older)).pinned is None
    with pytest.raises(EngineError, match="pinned must be one list of positions per row"):
        Trace.from_json(json.dumps({**data, "pinned": [[0]]}))  # inside the prompt


def test_the_cli_fills_between_the_prompt_and_the_suffix(capsys):
    assert main(["generate", "--model", DEFAULT_MODEL, "--prompt", PROMPT, "--no-use-chat-template", "--gen-length", "3", "--block-length", "3", "--suffix", " + 22"]) == 0
    assert "+ 22" not in capsys.readouterr().out.strip().splitlines()[-1]  # what the model wrote, not the pinned text
    assert main(["generate", "--model", "tiny-llada2", "--prompt", PROMPT, "--suffix", " + 22", "--gen-length", "8", "--block-length", "8"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: this model's attention is block-causal")


def test_a_canvas_past_the_limit_counts_the_pinned_text(embedded):
    with pytest.raises(EngineError, match=r"\+ pinned text 5 = .* exceeds this server's --max-tokens"):
        embedded.generate(PROMPT, GenerationConfig(gen_length=4, block_length=4, suffix=" + 22", use_chat_template=False), RunHooks(max_tokens=len(PROMPT) + 6))


def test_pinned_rows_keep_their_text_under_a_batch_of_different_prompt_lengths(embedded):
    config = GenerationConfig(gen_length=4, block_length=4, suffix=" + 22", use_chat_template=False)
    out = embedded.generate(["Q: 1+1=? A:", "Q: ?+?=100 A:"], config).output
    suffix = embedded.layout(config).pieces[1]
    for row in range(2):
        start = out.prompt_lengths[row] + 4
        assert tuple(out.canvas[row, start : start + len(suffix)].tolist()) == suffix
        assert set(out.canvas[row, start + len(suffix) :].tolist()) <= {embedded.stop_ids[0]}  # the shorter row's padding: end-of-text
