"""The boundary that model-written code runs behind: bubblewrap namespaces, a process filter and
resource limits, all enforced by the kernel rather than by the interpreter that runs the code.

Each program runs in its own `bwrap` sandbox (docs/performance.md §5.1):
- its own user, PID, mount, network, IPC, UTS and cgroup namespaces: it sees no host process, has
  no network (only a loopback that is down) and no abstract Unix socket of the host;
- a filesystem of its own: an empty root with `/usr` and the interpreter's prefix bound read-only,
  fresh `/proc` and `/dev`, and size-capped tmpfs folders for its work folder (`/sandbox`, holding
  the program) and `/tmp`; no other host path exists inside, so nothing of the host can be read
  or written;
- no capabilities, no new user namespaces, and a seccomp filter that kills the program when it
  starts a process (fork, vfork, a clone that is not a thread): a fork bomb or a grandchild cannot
  start, and a program that tries fails; the same filter answers EPERM to ptrace, the kernel
  keyring (keyctl, add_key, request_key), io_uring and reading or writing another process's memory;
- an environment of four variables, bwrap's own included (the sandbox's PID 1 is bwrap, whose
  /proc/1/environ a program can read: it must hold nothing of the caller's);
- limits on address space, file size, open files and core dumps (`prlimit`), and on its tasks
  (processes and threads, `TASK_LIMIT`): RLIMIT_NPROC set inside the sandbox's user namespace,
  where the kernel (5.14 on) counts only the namespace's own tasks, not every process of the
  caller's uid; and, where the caller is root (whose uid RLIMIT_NPROC never binds) or wherever a
  pids cgroup can be made, a cgroup of its own whose `pids.max` is the same bound;
- at the timeout the sandbox's PID 1 is killed, which kills every process of its namespace; the
  call returns only once the namespace is empty.
Where `bwrap` or `prlimit` is missing or the kernel refuses the namespaces, `unavailable()` says
why in one line and `run` refuses, unless the caller opts in to running code without a boundary
(`DINFER_VIZ_UNSANDBOXED_CODE=1`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator

from engine.errors import EngineError

UNSANDBOXED_ENV = "DINFER_VIZ_UNSANDBOXED_CODE"
MEMORY_LIMIT = 2 << 30  # bytes of address space per process
FOLDER_LIMIT = 64 << 20  # bytes in each of the sandbox's writable folders (tmpfs, in RAM)
FILE_LIMIT = 64 << 20  # bytes per file written
OPEN_FILES = 256
TASK_LIMIT = 256  # processes and threads: bwrap's two, the interpreter's, a thread pool on a big machine
CGROUP_RELEASE_S = 5.0  # the longest a finished run waits for its cgroup to be released
PIDS_CGROUPS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v1's pids hierarchy, v2's root
WORK = "/sandbox"  # the program's folder inside the sandbox


class SandboxUnavailable(EngineError):
    """The machine cannot provide the boundary and the caller did not opt out of it."""


# ---- the process filter (classic BPF over seccomp_data: nr at 0, arch at 4, args[0] at 16) -------
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_ENOSYS = 0x00050000 | 38  # SECCOMP_RET_ERRNO with ENOSYS
_EPERM = 0x00050000 | 1
_CLONE_THREAD = 0x00010000
# The kernel's audit architecture and the process-creating calls of each architecture filtered
# (clone3 keeps its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone).
_ARCHES = {
    "x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "clone3": 435}, 56),
    "aarch64": (0xC00000B7, {"clone3": 435}, 220),
}
# Calls answered EPERM: ptrace, keyctl, add_key, request_key, io_uring_setup/enter/register,
# process_vm_readv/writev (a program has no use for them, and each reaches past its own process)
_DENIED = {
    "x86_64": (101, 250, 248, 249, 425, 426, 427, 310, 311),
    "aarch64": (117, 219, 217, 218, 425, 426, 427, 270, 271),
}
# what the sandbox's processes see of an environment: bwrap is started with it, and its
# `--clearenv` leaves the program the same (`--setenv` below)
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": WORK, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


@functools.cache
def process_filter() -> bytes | None:
    """The compiled seccomp program that kills a process starting another (threads are allowed),
    or None on an architecture this module has no syscall numbers for."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, refused, clone = arch
    # Each instruction: (op, where to go when true, when false, k); None goes on to the next one,
    # a name to one of the returns that close the program.
    returns = {"allow": _ALLOW, "enosys": _ENOSYS, "eperm": _EPERM, "kill": _KILL}
    code: list[tuple[int, str | None, str | None, int]] = [
        (_LD, None, None, 4),
        (_JEQ, None, "kill", audit_arch),  # another ABI (i386 on x86_64) has other numbers
        (_LD, None, None, 0),
        (_JGE, "kill", None, 0x40000000),  # x32 calls on x86_64
        *((_JEQ, "enosys" if name == "clone3" else "kill", None, nr) for name, nr in refused.items()),
        *((_JEQ, "eperm", None, nr) for nr in _DENIED[platform.machine()]),
        (_JEQ, None, "allow", clone),
        (_LD, None, None, 16),
        (_JSET, "allow", "kill", _CLONE_THREAD),
    ]
    where = {label: len(code) + i for i, label in enumerate(returns)}
    out = bytearray()
    for i, (op, true, false, k) in enumerate(code):
        hops = [0 if to is None else where[to] - i - 1 for to in (true, false)]  # BPF jumps are relative
        out += struct.pack("<HBBI", op, *hops, k)
    for value in returns.values():
        out += struct.pack("<HBBI", _RET, 0, 0, value)
    return bytes(out)


