"""The constraint build server (docs/constraints.md §1): one process per caller, started by bounded.py
as `python -m engine.constraints.builder FD`, that forks one child per build.

A fresh interpreter, so it never imports the caller's main module: Python's multiprocessing starts
every child (spawn and forkserver alike) by importing the caller's script first, which runs a
top-level script's work again inside the build (and a script read from standard input, `python -c`
or a notebook cell has no file to import). It imports the engine's constraint code once, at its
start, and forks each build from that clean, single-threaded process, so a build starts in
milliseconds rather than the seconds an interpreter takes to import torch.

Orders arrive on the control socket FD (inherited), each ORDER_BYTES long: BUILD with the build's
own socket attached (SCM_RIGHTS), or KILL and the pid of a build to end. On its socket a build's
child sends its pid, reads the caller's sys.path, memory bound and CPU seconds, then the function and its
arguments, and answers ("value", result), ("error", one line) or ("memory", None); once the child
has ended and been reaped, the server sends ("exit", its exit code: -N for signal N). The server
ends when the control socket closes (the caller ended, however), and its children die with it
(PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import sys
import traceback

from ..errors import EngineError

# What builds run (spec.byte_states, vocabulary.region_automaton: numpy and outlines-core), imported
# once before any fork; the packages above them import nothing on their own (engine/lazy_exports.py),
# so this process never loads torch.
from . import spec, vocabulary  # noqa: F401
from .bounded import BUILD, KILL, ORDER_BYTES, exactly, receive, send


def serve(control: socket.socket) -> None:
    """Fork a child per BUILD order, kill one per KILL order, report each child's end; return when
    the control socket closes."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # SIGCHLD wakes the selector below
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    builds: dict[int, socket.socket] = {}  # child pid -> its build socket
    while True:
        for key, _ in selector.select():
            if key.fileobj is not control:
                os.read(wake_read, 4096)
                _reap(builds)
                continue
            order, fds, _, _ = socket.recv_fds(control, 1, 1)
            if not order:
                return  # the caller ended: each child's PR_SET_PDEATHSIG ends it with this process
            pid = int.from_bytes(exactly(control, ORDER_BYTES - 1), "big")
            if order == BUILD:
                build = socket.socket(fileno=fds[0])
                server = os.getpid()
                child = os.fork()
                if child == 0:
                    for fd in (control.fileno(), selector.fileno(), wake_read, wake_write, *(b.fileno() for b in builds.values())):
                        os.close(fd)
                    _child(build, server)
                builds[child] = build
            elif order == KILL and pid in builds:  # not yet reaped: still this server's child
                os.kill(pid, signal.SIGKILL)


def _reap(builds: dict[int, socket.socket]) -> None:
    while builds:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        build = builds.pop(pid)
        try:
            send(build, ("exit", os.waitstatus_to_exitcode(status)))
        except OSError:  # the caller stopped waiting
            pass
        build.close()


def _child(build: socket.socket, server: int) -> None:
    """One build, in a child forked by `server`: never returns."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        _die_with(server)
        send(build, ("pid", os.getpid()))
        path, memory, cpu = receive(build)
        sys.path[:] = path  # the caller's: the function may live in a module only it can import
        function, args = receive(build)
        _lower(resource.RLIMIT_AS, _address_space() + memory)
        # SIGXCPU at the soft limit ends the child (its default action), SIGKILL past the hard one;
        # no core file where the build ran (SIGXCPU's default also dumps core)
        _lower(resource.RLIMIT_CORE, 0)
        _lower(resource.RLIMIT_CPU, cpu, cpu + 2)
        try:
            answer = ("value", function(*args))
        except EngineError as exc:
            answer = ("error", str(exc))
        except MemoryError:
            answer = ("memory", None)
        send(build, answer)
        code = 0
    except (EOFError, ConnectionError):  # the caller stopped waiting: nothing to say
        pass
    except BaseException:  # noqa: BLE001 (the caller reads the exit code; the trace goes to stderr)
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _lower(limit: int, soft: int, hard: int | None = None) -> None:
    """Set resource `limit` to `soft` (and `hard`, else `soft`), never above the hard limit it has."""
    _, ceiling = resource.getrlimit(limit)
    cap = (lambda value: value) if ceiling == resource.RLIM_INFINITY else (lambda value: min(value, ceiling))
    soft_hard = hard if hard is not None else soft
    resource.setrlimit(limit, (cap(soft), cap(soft_hard)))


def _address_space() -> int:
    """This process's virtual memory now (bytes): the child's own start, which the limit adds to."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _die_with(server: int) -> None:
    """Killed when the server ends (it ends with the process it serves), so a build outlives no
    caller, even one killed outright."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the deadline still bounds the build
        pass
    if os.getppid() != server:  # the server ended before prctl took effect
        os._exit(1)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
