"""The continuous-batching benchmark's logic (benchmarks/fdfo.py), without its servers: the
workloads as the server reads them, a round's figures from real /metrics text, the table's medians
and ratios, the identity count, and the solo answer cut as the server cuts a row's text."""

from __future__ import annotations

import statistics

import torch

from benchmarks.fdfo import LLADA2, LONG, SHORT, SYSTEM, identity, load_figures, samples, shared_prefix_workload, table, workload
from benchmarks.load import Answer, solo_text
from engine import Engine
from engine.cli import DEFAULT_MODEL
from engine.serving.limits import RequestLimits
from engine.serving.metrics import ServerMetrics
from engine.serving.schema import parse_request


def test_the_workloads_mix_long_and_short_requests_of_many_prompt_lengths_and_share_a_system_prompt():
    bodies = workload(48)
    assert [b["gen_length"] for b in bodies] == [LONG["gen_length"] if i % 4 == 0 else SHORT["gen_length"] for i in range(48)]
    assert workload(48) == bodies  # seeded: both servers and every round get the same list
    engine = Engine(DEFAULT_MODEL)
    assert len({len(engine.encode(b["prompt"], False)) for b in bodies}) >= 8
    for body in bodies:  # every body is a request the server takes, its canvas its max_tokens
        assert parse_request(body, False, RequestLimits()).config.gen_length == body["max_tokens"]
    shared = shared_prefix_workload(48)
    assert all(b["prompt"].startswith(SYSTEM) and b["cache"] == "prefix" for b in shared)
    assert len({b["prompt"] for b in shared}) > 40


def test_a_rounds_figures_come_from_the_servers_metrics_and_the_table_gives_medians_and_ratios():
    metrics = ServerMetrics(lambda: 0, lambda: 0)
    for rows in (1, 3, 4):
        metrics.forward(rows)
    metrics.tokens.inc(30)
    grew = samples(metrics.scrape().decode())
    assert (grew["dinfer_forwards_total"], grew["dinfer_rows_per_forward_sum"], grew["dinfer_generated_tokens_total"]) == (3, 8, 30)
    bodies = workload(8)
    answers = [Answer("", float(i + 1)) for i in range(8)]  # latency i + 1 s; 0 and 4 are long
    figures = load_figures(bodies)((answers, 10.0, grew))
    assert figures["short p50 (s)"] == statistics.median([2, 3, 4, 6, 7, 8]) and figures["long p50 (s)"] == 3.0
    assert (figures["tokens/s"], figures["forwards"], figures["rows per forward"]) == (3.0, 3, 8 / 3)
    rounds = {"continuous": [{"p50": 1.0, "hits": 4.0}, {"p50": 3.0, "hits": 4.0}, {"p50": 2.0, "hits": 4.0}],
              "lockstep": [{"p50": 8.0, "hits": 0.0}, {"p50": 4.0, "hits": 0.0}, {"p50": 5.0, "hits": 0.0}]}
    assert table("batching", rounds, "lockstep") == [
        "| batching | p50 | hits |", "|---|---|---|", "| continuous | 2.00 | 4.00 |", "| lockstep | 5.00 | 0.00 |", "| continuous / lockstep | 0.40x | - |",
    ]


def test_identity_counts_each_servers_answers_equal_to_solo_over_its_rounds():
    solo = ["a", "b"]
    same = [Answer("a", 1.0), Answer("b", 1.0)]
    rounds = {"one": [(same, 1.0, {}), (same, 1.0, {})], "two": [(same, 1.0, {}), ([Answer("a", 1.0), Answer("", 1.0, "500: boom")], 1.0, {})]}
    assert identity(rounds, solo) == "identical to solo: one 4/4, two 3/4; the servers' texts identical in every round: False"


def test_the_solo_answer_ends_at_the_first_end_of_text_as_the_servers_does():
    """tiny-llada2 writes a token after an end-of-text id here: Engine.generate's text keeps it, the answer does not."""
    torch.set_num_threads(1)
    engine = Engine(LLADA2)
    body = shared_prefix_workload(8)[3]
    config = parse_request(body, False, RequestLimits()).config
    out = engine.generate(body["prompt"], config).output
    canvas = out.canvas[0, out.prompt_lengths[0] :].tolist()
    end = canvas.index(engine.stop_ids[0])
    assert any(t != engine.stop_ids[0] for t in canvas[end:])  # something follows the end of text
    assert solo_text(engine, body) == engine.decode(canvas[:end]) != engine.decode(out.token_ids[0])
