"""The code scorer's sandbox (benchmarks/sandbox.py): hostile programs fail to reach the host, the
scorer refuses where the machine has no sandbox, and ordinary programs still pass.

Each hostile program exits 0 only if it reached outside; where it writes, the test also looks for
the write on the host. Targets are on this machine only (tmp_path, loopback, this process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from benchmarks import sandbox, scoring

# The tests of the sandbox's own mechanisms need it; the hostile programs are scored everywhere:
# contained where the sandbox runs, refused with the reason where it cannot.
boxed = pytest.mark.skipif(sandbox.unavailable() is not None, reason=f"no sandbox on this machine: {sandbox.unavailable()}")
TIMEOUT = 30.0  # generous: a hostile program's verdict comes from its own failure, not the clock
KILLED = 128 + signal.SIGSYS  # bwrap's status for a program the process filter killed


def _outside(tmp_path: Path) -> Path:
    return tmp_path / "escaped"


# Each: a program that, with {outside} a host path, exits 0 only if it got out.
ESCAPES = {
    # the probe's escapes of the audit-hook sandbox
    "rebinds the old sandbox's globals, then os.system": "_NO_PROCESSES = ()\nimport os\nassert os.system('touch {outside}') == 0",
    "reads /etc/shadow": "open('/etc/shadow').read()",
    "reads /etc/passwd": "open('/etc/passwd').read()",
    "writes outside through dir_fd": "import os\nd = os.open({parent!r}, os.O_RDONLY)\nos.close(os.open('escaped', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
    "starts a process with _posixsubprocess": (
        "import _posixsubprocess, os\nr, w = os.pipe()\n"
        "pid = _posixsubprocess.fork_exec([b'/usr/bin/touch', {outside_b!r}], [b'/usr/bin/touch'], True, (), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, -1, -1, None, True)\n"
        "os.waitpid(pid, 0)"
    ),
    "subprocess.run": "import subprocess\nsubprocess.run(['touch', {outside!r}], check=True)",
    "os.posix_spawn": "import os\nos.waitpid(os.posix_spawn('/usr/bin/touch', ['touch', {outside!r}], {{}}), 0)",
    "forks a grandchild that outlives its parent": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1)\n    open({outside!r}, 'w')",
    "a fork bomb": "import os\nfor _ in range(10):\n    os.fork()",
    "ctypes fork": "import ctypes\nassert ctypes.CDLL(None).fork() >= 0",
    "a raw clone syscall": "import ctypes, platform\nassert ctypes.CDLL(None).syscall({{'x86_64': 56, 'aarch64': 220}}[platform.machine()], 17, 0, 0, 0, 0) >= 0",
    "a new user namespace": "import ctypes\nassert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0",
    "mounts the host's root": "import ctypes\nassert ctypes.CDLL(None).mount(b'/', b'/tmp', None, 4096, None) == 0",
    "writes a host path": "open({outside!r}, 'w').write('x')",
    "writes through a symlink": "import os\nos.symlink({outside!r}, 'link')\nopen('link', 'w').write('x')",
    "renames its program out": "import os\nos.rename('program.py', {outside!r})",
    "execs a shell to write": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo x > {outside}'])",
    "writes the interpreter's files": "import os\nopen(os.__file__, 'a').write('#')",
    "writes /usr": "open('/usr/escaped', 'w')",
    "writes the sandbox's root": "open('/escaped', 'w')",
    "reads this repository": f"open({str(Path(__file__).resolve())!r}).read()",
    "reads the host's root through /proc/1/root": "open('/proc/1/root/etc/passwd').read()",
    "lists the host's processes": f"import os\nassert os.path.exists('/proc/{os.getpid()}')",
    "reads /sys": "import os\nassert os.listdir('/sys')",
    "connects to the loopback": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)",
    "connects to a host Unix socket by path": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({unix_path!r})",
    "connects to a host abstract Unix socket": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({abstract!r})",
    "finds a descriptor left open": "import os\nassert any(os.path.exists(f'/proc/self/fd/{{fd}}') for fd in range(3, 1024))",
    "reads the host's environment": "import os\nassert os.environ.get('DINFER_VIZ_SANDBOX_SECRET')",
    "allocates 3 GiB": "b'x' * (3 << 30)",
    "fills its folder": "open('big', 'wb').write(b'x' * (200 << 20))",
    "fills /dev/shm": "open('/dev/shm/big', 'wb').write(b'x' * (200 << 20))",
    "fills /tmp with many files": "for i in range(100):\n    open(f'/tmp/{{i}}', 'wb').write(b'x' * (2 << 20))",
    "opens 10,000 files": "fs = [open('/dev/null') for _ in range(10_000)]",
}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """What a hostile program could reach on the host: a loopback listener, a Unix socket by path
    and an abstract one, an environment variable; closed afterwards."""
    monkeypatch.setenv("DINFER_VIZ_SANDBOX_SECRET", "hunter2")
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "host.sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0dinfer-viz-sandbox-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    listeners = (tcp, unix, abstract)
    for s in (unix, abstract):
        s.listen()
    for s in listeners:
        s.setblocking(False)
    places = {
        "outside": str(_outside(tmp_path)), "outside_b": str(_outside(tmp_path)).encode(), "parent": str(tmp_path),
        "port": tcp.getsockname()[1], "unix_path": str(tmp_path / "host.sock"), "abstract": abstract_name,
    }  # fmt: skip
    yield places, listeners
    for s in listeners:
        s.close()


def passes(program: str) -> bool:
    """The scorer's verdict; where the machine has no sandbox, the refusal (and so False)."""
    if sandbox.unavailable() is None:
        return scoring.run_python(program, timeout=TIMEOUT)
    with pytest.raises(sandbox.SandboxUnavailable, match="code scoring refused"):
        scoring.run_python(program, timeout=TIMEOUT)
    return False