# ---- the sandbox's command -----------------------------------------------------------------------
def _read_only_roots() -> list[str]:
    """/usr and the interpreter's prefixes (a virtual environment's and its base's), outermost
    first, none inside another."""
    roots: list[str] = []
    for path in sorted({"/usr", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
        if not any(path == r or path.startswith(r + os.sep) for r in roots):
            roots.append(path)
    return roots


def _limits() -> list[str]:
    """The `prlimit` prefix that sets the resource limits for the command after it ([] without prlimit)."""
    prlimit = shutil.which("prlimit")
    return [prlimit, f"--as={MEMORY_LIMIT}", f"--fsize={FILE_LIMIT}", f"--nofile={OPEN_FILES}", "--core=0", "--"] if prlimit else []


def _command(filter_fd: int, program_fd: int, info_fd: int) -> list[str]:
    bwrap = shutil.which("bwrap")
    assert bwrap is not None  # checked by unavailable()
    mounts: list[str] = []
    # the writable folders first, so that an interpreter installed below /tmp is bound over them
    for folder in (WORK, "/tmp", "/dev/shm"):
        mounts += ["--size", str(FOLDER_LIMIT), "--tmpfs", folder]
    for root in _read_only_roots():
        mounts += ["--ro-bind", root, root]
    for link in ("bin", "lib", "lib64", "sbin"):  # merged /usr: /bin -> usr/bin
        if os.path.islink(f"/{link}"):
            mounts += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    return [
        *_limits(), bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
        "--proc", "/proc", "--dev", "/dev", *mounts, "--remount-ro", "/dev",
        "--ro-bind-data", str(program_fd), f"{WORK}/program.py", "--remount-ro", "/",
        "--seccomp", str(filter_fd), "--info-fd", str(info_fd),
        "--chdir", WORK, "--clearenv", *(arg for name, value in SANDBOX_ENV.items() for arg in ("--setenv", name, value)),
        # RLIMIT_NPROC set here, inside the namespace, is counted against the namespace's tasks only
        "--", shutil.which("prlimit"), f"--nproc={TASK_LIMIT}", "--", sys.executable, "-I", f"{WORK}/program.py",
    ]  # fmt: skip


def _memfd(data: bytes) -> int:
    """A descriptor that reads `data` from its start (bwrap reads its inputs from descriptors; a
    pipe would block on more than its buffer)."""
    fd = os.memfd_create("sandbox-input")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@contextlib.contextmanager
def _task_cgroup() -> Iterator[list[str]]:
    """A pids cgroup of TASK_LIMIT tasks for one run, as the command prefix that moves the run into
    it before bwrap starts ([] where no pids cgroup can be made: RLIMIT_NPROC alone bounds it);
    removed after the run (by then it is empty)."""
    folder = None
    for root in PIDS_CGROUPS:
        if os.path.isfile(f"{root}/cgroup.procs") and ("pids" in _controllers(root)):
            try:
                folder = tempfile.mkdtemp(prefix="dinfer-viz-sandbox-", dir=root)
                Path(folder, "pids.max").write_text(str(TASK_LIMIT))
                break
            except OSError:  # not ours to write (no delegation, a read-only cgroup filesystem)
                if folder is not None:
                    os.rmdir(folder)
                folder = None
    if folder is None:
        yield []
        return
    try:
        # the shell moves itself, then becomes the command: every task after it starts inside
        yield ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', folder]
    finally:
        _remove_cgroup(folder)


def _remove_cgroup(folder: str) -> None:
    """Remove the run's cgroup. Its tasks are all reaped by now, but the kernel releases them from
    the cgroup a moment later (rmdir says EBUSY until then): tried for up to CGROUP_RELEASE_S,
    then left (empty: it holds nothing and limits nothing)."""
    for _ in range(int(CGROUP_RELEASE_S / 0.01)):
        try:
            os.rmdir(folder)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return
            time.sleep(0.01)


def _controllers(root: str) -> str:
    """The controllers of the cgroup hierarchy at `root` (v2 lists them; a v1 pids hierarchy is one)."""
    if root.endswith("/pids"):
        return "pids"
    try:
        return Path(root, "cgroup.subtree_control").read_text()
    except OSError:
        return ""


def _run_boxed(program: str, timeout: float, stderr: IO[bytes] | int = subprocess.DEVNULL) -> int | None:
    """The exit status of `program` in the sandbox, or None when it ran past `timeout`."""
    seccomp = process_filter()
    assert seccomp is not None  # checked by unavailable()
    with _task_cgroup() as into_cgroup:
        filter_fd, program_fd = _memfd(seccomp), _memfd(program.encode())
        info_read, info_write = os.pipe()
        with os.fdopen(info_read, "rb") as info:
            try:
                process = subprocess.Popen(
                    [*into_cgroup, *_command(filter_fd, program_fd, info_write)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=SANDBOX_ENV,
                    pass_fds=(filter_fd, program_fd, info_write), start_new_session=True,
                )  # fmt: skip
            finally:
                for fd in (filter_fd, program_fd, info_write):
                    os.close(fd)
            # bwrap writes the sandbox's PID 1 once the namespaces exist, then closes the pipe (or dies)
            ready = select.select([info], [], [], timeout)[0]
            text = info.read() if ready else b""
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            # Killing the namespace's PID 1 kills all its processes, and bwrap (the monitor outside)
            # exits only once PID 1 is reaped, which happens only after they all are.
            os.kill(json.loads(text)["child-pid"], signal.SIGKILL)
        except (ValueError, KeyError, ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # not set up in time: its child dies with bwrap
        process.wait()
        return None


def _run_unboxed(program: str, timeout: float) -> int | None:
    """What `_run_boxed` does without a boundary, for a caller who opted in: a temporary folder,
    the resource limits where prlimit exists, its own process group killed at the timeout."""
    with tempfile.TemporaryDirectory(prefix="dinfer-viz-score-") as folder:
        path = Path(folder) / "program.py"
        path.write_text(program)
        process = subprocess.Popen(
            [*_limits(), sys.executable, "-I", str(path)], cwd=folder,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot run the sandbox, in one line, or None when it can (checked once:
    the tools, the filter, and one empty program run inside)."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if shutil.which("prlimit") is None:
        return "prlimit (util-linux) is not installed"
    if process_filter() is None:
        return f"no process filter for the {platform.machine()} architecture"
    with tempfile.TemporaryFile() as errors:
        status = _run_boxed("", 60.0, stderr=errors)
        errors.seek(0)
        lines = errors.read().decode(errors="replace").strip().splitlines()
    if status != 0:
        return f"bwrap cannot start a sandbox here ({lines[-1].strip() if lines else f'status {status}'})"
    return None


def run(program: str, timeout: float) -> int | None:
    """The exit status of the Python `program` run in the sandbox, or None when it ran past
    `timeout` seconds (it and every process it started are gone by then). Raises
    SandboxUnavailable where the machine has no sandbox, unless DINFER_VIZ_UNSANDBOXED_CODE=1."""
    reason = unavailable()
    if reason is None:
        return _run_boxed(program, timeout)
    if os.environ.get(UNSANDBOXED_ENV) == "1":
        return _run_unboxed(program, timeout)
    raise SandboxUnavailable(f"code scoring refused: {reason}; {UNSANDBOXED_ENV}=1 runs model-written code without a sandbox")
