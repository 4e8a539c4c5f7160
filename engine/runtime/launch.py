"""A process that a launcher started as one rank of a parallel job: torchrun on one node or several
(`--nnodes`, its rendezvous), or anything that sets the same environment (docs/scaling.md).

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in each process it starts.
An `Engine(..., tp_size=N)` in such a process does not start worker processes (engine/runtime/
workers.py): it is one rank of the job, checks that its degree matches the job's size before
reading a weight, joins the process group and reads only its shard (engine/runtime/parallel.py:
`load_shard`). Every rank then runs the same loop on the same token ids, as the self-started
workers do, with nobody between them: there is no caller process to replay a trace or share a stop.

- **The request.** Every rank calls `generate` itself (the same script, or `python -m engine
  generate`, on every rank), so each rank's request is replaced by rank 0's (`Job.agree`: its
  prompts' ids and config, broadcast): the ranks cannot drift apart on a tokenizer or an argument,
  and rank 0 returns what one process would; the others return the same output.
- **Stopping.** The loop checks its cancel flag at the same points on every rank (before each
  layer, between groups of iterations; the numbering the workers rely on too). When rank 0's run
  has something that can stop it (a cancel flag, or a callback, which stops the run by raising),
  every check is one all-reduce (MAX, over a gloo group: a CPU tensor, no device sync) of each
  rank's own wish: its flag set or its callback raised. So any rank's stop ends every rank at the
  same check, within about one layer; a callback's exception is raised after that, on its rank,
  and GenerationCancelled on the others. A run with neither (the CLI) communicates nothing at its
  checks, and a job is stopped as a whole: Ctrl-C or a signal to torchrun ends every rank, as does
  any rank that fails (torchrun ends the others).
- **A rank that dies.** Its sockets close with it, so the next collective of every other rank
  fails at once (gloo: "Connection reset by peer"); `Job.run` turns that into one EngineError line
  naming this rank and the job's loss (a process group cannot take a rank back: the job ends).
  torchrun meanwhile sees the death and sends SIGTERM to the others; a rank that gets it in the
  middle of a request raises the same kind of line (`Job.join` installs the handler, where the
  script left SIGTERM at its default), so whichever comes first the caller reads one line from the
  rank that reports (the first of its node), never a traceback, and every rank has ended when
  torchrun exits (tests/test_torchrun_faults.py).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..config import GenerationConfig
from ..errors import EngineError
from ..hooks import CancelFlag, RunHooks
from ..run import GenerationCancelled, GenerationOutput

# What torchrun sets in every process it starts (and what the self-started workers set too).
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
REPORTER_WAIT_SECONDS = 30.0  # the most a rank that does not report an error waits for the launcher to end it
Loop = Callable[[list[list[int]], GenerationConfig, RunHooks], GenerationOutput]  # a rank's one-process generate


def first_on_its_node() -> bool:
    """Whether this process is the first of its node (LOCAL_RANK 0, or not launched at all): the
    one that reports a command line's errors, so that each node's console shows one line (torchrun
    merges its processes' output, one console per node)."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def wait_for_the_reporter(seconds: float = REPORTER_WAIT_SECONDS) -> None:
    """In a launched rank that is not the first of its node, after a command's error: wait for
    the launcher to end this process (at most `seconds`), leaving the error's line to the first.
    Every rank fails the same checks (a degree, an argument) at about the same time, and torchrun
    ends the other ranks the moment one exits: a rank that left first could end the reporter
    before it wrote its line (a CI run saw no line at all). The job's group is gone by now (the
    engine closed), so a rank still in a collective with this one fails at once and reports."""
    if first_on_its_node() or "LOCAL_RANK" not in os.environ:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's end, not another error line
    time.sleep(seconds)


def _from_torch_distributed(exc: BaseException) -> bool:
    """Whether `exc` was raised inside torch.distributed (a collective or the object broadcast):
    the job's failure, not this rank's own bug."""
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("torch.distributed"):
            return True
        tb = tb.tb_next
    return False


def _what_failed(exc: BaseException) -> str:
    """A collective's error, its first sentence: gloo's starts with its source file in brackets
    and ends with paragraphs of advice."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("["):
        text = text.split("] ", 1)[-1]
    return text.split(". ")[0].rstrip(".")


def _whole(name: str) -> int:
    value = os.environ[name]
    if not value.isdigit():
        raise EngineError(f"the launcher's {name}={value!r} is not a whole number")
    return int(value)


class _AnyRankStops:
    """The cancel flag every rank reads in a stoppable run: each check all-reduces (MAX) every
    rank's own wish to stop, so all ranks answer each numbered check alike."""

    def __init__(self, own: Callable[[], bool], group: Any) -> None:
        self.own, self.group = own, group

    def is_set(self) -> bool:
        wish = torch.tensor([1 if self.own() else 0], dtype=torch.int32)
        dist.all_reduce(wish, op=dist.ReduceOp.MAX, group=self.group)
        return bool(wish.item())


@dataclass
class Job:
    """This process's place in a launched job, as the environment describes it."""

    rank: int
    world: int
    local_rank: int
    _control: Any = field(default=None, repr=False)  # the gloo group of the requests and stops, made on first use
    _joined: bool = field(default=False, repr=False)  # whether `join` made the process group (so `leave` ends it)

    @classmethod
    def from_environment(cls) -> "Job | None":
        """The job this process is a rank of, or None when no launcher set the environment."""
        if not all(name in os.environ for name in LAUNCH_VARIABLES):
            return None
        job = cls(_whole("RANK"), _whole("WORLD_SIZE"), _whole("LOCAL_RANK"))
        if not 0 <= job.rank < job.world:
            raise EngineError(f"the launcher's RANK={job.rank} is outside WORLD_SIZE={job.world}")
        return job

    def join(self, device: str) -> torch.device:
        """Join the job's process group (NCCL on CUDA, each rank on its LOCAL_RANK device; gloo on
        the CPU); this rank's device."""
        target = torch.device(device)
        if target.type == "cuda":
            target = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(target)
        if not dist.is_initialized():  # a group the script made itself is used as it is
            dist.init_process_group("nccl" if target.type == "cuda" else "gloo")
            self._joined = True
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._terminated)  # a script's own handler is left alone
        return target

    def _terminated(self, signum: int, frame: Any) -> None:
        """SIGTERM, from the launcher (torchrun ends the other ranks once one has failed): one line,
        raised where this rank is; the process is ending, so a second signal cannot cut that line."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise EngineError(f"rank {self.rank} of {self.world} was stopped by the job's launcher (SIGTERM): another rank failed, or the job was stopped")

    def leave(self) -> None:
        """End the process group if `join` made it. Garbage is collected first: a group still
        referenced from a reference cycle outlives destroy_process_group, and its gloo threads then
        free their last all-reduce's tensors during the interpreter's shutdown, which aborts the
        rank (SIGABRT, "terminate called without an active exception": 3 launched jobs in 24 on the
        loaded 2-core machine, once a callback's exception had held the group in a cycle)."""
        if self._joined and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()
        self._control, self._joined = None, False

    def _group(self) -> Any:
        """The gloo group for the requests and stops: the default group on the CPU, a gloo group
        beside NCCL's on CUDA (made collectively, the first time every rank gets here)."""
        if self._control is None:
            self._control = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        return self._control

    def run(self, prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks, loop: Loop) -> GenerationOutput:
        """`loop` (this rank's one-process generate) on rank 0's prompts and config, with this
        rank's callbacks guarded (an exception is kept and stops the run) and, when rank 0's run
        can stop, the all-ranks stop as its cancel flag. A callback's exception is raised on its
        rank once every rank has stopped."""
        try:
            return self._run(prompts, config, hooks, loop)
        except RuntimeError as exc:
            if not _from_torch_distributed(exc):
                raise
            if signal.getsignal(signal.SIGTERM) == self._terminated:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM, next, cannot cut this line
            raise EngineError(
                f"rank {self.rank} of {self.world}: another rank of the job is gone ({_what_failed(exc)}); a process group cannot take a rank back, so the job ends"
            ) from None

    def _run(self, prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks, loop: Loop) -> GenerationOutput:
        sent: list[Any] = [(prompts, config, hooks.cancel is not None or hooks.on_start is not None or hooks.on_iteration is not None)]
        dist.broadcast_object_list(sent, src=0, group=self._group())
        prompts, config, stoppable = sent[0]
        raised: list[Exception] = []
        own: CancelFlag | None = hooks.cancel

        def guarded(callback: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
            def call(value: Any) -> None:
                if not raised:
                    try:
                        callback(value)
                    except Exception as exc:
                        raised.append(exc)

            return None if callback is None else call

        cancel = _AnyRankStops(lambda: bool(raised) or (own is not None and own.is_set()), self._group()) if stoppable else None
        try:
            out = loop(prompts, config, hooks.but(on_start=guarded(hooks.on_start), on_iteration=guarded(hooks.on_iteration), cancel=cancel))
        except GenerationCancelled:
            if raised:  # popped: kept here, it and its traceback (this frame) would form a cycle
                raise raised.pop() from None
            raise
        if raised:  # raised after the run's last check
            raise raised.pop()
        return out
