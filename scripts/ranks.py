"""``python scripts/ranks.py N script [args]``: run ``script`` as N ranks of one job on this machine, without
``torch.distributed.run``'s agent (run as a file: the ranks' ``PYTHONPATH`` need not hold the kit).

The flow table's and the history search's job servers (``scripts/servers.py``) need what the agent gives a rank
(issue 52): the environment of ``env://`` initialization (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: the variables torch's launcher documents) and
an end for every rank when one fails (a peer would wait in its next collective). The agent imports torch to give
that, 1.7 s of CPU a launch; this launcher needs the standard library only.

With ``JOB_PRELOAD`` (module names, comma-separated) it imports those modules once and forks the ranks from itself,
each running ``script`` as ``__main__`` (``runpy``), as a process started by ``python script`` would, so that N
ranks pay the imports once, not N times (torch and an upstream: about 2 s of CPU each). It forks only while it runs
one thread (a fork copies no other thread, and a lock one held would stay held); otherwise, and without
``JOB_PRELOAD``, each rank is a new ``python script``.

A rank that exits with a non-zero status ends the others (SIGTERM, SIGKILL after ``GRACE`` seconds) and the launcher
exits with that status; SIGTERM or SIGINT to the launcher ends every rank. ``MASTER_PORT`` is a port the kernel chose
free now (``free_port``), as the kit's one-process launches use.

With ``JOB_RESPAWN`` (a file descriptor number) a launcher that forks its ranks does not exit after such an end: it
writes ``ended <status>`` and a newline to that descriptor and reads a line from its standard input, ``respawn
<prefix>`` to fork N new ranks (``JOB_PREFIX`` = ``<prefix>`` and a new ``MASTER_PORT`` in their environment), or
anything else or the end of the input to exit with the status. A job server (``scripts/servers.py``) so starts its
ranks again after one crashed without importing torch and the upstream again (3.5 s of CPU for DeepSpeed, issue 52).
A launcher that cannot fork exits as without it.
"""

import importlib
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import traceback

GRACE = 5.0  # seconds the other ranks get to end after SIGTERM
POLL = 0.05  # seconds between two looks at the ranks


def free_port() -> int:
    """A TCP port of the loopback interface that is free now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    """The variables of ``rank`` of ``world`` ranks on this machine, the rendezvous at 127.0.0.1:``port``."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


class Forked:
    """A rank forked from this process, with ``subprocess.Popen``'s ``poll``, ``terminate``, ``kill`` and ``wait``."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def _signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _end(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + GRACE
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(POLL)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _preloaded(names: list[str]) -> bool:
    """Import ``names``; True when this process still runs one thread (it may fork), else False."""
    for name in names:
        importlib.import_module(name)
    return len(os.listdir("/proc/self/task")) == 1


def _run_script(script: str, args: list[str]) -> int:
    """In a forked rank: run ``script`` as ``__main__`` with ``args``; its exit status."""
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _die_with_parent() -> None:
    """In a forked rank: SIGKILL it when the launcher dies (Linux's ``PR_SET_PDEATHSIG``), as ``scripts/launch.py``
    does for the launches it starts; a launcher killed by SIGKILL leaves no rank behind."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _start(world: int, script: str, args: list[str], fork: bool, procs: list, status_fd: int) -> int | None:
    """Start ``world`` ranks into ``procs``, their rendezvous on a port free now; in a forked rank, return its exit
    status (it ran the script), else None. A forked rank holds neither ``status_fd`` nor the launcher's input."""
    port = free_port()  # after the imports: the shortest time for another process to take it
    ending = {signal.SIGTERM, signal.SIGINT}
    for rank in range(world):
        env = rank_env(rank, world, port)
        if not fork:
            procs.append(subprocess.Popen([sys.executable, script, *args], env={**os.environ, **env},
                                          stdin=subprocess.DEVNULL))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, ending)  # no stop() between the fork and the rank's own handlers
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, ending)
            if status_fd >= 0:
                os.close(status_fd)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
            os.environ.update(env)
            return _run_script(script, args)
        procs.append(Forked(pid))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ending)
    return None


def _watch(procs: list) -> int:
    """Wait until every rank exited 0 (return 0) or one failed (end the others, return its status)."""
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [code for code in codes if code]
        if failed:
            _end(procs)
            return failed[0] if failed[0] > 0 else 128 - failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL)


def _respawn(status_fd: int, code: int) -> str | None:
    """Say on ``status_fd`` that the ranks ended with ``code``; the prefix of the ranks to start again, read from
    standard input, or None (exit)."""
    os.write(status_fd, f"ended {code}\n".encode())
    word, _, prefix = sys.stdin.readline().strip().partition(" ")
    return prefix if word == "respawn" and prefix else None


def main(argv: list[str]) -> int:
    """Run the ranks; return the first non-zero exit status of a rank (a signal's: 128 + its number), else 0 (in a
    forked rank: the rank's own exit status)."""
    if len(argv) < 2 or not argv[0].isdigit() or int(argv[0]) < 1:
        print("error: scripts/ranks.py: usage: python scripts/ranks.py N script [args]", file=sys.stderr)
        return 2
    world, script, args = int(argv[0]), argv[1], argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as for `python script`, not this file's folder
    preload = [name for name in os.environ.get("JOB_PRELOAD", "").split(",") if name]
    fork = bool(preload) and _preloaded(preload)
    status_fd = int(os.environ.pop("JOB_RESPAWN", "-1"))
    procs: list = []

    def stop(signum, frame):
        _end(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        rank_code = _start(world, script, args, fork, procs, status_fd)
        if rank_code is not None:
            return rank_code
        code = _watch(procs)
        procs.clear()
        prefix = _respawn(status_fd, code) if code and fork and status_fd >= 0 else None
        if prefix is None:
            return code
        os.environ["JOB_PREFIX"] = prefix


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
