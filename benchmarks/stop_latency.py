"""How long Stop takes to free the engine when it arrives inside one long forward.

    python -m benchmarks.stop_latency --canvas 4096 16384 --threads 1

For each canvas length: a LLaDA with the embedded model's shape but `max_sequence_length` large
enough (random weights: only the time matters) runs one generate on a worker thread; the cancel
event is set once the first layer of the first forward has started, and the table shows the time
of one whole forward (measured first, alone) against the time from the cancel to the worker's end.
The engine checks the cancel before every layer (engine/run.py: cancel_between_layers), so
the second figure is about one layer's time, not one forward's. Medians over `--repeats`.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from engine import GenerationConfig, RunHooks
from engine.cli import OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.run import GenerationCancelled
from engine import run_diffusion
from engine.models import LLaDAModelLM
from tinymodel.tokenizer import build_tokenizer, special_ids


def model_for(canvas: int, layers: int) -> LLaDAModelLM:
    config = dict(model_type="llada", d_model=192, n_heads=6, n_layers=layers, mlp_hidden_size=512, rope_theta=10000.0,
                  vocab_size=build_tokenizer().get_vocab_size(), max_sequence_length=canvas, **special_ids())
    return LLaDAModelLM(config).eval()


def one_forward_seconds(model: LLaDAModelLM, canvas: int) -> float:
    ids = torch.full((1, canvas), model.mask_token_id, device=model.device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(input_ids=ids)
        return time.perf_counter() - t0


def stop_seconds(model: LLaDAModelLM, canvas: int) -> float:
    """Seconds from setting the cancel (inside layer 0 of the first forward) to the worker's end."""
    cancel, started = threading.Event(), threading.Event()
    handle = model.layer_modules()[0].register_forward_pre_hook(lambda *a: started.set())
    config = GenerationConfig(gen_length=canvas - 8, block_length=canvas - 8, decoder="fixed", use_chat_template=False)
    outcome: list[str] = []

    def work() -> None:
        try:
            run_diffusion(model, [[5] * 8], config, hooks=RunHooks(cancel=cancel))
            outcome.append("finished")
        except GenerationCancelled:
            outcome.append("cancelled")

    worker = threading.Thread(target=work)
    worker.start()
    started.wait()
    t0 = time.perf_counter()
    cancel.set()
    worker.join()
    handle.remove()
    if outcome != ["cancelled"]:
        raise RuntimeError(f"the run was not cancelled: {outcome}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.stop_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--canvas", nargs="+", type=int, default=[4096, 16384])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    add_runtime_args(parser)
    args = parser.parse_args(argv)
    runtime = apply_runtime(args)
    print("| canvas | layers | one forward (s) | stop to free (s) | ratio |\n|---|---|---|---|---|")
    for canvas in args.canvas:
        model = model_for(canvas, args.layers).to(runtime["device"], runtime["dtype"] or torch.float32)
        set_cpu_threads(model, args.threads)
        forward = statistics.median(one_forward_seconds(model, canvas) for _ in range(args.repeats))
        stop = statistics.median(stop_seconds(model, canvas) for _ in range(args.repeats))
        print(f"| {canvas} | {args.layers} | {forward:.2f} | {stop:.2f} | {stop / forward:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
