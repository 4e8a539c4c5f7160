"""Structured output measured (issue 35, docs/constraints.md): what a constraint does to answers,
speed and time per iteration.

1. The embedded models over the held-out pair-sum prompts (tinymodel/tasks.py), one prompt per
   run, with and without the pair-sum regex: well-formed (the verifier's shape, sum aside) and
   correct (the verifier) shares, tokens per forward, and per iteration the constraint's time
   (restrict, admit, draft: engine/constraints/canvas.py, timed around each call) against the
   forward's (the trace's `cost.compute_seconds`). tiny-llada (masked) runs the threshold decoder
   at thresholds 0.9 / 0.5 / 0.3 / 0.1; tiny-gemma (uniform) has no threshold and runs its sampler
   at entropy bounds 0.1 / 0.5 / 1 / 2 (larger: more accepted per step); its records carry no
   forward cost, so its forward column is the step's time less the constraint's (marked ~).
2. A 32k-token byte-level BPE trained here on a generated corpus (the `tokenizers` package, no
   download) and a JSON schema of nested fields, on a 256-token canvas of 8 blocks of 32: the
   automaton's size and build time, and the constraint's time per iteration of a decoding
   simulated without a model (random logits; each iteration commits the 4 most confident open
   positions of the block, as a threshold decoder at a low threshold might).

    python -m benchmarks.constraints            # the table in benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from engine import Engine, GenerationConfig, RunHooks
from engine.constraints import CanvasConstraint, ConstraintSpec, TokenVocabulary
from engine.constraints.spec import JSON_OBJECT
from tinymodel.tasks import PairSum

ROOT = Path(__file__).resolve().parent.parent
PAIR = r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])"
SHAPE = re.compile(r"\s*(0|[1-9]\d?) *\+ *(0|[1-9]\d?)\s*")  # PairSum.check's, without the sum
NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "string", "pattern": "[0-9]{5}"}}, "required": ["city", "zip"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "address", "tags", "active"],
}


class Clock:
    """Seconds spent inside the constraint's calls while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def installed(self) -> Iterator[None]:
        originals = {name: getattr(CanvasConstraint, name) for name in ("restrict", "admit", "draft")}

        def timed(method):
            def call(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return method(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - start
            return call

        for name, method in originals.items():
            setattr(CanvasConstraint, name, timed(method))
        try:
            yield
        finally:
            for name, method in originals.items():
                setattr(CanvasConstraint, name, method)


def embedded_rows(limit: int | None) -> list[list[str]]:
    task = PairSum()
    examples = task.prompts("held_out", 1000)[:limit]
    rows = []
    for model, knob, values in (("tiny-llada", "threshold", (0.9, 0.5, 0.3, 0.1)), ("tiny-gemma", "entropy_bound", (0.1, 0.5, 1.0, 2.0))):
        engine = Engine(ROOT / "assets" / model)
        for value in values:
            for constrained in (False, True):
                if knob == "threshold":
                    config = GenerationConfig(threshold=value, use_chat_template=False, regex=PAIR if constrained else None)
                else:
                    config = GenerationConfig(decoder="uniform", gen_length=16, use_chat_template=False, regex=PAIR if constrained else None, decoder_options={"entropy_bound": value})
                clock, forward, steps, iterations, tokens, nfe, formed, correct = Clock(), 0.0, 0.0, 0, 0, 0, 0, 0
                with clock.installed():
                    for e in examples:
                        out = engine.generate(e.prompt, config, RunHooks(trace=True))
                        text = out.text
                        formed += bool(SHAPE.fullmatch(text))
                        correct += task.check(e, text)
                        trace = out.output.trace
                        iterations += len(trace.iterations)
                        forward += sum(r.cost["compute_seconds"][0] for r in trace.iterations if r.cost)
                        steps += sum(r.seconds for r in trace.iterations)
                        tokens, nfe = tokens + out.output.stats.tokens, nfe + out.output.stats.nfe
                n = len(examples)
                constraint_ms = f"{1000 * clock.seconds / iterations:.2f}" if constrained else "-"
                # a uniform step records no forward cost: its step time less the constraint's stands in
                forward_ms = f"{1000 * forward / iterations:.2f}" if forward else f"~{1000 * (steps - (clock.seconds if constrained else 0.0)) / iterations:.2f}"
                rows.append([model, f"{knob} {value:g}", "pair-sum regex" if constrained else "none", f"{100 * formed / n:.1f}%", f"{100 * correct / n:.1f}%", f"{tokens / nfe:.2f}", constraint_ms, forward_ms])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def corpus(lines: int, seed: int = 0) -> list[str]:
    """Generated text for the BPE: JSON records of generated words, and prose of the same words."""
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["th", "st", "ng", "ck", "qu"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(60000)})
    out = []
    for i in range(lines):
        picked = rng.sample(words, 6)
        if i % 2:
            record = {"name": picked[0], "age": rng.randint(0, 99), "address": {"city": picked[1], "zip": f"{rng.randint(0, 99999):05d}"}, "tags": picked[2:5], "active": rng.random() < 0.5}
            out.append(json.dumps(record))
        else:
            out.append(" ".join(rng.sample(words, 12)).capitalize() + ".")
    return out


def bpe_row(vocab_size: int, canvas: int, block: int, iterations: int) -> list[str]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    start = time.perf_counter()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>", "<mask>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(200_000), trainer)
    trained = time.perf_counter() - start
    eos, mask = tokenizer.token_to_id("<eos>"), tokenizer.token_to_id("<mask>")
    vocabulary = TokenVocabulary.of(tokenizer, [eos], after=(mask,))
    start = time.perf_counter()
    automaton = vocabulary.automaton(ConstraintSpec("json_schema", NESTED_SCHEMA).regex())
    compiled = time.perf_counter() - start
    size = tokenizer.get_vocab_size()
    check = CanvasConstraint([automaton], [0], canvas)
    generator = torch.Generator().manual_seed(0)
    x = torch.full((1, canvas), mask)
    spent, steps = 0.0, 0
    for s in range(0, canvas, block):
        for _ in range(iterations):
            open_ = x == mask
            if not open_[0, s : s + block].any():
                break
            logits = torch.randn((1, block, size), generator=generator)
            t0 = time.perf_counter()
            restricted, _ = check.restrict(logits, x, open_, s, open_[:, s : s + block])
            probs, tokens = torch.softmax(restricted, dim=-1).max(dim=-1)
            score = torch.where(open_[:, s : s + block], probs, torch.full_like(probs, -1.0))
            writes = torch.zeros_like(open_[:, s : s + block])
            writes[0, score[0].topk(min(4, int(open_[0, s : s + block].sum()))).indices] = True
            kept = check.admit(x, open_, s, writes, tokens, score)
            spent += time.perf_counter() - t0
            steps += 1
            x[:, s : s + block] = torch.where(kept, tokens, x[:, s : s + block])
    text = tokenizer.decode([t for t in x[0].tolist() if t != eos])
    json.loads(text)  # the finished canvas is a word of the language
    return [f"BPE {size} (trained {trained:.0f} s)", f"{automaton.states} states, {automaton.classes} classes (built {compiled:.1f} s)", f"{canvas} / {block}", f"{steps}", f"{1000 * spent / steps:.1f}"]


