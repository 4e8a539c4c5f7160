"""What this machine and this engine build support: devices, dtypes, parallelism, compilation.

The app offers a system setting only where both hold: the engine's public `Engine` takes the
option (read from its signature, so an option added to the engine shows up here) and the machine
can use it; a public server offers its visitors only the options its host allows (app.py
--allow-system: worker processes and compilation spend the host's cores and memory). Otherwise the
control is shown disabled with the reason, and a run asking for it is refused with it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

import torch

from engine import Engine, EngineError
from engine.system_options import SystemOption, system_options

from ..reading.words import plural


@dataclass(frozen=True)
class OfferedOption:
    """A system option as the app offers it: its declaration (engine/system_options.py) and
    whether this engine build and machine can use it, or why not."""

    declared: SystemOption
    available: bool
    reason: str  # why it is unavailable (empty when available)

    @property
    def name(self) -> str:  # the Engine keyword argument
        return self.declared.name

    @property
    def label(self) -> str:
        return self.declared.label

    @property
    def kind(self) -> type:  # int (a degree) or bool (a switch)
        return self.declared.kind


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def devices() -> list[str]:
    return ["cpu"] + [f"cuda:{i}" for i in range(cuda_count())]


def engine_parameters() -> set[str]:
    return set(inspect.signature(Engine.__init__).parameters) - {"self", "path", "device", "dtype"}


def offered_options(device: str = "cpu", allowed: Collection[str] | None = None) -> list[OfferedOption]:
    """Each declared option for a model on `device`: offered, or why not. A degree of N runs N
    worker processes: on the CPU they share its cores, on CUDA each takes a device. `allowed`: the
    options a public server's host lets visitors use; None: a private app, every one."""
    params, gpus, on_cpu = engine_parameters(), cuda_count(), torch.device(device).type == "cpu"
    out = []
    for option in system_options():
        needed = option.cuda_devices
        if option.name not in params:
            reason = f"this engine build has no `{option.name}` option"
        elif allowed is not None and option.name not in allowed:
            reason = f"this public server does not offer it to visitors (its host can, with --allow-system {option.name})"
        elif on_cpu and not option.runs_on_cpu:
            reason = "CUDA only; the model is on the CPU"
        elif not on_cpu and gpus < needed:
            each = " (one per process)" if option.kind is int else ""
            reason = f"needs {needed} CUDA GPU{'s' if needed > 1 else ''}{each}; this machine has {gpus}"
        else:
            reason = ""
        out.append(OfferedOption(option, not reason, reason))
    return out


def check_offered(options: Iterable[tuple[str, Any]], device: str, allowed: Collection[str] | None) -> None:
    """EngineError, in one line, for the first of a model spec's options (each set) that is not
    offered on `device` to whom `allowed` says (`offered_options`)."""
    offered = {o.name: o for o in offered_options(device, allowed)}
    for name, _ in options:
        if not offered[name].available:
            raise EngineError(f"{offered[name].label} is unavailable: {offered[name].reason}")


def describe_machine() -> str:
    """Markdown: the devices found (each system option's control states its own availability)."""
    lines = [f"- CPU: {plural(torch.get_num_threads(), 'torch thread')}"]
    for i in range(cuda_count()):
        props = torch.cuda.get_device_properties(i)
        lines.append(f"- cuda:{i}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
    if not cuda_count():
        lines.append("- no CUDA device")
    return "\n".join(lines)


def startup_note(options: Mapping[str, Any], device: str, loaded: bool) -> str:
    """What an engine with these system options spends before its iterations show, that a plain one
    does not: a line for the page while a run or Load waits on it ('' when nothing). Worker
    processes start when the engine loads; compiling and capturing happen at the first forward of
    each shape bucket, in a run, not at the load (engine/runtime/compiled.py). `loaded`: the engine is up,
    so only the first forwards' part is left to say."""
    world = max(_degree(options.get(o.name)) for o in system_options() if o.kind is int)  # the worker processes
    on_cpu = torch.device(device).type == "cpu"
    parts = []
    if world > 1 and not loaded:
        parts.append(f"starting {world} worker processes ({'gloo on the CPU' if on_cpu else 'NCCL, one GPU each'}), each loading the checkpoint and keeping its shard")
    if options.get("compile") is True:  # anything else Engine refuses
        where = "tens of seconds on the CPU, 1-2 s from inductor's disk cache" if on_cpu else "seconds to tens of seconds"
        parts.append(f"compile on: the first forward of each shape bucket compiles ({where}); later ones run the compiled graph")
    if options.get("cuda_graphs") is True:
        parts.append("CUDA graphs on: the first forward of each shape bucket is captured into a CUDA graph, later ones replay it")
    return "; ".join(parts)


def progress_line(what: str, note: str) -> str:
    """A stage of loading or running (`what`), with what the system options spend at it."""
    return f"{what} — {note}…" if note else f"{what}…"


def _degree(value: Any) -> int:
    """A degree as Engine takes it; anything else (which Engine refuses with its own message) is 1 here."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 1
