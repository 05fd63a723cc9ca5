"""Run a multi-process launch (``torch.distributed.run`` and the like) with a timeout, leaving nothing running.

Used by the multi-process launches of the kit: the 2-process suites under ``tests/``, ``make bench``, ``make stress``
and the gate (its stages and the upstream scripts it launches); the job servers (``scripts/servers.py``) use its
``kill_tree``, ``site_env`` and ``die_with_parent``. A launch runs in a session of its own; on timeout, on
a normal exit, on Ctrl-C and on SIGTERM, the launch's process group and every process below it
(``torch.distributed.run`` starts each rank in a session of its own, and the ranks start DataLoader workers) are
killed before ``run`` returns or the interrupt propagates.

A hang explains itself (issue 12): every Python process of a launch loads ``launch_site/sitecustomize.py`` (its
directory is put first on ``PYTHONPATH``), which makes SIGUSR1 dump the stacks of all its threads to its standard
error. Before killing a launch that timed out, ``run`` sends SIGUSR1 to each process of it that catches the signal,
one at a time, each after a header line naming the process, so the launch log ends with every rank's and every
worker's stacks.
"""

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SITE = Path(__file__).resolve().with_name("launch_site")  # holds the sitecustomize.py described above
DUMP_WAIT = 2.0  # seconds a process gets to write its stacks after SIGUSR1
POLL = 0.05  # seconds between two looks at the running launches
KILL_WAIT = 10.0  # seconds kill_tree waits for the killed processes to end
# The C library as loaded into this process: dlopen(NULL). `ctypes.util.find_library` would run ldconfig in a child
# process at every import, which a Ctrl-C to the process group can catch half-way.
_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """In the child, between fork and exec: SIGKILL it when the thread that started it dies, so that a launcher
    killed by SIGKILL (which it cannot catch) leaves no launch behind (its descendants below go with their own
    parents where they were started the same way, or fail at their next collective)."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Pids of every live process below ``pid`` (children first), read from /proc; [] when there are none."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        below = children.get(queue.pop(0), [])
        found += below
        queue += below
    return found


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (read from /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session``) and every process below it, and
    wait until each is gone or a zombie (at most KILL_WAIT seconds: SIGKILL is delivered asynchronously, and a busy
    machine can take a moment to end a process in its own session, the ranks of ``torch.distributed.run``).

    The descendants are collected before anything is killed, while they are still linked to ``proc``.
    """
    below = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + KILL_WAIT
    while any(running(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(POLL)


def environment_pids(name: str, value: str, prefix: bool = False) -> list[int]:
    """Pids of the live processes of this user (other than this one) whose environment variable ``name`` equals
    ``value`` (or, with ``prefix``, starts with it): a run's processes, whatever session they started in, found by
    a variable they all inherited."""
    wanted, found = f"{name}={value}".encode(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            variables = Path(entry.path, "environ").read_bytes().split(b"\0")
            if any(var.startswith(wanted) if prefix else var == wanted for var in variables):
                found.append(int(entry.name))
    return found


def kill_by_environment(name: str, prefix: str) -> list[int]:
    """SIGKILL every process whose environment variable ``name`` starts with ``prefix``; return their pids. For what a
    run killed by SIGKILL left behind: processes it started in sessions of their own that did not die with their
    parents (the ranks of ``torch.distributed.run``)."""
    killed = []
    for pid in environment_pids(name, prefix, prefix=True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def catches(pid: int, signum: int) -> bool:
    """True when process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask in /proc/<pid>/status)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path(f"/proc/{pid}/status").read_text()
        mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(mask, 16) >> (signum - 1) & 1)
    return False


def command_line(pid: int) -> str:
    """The command line of ``pid`` (at most 200 characters; '' when it is gone)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return ""


def dump_stacks(proc: subprocess.Popen, out, log: Path) -> int:
    """Make every process of the launch ``proc`` that catches SIGUSR1 write its stacks into ``log``; return how many.

    ``out`` is the launch's log file, open for appending. One process at a time: a header line, SIGUSR1, then wait
    until the log stops growing (at most DUMP_WAIT seconds), so that the dumps do not interleave. Order: the launched
    process, then its descendants deepest first, so that the ranks of a ``torch.distributed.run`` launch come last,
    where a test that prints the end of the log shows them.
    """
    dumped = 0
    # The launcher first, then the deepest processes (DataLoader workers), the ranks last: a log's tail shows them.
    for pid in [proc.pid, *reversed(descendants(proc.pid))]:
        if not catches(pid, signal.SIGUSR1):
            continue
        out.write(f"\n--- kit: stacks of pid {pid}: {command_line(pid)} ---\n".encode())
        out.flush()
        size = log.stat().st_size
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
            dumped += 1
        deadline, grew = time.monotonic() + DUMP_WAIT, False
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = log.stat().st_size
            if now == size and grew:
                break
            grew, size = grew or now > size, now
    return dumped


def in_this_process(handler: Callable[[int, object], None]) -> Callable[[int, object], None]:
    """``handler`` for ``signal.signal`` made to act only in the process that installs it. A child that
    ``subprocess`` forks with a ``preexec_fn`` runs Python with its parent's handlers until it execs; a Ctrl-C to the
    process group in that moment would raise KeyboardInterrupt there (a traceback on the user's terminal) or leave
    the signals ignored in the command it then execs. In such a child the handler does nothing; the parent, which
    gets the same signal, stops the command."""
    owner = os.getpid()

    def guarded(signum, frame):
        if os.getpid() == owner:
            handler(signum, frame)

    return guarded


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the launch runs, SIGTERM (and SIGHUP) to this process act as Ctrl-C, so the ``finally`` that kills the
    launch runs; the launch is in a session of its own, so a signal to our process group does not reach it.
    Only in the main thread (where Python runs signal handlers); elsewhere a no-op."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, in_this_process(interrupt)) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Launch:
    """A finished launch: exit status (None when it timed out), wall time in seconds, its log (stdout + stderr),
    how many of its processes wrote their stacks into the log before it was killed on timeout, and its CPU time in
    seconds (user + system, of the launched process and of every descendant reaped below it; None if it timed out)."""

    returncode: int | None
    seconds: float
    log: Path
    stacks: int = 0
    cpu_s: float | None = None

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of the log ("(no output)" when it is empty or missing)."""
        text = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return text[-chars:] if text else "(no output)"


@dataclass
class Job:
    """One command for ``run_all``: as the arguments of ``run``."""

    command: list[str]
    log: Path
    timeout: float
    cwd: Path | None = None
    env: dict | None = None
    started: float = field(default=0.0, repr=False)


def site_env(env: dict | None) -> dict:
    """``env`` (default: this process's environment) with SITE first on PYTHONPATH (once)."""
    env = dict(os.environ if env is None else env)
    paths = [str(SITE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run(command: list[str], log: Path, timeout: float, cwd: Path | None = None, env: dict | None = None) -> Launch:
    """Run ``command`` in a new session, stdout and stderr both into ``log``; ``timeout`` in seconds.

    ``env`` defaults to this process's environment; SITE is put first on its PYTHONPATH either way. Returns a
    ``Launch``; ``returncode`` is None when the timeout expired, after the stacks of the launch's Python processes
    were written into ``log``. The whole process tree is killed before returning, and before a KeyboardInterrupt
    (Ctrl-C, or SIGTERM/SIGHUP while it runs) propagates. Never raises for the command's own failure; raises
    OSError when ``log`` cannot be written or the command cannot start.
    """
    return run_all([Job(command, log, timeout, cwd, env)], parallel=1)[0]


def reap(proc: subprocess.Popen, timeout: float = 0.0) -> float | None:
    """Wait up to ``timeout`` seconds for ``proc`` to end (through a pidfd, no polling); once it has, reap it with
    ``os.wait4`` (setting ``proc.returncode``) and return its CPU seconds, user + system, its own and those of the
    descendants it reaped; None while it runs."""
    if timeout > 0:
        fd = os.pidfd_open(proc.pid)
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    return round(usage.ru_utime + usage.ru_stime, 2)


def run_all(jobs: list[Job], parallel: int) -> list[Launch]:
    """Run ``jobs``, at most ``parallel`` at once, in list order; return their Launches in the same order.

    Each job behaves as ``run`` describes (its own session, log, timeout with stack dumps). Ctrl-C or SIGTERM kills
    every running job's tree before the interrupt propagates.
    """
    results: list[Launch | None] = [None] * len(jobs)
    pending, running = list(range(len(jobs))), {}
    with sigterm_as_interrupt():
        try:
            while pending or running:
                while pending and len(running) < max(parallel, 1):
                    index = pending.pop(0)
                    job = jobs[index]
                    job.log.parent.mkdir(parents=True, exist_ok=True)
                    job.log.write_bytes(b"")
                    out = open(job.log, "ab")  # appending: the stack-dump headers land after the output so far
                    job.started = time.monotonic()
                    try:
                        proc = subprocess.Popen(job.command, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=job.cwd, env=site_env(job.env),
                                                start_new_session=True, preexec_fn=die_with_parent)
                    except BaseException:
                        out.close()
                        raise
                    running[index] = (proc, out)
                wait = 0.0
                if len(running) == 1 and not pending:  # one job left: wait for it without polling
                    index = next(iter(running))
                    wait = max(jobs[index].timeout - (time.monotonic() - jobs[index].started), 0)
                else:
                    time.sleep(POLL)
                for index, (proc, out) in list(running.items()):
                    job = jobs[index]
                    cpu_s = reap(proc, wait)
                    seconds = time.monotonic() - job.started
                    if cpu_s is None and seconds < job.timeout:
                        continue
                    stacks = dump_stacks(proc, out, job.log) if cpu_s is None else 0
                    kill_tree(proc)
                    out.close()
                    del running[index]
                    results[index] = Launch(proc.returncode if cpu_s is not None else None, round(seconds, 1), job.log,
                                            stacks, cpu_s)
        finally:
            for proc, out in running.values():
                kill_tree(proc)
                out.close()
    return results