RECORD_SCHEMA = {  # a schema whose shortest answer fits gen_length 64 over the embedded models' characters
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
    "required": ["name", "age"],
}
PER_STEP = {  # the constraints of the per-step table (issue 60): a server's json_object, a regex, a schema
    "json_object": ConstraintSpec("json_schema", JSON_OBJECT),
    "regex": ConstraintSpec("regex", r"[A-Z][a-z]{2,12}( [a-z]{1,10}){2,8}\\. (Yes|No)!"),
    "JSON schema": ConstraintSpec("json_schema", RECORD_SCHEMA),
}


def per_step_rows(gens: tuple[int, ...], repeats: int) -> list[list[str]]:
    """Per generation length and constraint: the median wall time of one request on tiny-llada
    (its defaults, automata already built and kept), per forward, against the same request
    without the constraint in the same run; and the constraint's own time per forward."""
    engine = Engine(ROOT / "assets" / "tiny-llada")
    prompt = "A city record:"  # short: gen_length 480 fits the model's 512 positions
    for spec in PER_STEP.values():  # built (or read from the store) before any timing
        engine.vocabulary.automaton(spec.regex())
    rows = []
    for gen in gens:
        plain_ms = None
        for name, spec in (("none", None), *PER_STEP.items()):
            config = GenerationConfig(gen_length=gen, use_chat_template=False, **({spec.kind: spec.value} if spec is not None else {}))
            walls, spent, nfe = [], [], 0
            for _ in range(repeats):
                clock = Clock()
                with clock.installed():
                    start = time.perf_counter()
                    out = engine.generate(prompt, config)
                    walls.append(time.perf_counter() - start)
                spent.append(clock.seconds)
                nfe = out.output.stats.nfe
            wall = float(np.median(walls))
            per_step = 1000 * wall / nfe
            plain_ms = per_step if spec is None else plain_ms
            rows.append([str(gen), name, str(nfe), f"{1000 * wall:.0f}", f"{per_step:.1f}", f"{1000 * float(np.median(spent)) / nfe:.1f}" if spec else "-",
                         f"{per_step / plain_ms:.2f}x" if spec else "1.00x"])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.constraints", description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="held-out pair-sum prompts (default: all 34)")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--skip-embedded", action="store_true")
    ap.add_argument("--per-step", action="store_true", help="only the per-step table: constrained against plain requests (issue 60)")
    ap.add_argument("--gens", type=int, nargs="+", default=[64, 256, 480], help="the per-step table's generation lengths")
    ap.add_argument("--repeats", type=int, default=5, help="requests per cell of the per-step table (its median)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.per_step:
        header = ["gen_length", "constraint", "forwards", "request ms", "ms per forward", "constraint ms per forward", "per forward / plain"]
        print(table(header, per_step_rows(tuple(args.gens), args.repeats)))
        return 0
    if not args.skip_embedded:
        print(table(["model", "setting", "constraint", "well-formed", "correct", "TPF", "constraint ms/iter", "forward ms/iter"], embedded_rows(args.limit)))
        print()
    print(table(["vocabulary", "automaton (nested JSON schema)", "canvas / block", "iterations", "constraint ms/iter"], [bpe_row(args.vocab_size, 256, 32, 64)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
