"""Run a multi-process launch (``torch.distributed.run`` and the like) with a timeout, leaving nothing running.

Used by every multi-process launch of the kit: the 2-process suites under ``tests/``, ``make bench`` and the gate.
A launch runs in a session of its own; on timeout, on a normal exit, on Ctrl-C and on SIGTERM, the launch's process
group and every process below it (``torch.distributed.run`` starts each rank in a session of its own, and the ranks
start DataLoader workers) are killed before ``run`` returns or the interrupt propagates.
"""

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


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


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session``) and every process below it.

    The descendants are collected before anything is killed, while they are still linked to ``proc``.
    """
    below = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the launch runs, SIGTERM (and SIGHUP) to this process act as Ctrl-C, so the ``finally`` that kills the
    launch runs; the launch is in a session of its own, so a signal to our process group does not reach it."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Launch:
    """A finished launch: exit status (None when it timed out), wall time in seconds, its log (stdout + stderr)."""

    returncode: int | None
    seconds: float
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of the log ("(no output)" when it is empty or missing)."""
        text = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return text[-chars:] if text else "(no output)"


def run(command: list[str], log: Path, timeout: float, cwd: Path | None = None, env: dict | None = None) -> Launch:
    """Run ``command`` in a new session, stdout and stderr both into ``log``; ``timeout`` in seconds.

    Returns a ``Launch``; ``returncode`` is None when the timeout expired. The whole process tree is killed before
    returning, and before a KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP while it runs) propagates. Never raises
    for the command's own failure; raises OSError when ``log`` cannot be written or the command cannot start.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "wb") as out, sigterm_as_interrupt():
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=env, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            seconds = time.monotonic() - started
            kill_tree(proc)
    return Launch(returncode, round(seconds, 1), log)
