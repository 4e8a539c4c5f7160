"""`python -m dinfer_viz.sample_traces`: the traces `app.py --no-model` can replay with no model.

One trace per decoder (cache none) and per cache mode (threshold decoder), made by the engine on the
embedded model (assets/tiny-llada) on the CPU, greedy, on one pair-sum prompt, with the app's
default settings otherwise, so the files compare with each other and with a run of the same
settings in the app. The edit decoder's is the exception: it runs where editing shows at its best,
on the model trained to edit (assets/tiny-llada-edit), lesson 5's run (`SAMPLE_RUNS`). Each is the engine's trace JSON (`Trace.to_json`, docs/trace.md), written to
`assets/traces/<decoder>-<cache>.json`, with `index.json` listing every file and its settings.

    python -m dinfer_viz.sample_traces                 # regenerate assets/traces from assets/tiny-llada
    python -m dinfer_viz.sample_traces --out /tmp/t    # elsewhere
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine import Engine, GenerationConfig, RunHooks, Trace
from engine.cli import set_cpu_threads
from engine.cache_modes import cache_modes
from engine.registry import builtin_decoder_names

from .studies.answers import FAMILY_EXAMPLES
from .studies.lessons import EDIT_LESSON_PROMPT, EDIT_MODEL
from .panes.readouts import plural

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_MODEL = ROOT / "assets" / "tiny-llada"
TRACES = ROOT / "assets" / "traces"
INDEX = "index.json"
# The Run tab's default prompt: the first forward cannot commit the digits, so every decoder shows
# a choice (forced commits, several iterations), and the answer is short enough for small files
PROMPT = FAMILY_EXAMPLES["pairsum"][0]
# Set against the Run tab's defaults: one decoder or one cache mode changed at a time. The modes
# that are not exact also measure staleness, so a replay's extras show what caching cost in agreement.
BASE = {"decoder": GenerationConfig.decoder, "cache": GenerationConfig.cache}
THREADS = 1  # float reductions in one order: regenerating a sample gives the same tokens
# Samples that run elsewhere than PROMPT on the embedded model: stem -> (the model, a folder beside
# the embedded one; the prompt; settings beyond sample_settings'). The edit decoder on the base
# model edits the same positions up to its post-edit limit and breaks the answer; on the edit model,
# at lesson 5's τ 0.3 on its held-out prompt, the threshold decoder answers `  0 + 31` and the edit
# decoder repairs the first number into ` 10 + 31` (41: right).
SAMPLE_RUNS: dict[str, tuple[str, str, dict[str, Any]]] = {"edit-none": (EDIT_MODEL, EDIT_LESSON_PROMPT, {"threshold": 0.3})}


def sample_settings() -> dict[str, dict[str, Any]]:
    """File stem -> the GenerationConfig fields it sets (the rest are the defaults): each of the
    engine's own decoders (a plug-in registered through the environment is not the project's to
    ship) on the base cache mode, then the base decoder on each other mode (`SAMPLE_RUNS`' own
    settings included)."""
    out = {f"{d}-{BASE['cache']}": {**BASE, "decoder": d} for d in builtin_decoder_names()}
    for mode in cache_modes():
        if mode.name != BASE["cache"]:
            out[f"{BASE['decoder']}-{mode.name}"] = {**BASE, "cache": mode.name, **({} if mode.exact else {"measure_staleness": True})}
    return {stem: {**settings, **SAMPLE_RUNS.get(stem, ("", "", {}))[2]} for stem, settings in out.items()}


def sample_run(stem: str, model: Path = EMBEDDED_MODEL) -> tuple[Path, str]:
    """(model folder, prompt) of sample `stem`: `model` and PROMPT, or what SAMPLE_RUNS names (its
    model a folder beside `model`)."""
    if stem in SAMPLE_RUNS:
        name, prompt, _ = SAMPLE_RUNS[stem]
        return model.parent / name, prompt
    return model, PROMPT


def generate_sample(engine: Engine, settings: dict[str, Any], prompt: str = PROMPT) -> Trace:
    """The trace of `prompt` under `settings` (a sample_settings() entry) on `engine`."""
    return engine.generate(prompt, GenerationConfig.from_dict(settings), hooks=RunHooks(trace=True)).output.trace


def sample_engine(folder: Path) -> Engine:
    """An engine as the samples are made with: one CPU thread (the same tokens every time)."""
    engine = Engine(folder)
    set_cpu_threads(engine.model, THREADS)
    return engine


def write_samples(model: Path = EMBEDDED_MODEL, out: Path = TRACES) -> list[dict[str, Any]]:
    """Generate every sample into `out` with `index.json`; returns the index's entries."""
    out.mkdir(parents=True, exist_ok=True)
    engines: dict[Path, Engine] = {}
    entries = []
    for stem, settings in sample_settings().items():
        folder, prompt = sample_run(stem, model)
        if folder not in engines:
            engines[folder] = sample_engine(folder)
        engine = engines[folder]
        trace = generate_sample(engine, settings, prompt)
        text = trace.to_json()
        (out / f"{stem}.json").write_text(text, encoding="utf-8")
        entries.append(
            {
                "file": f"{stem}.json",
                "model": folder.name,
                "prompt": prompt,
                "settings": settings,
                "answer": engine.decode(trace.final[0][trace.prompt_lengths[0] :]),
                "iterations": len(trace.iterations),
                "nfe": trace.stats["nfe"],
                "tpf": round(trace.stats["tpf"], 3),
                "bytes": len(text.encode("utf-8")),
            }
        )
    index = {
        "about": (
            f"Traces made by `python -m dinfer_viz.sample_traces` with the embedded model ({model.name}; each entry names its model) on the CPU, "
            "greedy; settings not listed are GenerationConfig's defaults. Load one in the Run tab (Load a trace) "
            "to replay it with no model; timings are those of the machine that made them."
        ),
        "model": model.name,
        "traces": entries,
    }
    (out / INDEX).write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return entries


def shipped_samples(folder: Path = TRACES) -> list[tuple[str, str]]:
    """(label, path) of each trace `index.json` lists, for a menu of samples to replay (the labels
    say the settings and the outcome); empty when the folder or its index is missing."""
    try:
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for e in index.get("traces", []):
        settings = e["settings"]
        on = f" on {e['model']}" if e.get("model", index.get("model")) != index.get("model") else ""
        label = f"{settings['decoder']} decoder{on}, cache {settings['cache']}: {e['answer'].strip()!r} in {plural(e['iterations'], 'iteration')}"
        out.append((label, str(folder / e["file"])))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dinfer_viz.sample_traces", description="regenerate the sample traces for app.py --no-model")
    p.add_argument("--model", type=Path, default=EMBEDDED_MODEL, help="model folder (default: the embedded model)")
    p.add_argument("--out", type=Path, default=TRACES, help="folder to write (default: assets/traces)")
    args = p.parse_args(argv)
    entries = write_samples(args.model, args.out)
    for e in entries:
        print(f"{e['file']:<28} {e['iterations']:>3} iterations  {e['bytes'] / 1024:6.1f} KiB  {e['answer']!r}")
    print(f"{len(entries)} traces, {sum(e['bytes'] for e in entries) / 1024:.1f} KiB, in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
