"""One run of the kit at a time, and nothing of a run left behind: ``python -m scripts.runlock --name WHAT -- CMD``.

The Makefile runs every recipe that reads or writes the checkouts, the venvs or ``build/`` through this wrapper:

- **The lock**: ``fcntl.flock`` on ``build/run.lock`` (LOCK_EX | LOCK_NB). A second run stops at once with one
  line naming the first (its ``--name``, e.g. ``make gate``, and its pid, written into the file). The kernel drops
  a flock when its holder dies, so the lock of a killed run is free again without any clean-up.
- **Nothing left behind**: CMD runs as a child in the wrapper's process group with ``KIT_RUN=<wrapper pid>`` in its
  environment, which every process below it inherits, including launches in sessions of their own
  (``scripts/launch.py``). When CMD ends, or after Ctrl-C / SIGTERM / SIGHUP, every process that still carries that
  ``KIT_RUN`` value is sent SIGTERM, then SIGKILL after ``GRACE_S``. SIGTERM and SIGHUP to the wrapper (GNU make
  sends SIGTERM to its children only) are passed on to CMD as SIGTERM; Ctrl-C reaches CMD from the terminal itself.
  CMD then has ``CLEAN_UP_S`` seconds to end by itself before the sweep (a second signal: at once).
- **After an interrupt** the wrapper prints one line saying where each checkout is (``series.describe``).
- ``--say WHAT`` (pip installs, which are quiet for minutes): one line ``<name>: WHAT`` at the start, then one
  ``<name>: still WHAT (N s)`` every ``SAY_EVERY_S`` seconds until CMD ends.

A run started inside another (``KIT_RUN`` names an ancestor: the kit's own tests call ``make``, ``make matrix``
calls the gate) is already covered: the wrapper then simply executes CMD. Python code can take the same lock with
``with runlock.hold("make gate"):``. Exit status: CMD's (128 + N when a signal N ended it), 1 when the lock is held;
after an interrupt always 128 + the number of the first signal that came (130 for Ctrl-C), whatever CMD returned.
"""

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scripts import KitError, launch, plural, sources