@pytest.mark.parametrize("name", ESCAPES)
def test_hostile_program_stays_inside(name, host, tmp_path):
    places, listeners = host
    assert passes(ESCAPES[name].format(**places)) is False
    assert not _outside(tmp_path).exists()
    for listener in listeners:  # nothing connected: accept() finds no one waiting
        with pytest.raises(BlockingIOError):
            listener.accept()


# The escapes that are harmless on the host, run there without the sandbox: each does reach
# outside, so the test above fails only because of the sandbox (not because a program is broken).
HARMLESS_ON_THE_HOST = [
    "rebinds the old sandbox's globals, then os.system", "reads /etc/passwd", "writes outside through dir_fd",
    "starts a process with _posixsubprocess", "subprocess.run", "os.posix_spawn", "ctypes fork",
    "a new user namespace", "writes a host path", "writes through a symlink", "renames its program out",
    "execs a shell to write", "reads this repository", "lists the host's processes", "reads /sys",
    "connects to the loopback", "connects to a host Unix socket by path", "connects to a host abstract Unix socket",
    "reads the host's environment",
]  # fmt: skip


@pytest.mark.parametrize("name", HARMLESS_ON_THE_HOST)
def test_without_the_sandbox_the_same_program_reaches_outside(name, host, tmp_path):
    places, _ = host
    assert sandbox._run_unboxed(ESCAPES[name].format(**places), TIMEOUT) == 0


@boxed
def test_process_starts_are_killed_by_the_filter():
    assert sandbox.run("import os\nos.fork()", TIMEOUT) == KILLED
    assert sandbox.run("import subprocess\nsubprocess.run(['true'])", TIMEOUT) == KILLED


@boxed
def test_memory_and_folder_limits_are_what_stops_the_hogs():
    assert sandbox.run("try:\n    b'x' * (3 << 30)\nexcept MemoryError:\n    raise SystemExit(7)", TIMEOUT) == 7
    fill = "try:\n    open({!r}, 'wb').write(b'x' * (100 << 20))\nexcept OSError:\n    raise SystemExit(7)"
    for path in ("big", "/tmp/big", "/dev/shm/big"):
        assert sandbox.run(fill.format(path), TIMEOUT) in (7, 128 + signal.SIGXFSZ)


def _threads(count: int) -> str:
    """A program starting `count` threads of small stacks (so the address-space limit does not stop
    them): exit 3 when one cannot start."""
    return (
        "import sys, threading\nthreading.stack_size(65536)\nhold = threading.Event()\n"
        f"try:\n    for _ in range({count}):\n        threading.Thread(target=hold.wait).start()\n"
        "except RuntimeError:\n    hold.set()\n    sys.exit(3)\nhold.set()\n"
    )