# KIT_LOCK: another lock file (the kit's own tests use one of their own, so they run beside a real run).
LOCK_FILE = Path(os.environ.get("KIT_LOCK") or sources.KIT_ROOT / "build" / "run.lock")
ENV = "KIT_RUN"
GRACE_S = 3.0
# After Ctrl-C the command gets this long to end by itself (stop its launches, remove its trees, write what it has),
# on a loaded machine too; a second Ctrl-C cuts it short (issue 22: a bench killed after 6 s left no report).
CLEAN_UP_S = 30.0
SAY_EVERY_S = 30.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parent_of(pid: int) -> int:
    """The parent pid of ``pid`` from /proc (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2:].split()[1])


def inside_run() -> bool:
    """True when ``KIT_RUN`` names a live ancestor of this process: a run that already holds the lock."""
    try:
        holder = int(os.environ.get(ENV, ""))
    except ValueError:
        return False
    pid = os.getppid()
    while pid > 1:
        if pid == holder:
            return True
        pid = parent_of(pid)
    return False


@contextlib.contextmanager
def hold(name: str, path: Path | None = None):
    """Hold the kit's lock at ``path`` (default LOCK_FILE) while the block runs; a no-op inside a run holding it.

    ``name`` says what runs (``make gate``); it is written with the pid into the file for the next run's message.
    Raises KitError (one line: who holds it) when another run holds the lock.
    """
    if inside_run():
        yield
        return
    path = path or LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "pid unknown"
            raise KitError(f"another run of the kit is under way ({holder}): wait for it to end, or stop it, and run "
                           f"again") from None
        f.seek(0)
        f.truncate()
        f.write(f"{name}, pid {os.getpid()}\n")
        f.flush()
        yield


def run_processes(token: str) -> list[int]:
    """Pids of live processes (other than this one) whose environment holds ``KIT_RUN=<token>``."""
    return launch.environment_pids(ENV, token)


def sweep(token: str) -> int:
    """SIGTERM every process of the run ``token``, SIGKILL those alive after GRACE_S; return how many there were."""
    pids = run_processes(token)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        # until each is gone or a zombie: a process on its way out may no longer show its environment
        deadline = time.monotonic() + (GRACE_S if sig == signal.SIGTERM else launch.KILL_WAIT)
        while time.monotonic() < deadline and any(launch.running(pid) for pid in pids):
            time.sleep(0.1)
        if not any(launch.running(pid) for pid in pids):
            break
    return len(pids)


def describe_checkouts(checkouts: Path = sources.KIT_ROOT / "upstream", patches: Path = sources.KIT_ROOT / "patches",
                       pins: Path = sources.SOURCES_FILE) -> str:
    """One line: where each checkout under ``checkouts`` is (``series.describe``), or why that cannot be said."""
    from scripts import series  # here, so that the lock works even where git is missing

    try:
        return "; ".join(series.describe(checkouts / name, patches / name) for name in sources.names(pins))
    except KitError as e:
        return str(e)


@contextlib.contextmanager
def saying(name: str, what: str, every: float = SAY_EVERY_S):
    """Print ``<name>: what`` now and ``<name>: still what (N s)`` every ``every`` seconds while the block runs."""
    print(f"{name}: {what}", file=sys.stderr, flush=True)
    stop, started = threading.Event(), time.monotonic()

    def tick():
        while not stop.wait(every):
            print(f"{name}: still {what} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

    threading.Thread(target=tick, name="runlock-say", daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def run(name: str, command: list[str], say: str = "", say_every: float = SAY_EVERY_S) -> int:
    """Run ``command`` under the lock as described in the module docstring; return its exit status."""
    with hold(name), (saying(name, say, say_every) if say else contextlib.nullcontext()):
        token = str(os.getpid())
        started: list[subprocess.Popen] = []
        signalled: list[tuple[float, int]] = []  # when each signal came, and which

        def on_signal(signum, frame):
            signalled.append((time.monotonic(), signum))
            if signum != signal.SIGINT and started:  # Ctrl-C reached the command from the terminal already
                with contextlib.suppress(ProcessLookupError):
                    started[0].send_signal(signal.SIGTERM)

        previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}  # before the command starts
        try:
            proc = subprocess.Popen(command, env={**os.environ, ENV: token})
            started.append(proc)
            while proc.poll() is None:
                if signalled and (len(signalled) > 1 or time.monotonic() - signalled[0][0] > CLEAN_UP_S):
                    proc.send_signal(signal.SIGTERM)  # the command ignored the interrupt: the sweep ends it
                    break
                time.sleep(0.05)
        finally:
            left = sweep(token)
            for child in started:
                child.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if signalled:  # the command stopped its own processes; the sweep counts only those it left
            swept = f" ({plural(left, 'process', 'processes')} it left running stopped)" if left else ""
            print(f"{name}: interrupted; no process of the run is left{swept}; checkouts: {describe_checkouts()}",
                  file=sys.stderr)
            return 128 + signalled[0][1]  # the same status for the same signal, however the command ended
        if left:
            print(f"{name}: stopped {plural(left, 'process', 'processes')} left running", file=sys.stderr)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def interruptible(work: Callable[[], int], describe: Callable[[], str] = describe_checkouts) -> int:
    """Return ``work()``; Ctrl-C, SIGTERM and SIGHUP end it cleanly: exit status 130, no traceback.

    From the first such signal on, further ones are ignored (the clean-up of ``work``, e.g. ``git am --abort``,
    runs in peace), every process below this one gets SIGTERM (GNU make's SIGTERM reaches only its own child),
    and ``work`` gets a KeyboardInterrupt. Then one line says where the checkouts are (``describe()``), unless a
    wrapper of this module above says it.
    """

    def interrupt(signum, frame):
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        for pid in launch.descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, launch.in_this_process(interrupt)) for sig in SIGNALS}
    try:
        return work()
    except KeyboardInterrupt:
        if not inside_run():
            print(f"interrupted; checkouts: {describe()}", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--name WHAT -- CMD ...``; one ``error:`` line and exit 1 when the lock is held."""
    parser = argparse.ArgumentParser(prog="python -m scripts.runlock", description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="what runs, for the next run's message (e.g. 'make gate')")
    parser.add_argument("--say", default="", help="what CMD does: said at the start and every 30 s until it ends")
    parser.add_argument("--say-every", type=float, default=SAY_EVERY_S, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs="+", help="the command to run (after --)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if inside_run():
        os.execvp(args.command[0], args.command)
    try:
        return run(args.name, args.command, args.say, args.say_every)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