@boxed
def test_three_thousand_threads_fail_and_a_pool_of_threads_passes():
    """#43 item 3: the task limit (the sandbox's own pids cgroup, or RLIMIT_NPROC counted in its
    user namespace) stops 3,000 threads, leaves no cgroup behind, and lets a program use a pool."""
    assert sandbox.run(_threads(3000), TIMEOUT) == 3
    assert sandbox.run(_threads(32), TIMEOUT) == 0
    assert scoring.run_python("from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor(16) as pool:\n    assert sum(pool.map(abs, range(-50, 50))) == 2500", timeout=TIMEOUT)
    assert not [p for root in sandbox.PIDS_CGROUPS if os.path.isdir(root) for p in os.listdir(root) if p.startswith("dinfer-viz-sandbox-")]


@boxed
def test_the_task_limit_is_set_inside_the_namespace():
    """RLIMIT_NPROC is the program's own (set by prlimit inside the sandbox, so the kernel counts the
    namespace's tasks, not every process of the caller's uid, of which this machine may have more)."""
    program = f"limits = open('/proc/self/limits').read()\nassert any(l.startswith('Max processes') and l.split()[2:4] == ['{sandbox.TASK_LIMIT}'] * 2 for l in limits.splitlines()), limits"
    assert sandbox.run(program, TIMEOUT) == 0


@boxed
def test_a_signal_cannot_reach_a_host_process():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert scoring.run_python(f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)", timeout=TIMEOUT) is False
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # gone while we looked
    return found


@boxed
def test_at_the_timeout_every_process_of_the_sandbox_is_gone():
    """A program that became another program (in its own session: bwrap's --new-session) is
    killed, and is gone by the time run returns (None: it was still running, as sleep)."""
    marker = f"{uuid.uuid4().int % 10**6}.25"
    program = f"import os\nos.execv('/usr/bin/sleep', ['sleep', '{marker}'])"
    assert sandbox.run(program, timeout=1.0) is None
    assert _processes_with(marker) == []


@boxed
def test_every_run_has_its_own_private_folders():
    assert scoring.run_python("open('/tmp/left', 'w').write('x')\nopen('left', 'w').write('x')", timeout=TIMEOUT)
    assert scoring.run_python("import os\nassert not os.path.exists('/tmp/left') and not os.path.exists('left')", timeout=TIMEOUT)


@boxed
def test_ordinary_programs_pass_and_wrong_ones_fail():
    ordinary = (
        "import collections, heapq, itertools, json, math, re, threading, time, unittest\n"
        "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
        "t = threading.Thread(target=math.factorial, args=(200,)); t.start(); t.join()\n"
        "assert math.gcd(12, 18) == 6 and sorted({3, 1, 2}) == [1, 2, 3]\n"
    )
    assert scoring.run_python(ordinary, timeout=TIMEOUT) is True
    assert scoring.run_python("assert sum([1, 2]) == 4", timeout=TIMEOUT) is False
    assert sandbox.run("raise SystemExit(3)", TIMEOUT) == 3


def test_without_a_sandbox_the_scorer_refuses_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bubblewrap is not installed (apt-get install bubblewrap)")
    monkeypatch.delenv(sandbox.UNSANDBOXED_ENV, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        scoring.run_python("pass")
    message = str(refused.value)
    assert "\n" not in message and "bubblewrap is not installed" in message and sandbox.UNSANDBOXED_ENV in message
    monkeypatch.setenv(sandbox.UNSANDBOXED_ENV, "1")  # the explicit opt-in runs it unsandboxed
    assert scoring.run_python("pass", timeout=TIMEOUT) is True
    assert scoring.run_python("while True:\n    pass", timeout=1.0) is False


def test_a_machine_whose_kernel_refuses_the_namespaces_is_found_out(tmp_path, monkeypatch):
    """The probe runs one empty program: a bwrap that cannot start (here a stand-in saying what a
    kernel without unprivileged user namespaces says) gives the reason in one line."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    reason = sandbox.unavailable.__wrapped__()
    assert reason == "bwrap cannot start a sandbox here (bwrap: No permissions to create new namespace)"
