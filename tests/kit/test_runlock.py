"""One run at a time, nothing left behind (scripts/runlock.py), and the Makefile's preconditions (issue 14).

Each test fails when the guarantee it names is removed: the lock, the message naming the first run, the take-over
of a killed run's lock, the sweep of processes that left the run's process tree, the state line after an
interrupt, the check for .venv before .tools is built.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts import launch, runlock
from scripts.sources import KIT_ROOT


def wrapper(tmp_path, name: str, *command: str, **popen) -> subprocess.Popen:
    """Start ``python -m scripts.runlock`` outside any run of the kit, with its lock file in ``tmp_path``."""
    return subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", name, "--", *command], cwd=KIT_ROOT,
                            env=outside_run(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def outside_run(tmp_path) -> dict:
    """The environment of a command started by hand: no KIT_RUN, and a lock file of its own (KIT_LOCK)."""
    return {**{k: v for k, v in os.environ.items() if k != runlock.ENV}, "KIT_LOCK": str(tmp_path / "run.lock")}


def wait_for(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read().lower()
    except OSError:
        return False


def interrupt(proc: subprocess.Popen, sig: int, to_group: bool) -> tuple[list[int], str]:
    """Send ``sig`` to ``proc``'s group (a terminal's Ctrl-C) or to ``proc`` alone (GNU make's SIGTERM); return the
    processes that were below it and still live 1 s after it ended, and its stderr."""
    below = launch.descendants(proc.pid)
    assert below, "the command runs children"
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    time.sleep(1)
    return [pid for pid in below if alive(pid)], err


def test_second_run_stops_with_one_line_naming_the_first(tmp_path):
    first = wrapper(tmp_path, "make gate", "sleep", "30")
    wait_for(lambda: "make gate" in (tmp_path / "run.lock").read_text() if (tmp_path / "run.lock").exists() else 0)
    second = wrapper(tmp_path, "make apply", "true")
    _, err = second.communicate(timeout=20)
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=20)
    assert second.returncode == 1
    assert err == (f"error: another run of the kit is under way (make gate, pid {first.pid}): wait for it to end, "
                   f"or stop it, and run again\n")


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    first = wrapper(tmp_path, "make gate", "sleep", "30", start_new_session=True)
    wait_for(lambda: (tmp_path / "run.lock").exists() and "make gate" in (tmp_path / "run.lock").read_text())
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=20)
    second = wrapper(tmp_path, "make apply", "true")
    out, err = second.communicate(timeout=20)
    assert second.returncode == 0, err


def test_processes_that_left_the_tree_are_stopped_when_the_run_ends(tmp_path):
    """A process in a session of its own, its parent gone (as a rank of torch.distributed.run after a crash)."""
    pidfile = tmp_path / "pid"
    script = f"setsid sleep 60 >/dev/null 2>&1 & echo $! > {pidfile}"
    run = wrapper(tmp_path, "make stress", "sh", "-c", script)
    _, err = run.communicate(timeout=30)
    orphan = int(pidfile.read_text())
    assert run.returncode == 0
    assert not alive(orphan)
    assert err == "make stress: stopped 1 process left running\n"


@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)],
                         ids=["ctrl-c-to-the-group", "sigterm-as-make-sends-it", "sighup"])
def test_interrupt_leaves_nothing_and_says_where_the_checkouts_are(tmp_path, sig, to_group):
    """A command with a launch in its own session (scripts/launch.py's way) is interrupted; nothing runs after."""
    code = ("import sys; from pathlib import Path; from scripts import launch, runlock; "
            f"sys.exit(runlock.interruptible(lambda: launch.run(['sleep', '60'], Path({str(tmp_path / 'l.log')!r}), "
            "120).returncode))")
    run = wrapper(tmp_path, "make gate", sys.executable, "-c", code, start_new_session=True)
    wait_for(lambda: any(launch.command_line(pid) == "sleep 60" for pid in launch.descendants(run.pid)))
    left, err = interrupt(run, sig, to_group)
    assert left == []
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("make gate: interrupted; ") and "; checkouts: " in err.splitlines()[-1]


def test_interruptible_stops_its_children_and_returns_130(capsys, monkeypatch):
    monkeypatch.delenv(runlock.ENV, raising=False)
    children = []

    def work() -> int:
        children.append(subprocess.Popen(["sleep", "60"]))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        return 0

    assert runlock.interruptible(work, lambda: "tiny 1.0 on series/1.0") == 130
    assert children[0].wait(timeout=5) == -signal.SIGTERM
    assert capsys.readouterr().err == "interrupted; checkouts: tiny 1.0 on series/1.0\n"


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("target", ["test", "matrix", "gate", "stress", "bench"])
def test_targets_that_need_the_venv_refuse_before_building_anything(tmp_path, target):
    """Issue 14, item 5: in a clone without .venv, `make test` used to build .tools (88 MB) first."""
    tools = [f"TOOLS={tmp_path / 'tools'}"] if target == "test" else []  # the others do not read TOOLS
    result = make(target, f"VENV={tmp_path / 'no-venv'}", *tools)
    assert result.returncode != 0
    assert result.stderr.splitlines()[0] == f"error: {tmp_path / 'no-venv'} does not exist: run make apply first"
    assert list(tmp_path.iterdir()) == []


def test_unapply_reinstalls_what_it_switched():
    """Issue 14, item 6: `make unapply` may switch a checkout's version; the venv's metadata follows it."""
    lines = make("-n", "unapply").stdout
    assert "scripts.upstream unapply" in lines and "scripts.upstream install" in lines
    assert lines.index("scripts.upstream unapply") < lines.index("scripts.upstream install")


def test_interrupt_probe_counts_what_a_run_leaves_and_the_wrapper_leaves_nothing(tmp_path):
    """scripts/interrupt_probe.py, the measurement of issue 14: a bare command leaves its orphan, the wrapper not."""
    env = outside_run(tmp_path)
    orphaning = ["sh", "-c", "setsid sleep 30 & sleep 3"]
    probe = [sys.executable, "-m", "scripts.interrupt_probe", "--points=1", "--duration=2", "--grace=1",
             f"--out={tmp_path / 'probe'}", "--"]
    bare = subprocess.run([*probe, *orphaning], cwd=KIT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 1 and "1 process" in bare.stdout.splitlines()[-1], bare.stdout
    wrapped = subprocess.run([*probe, sys.executable, "-m", "scripts.runlock", "--name=x", "--", *orphaning],
                             cwd=KIT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert wrapped.returncode == 0 and "0 processes left in total" in wrapped.stdout, wrapped.stdout


def test_sigterm_to_make_reaches_the_run(tmp_path):
    """GNU make sends SIGTERM to its child only, the recipe's shell; the shell must not leave the command behind."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 60\n")
    (venv / "bin" / "python").chmod(0o755)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / ".kit-tools").touch()  # newer than requirements/tools.txt: .tools counts as made
    run = subprocess.Popen(["make", "--no-print-directory", "-C", str(KIT_ROOT), "test", f"VENV={venv}",
                            f"TOOLS={tmp_path / 'tools'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=outside_run(tmp_path))
    wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip())
    command = int((tmp_path / "pid").read_text())
    run.send_signal(signal.SIGTERM)
    run.wait(timeout=30)
    try:
        wait_for(lambda: not alive(command), seconds=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(command, signal.SIGKILL)


FORKED_CHILD_GETS_CTRL_C = '''
import os, signal, subprocess, sys
from scripts import launch, runlock

def work():
    # the child sends itself SIGINT between fork and exec, as a Ctrl-C to the process group can land there
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
                           preexec_fn=lambda: os.kill(os.getpid(), signal.SIGINT), capture_output=True, text=True)
    print("exec'd child:", child.stdout.strip())
    with launch.sigterm_as_interrupt():
        code = "import signal; print(signal.Handlers(signal.getsignal(signal.SIGTERM)).name)"
        child = subprocess.run([sys.executable, "-c", code], preexec_fn=lambda: os.kill(os.getpid(), signal.SIGTERM),
                               capture_output=True, text=True)
    print("exec'd child:", child.stdout.strip())
    return 0

sys.exit(runlock.interruptible(work, lambda: "as they were"))
'''


def test_a_signal_to_a_child_before_it_execs_is_left_to_the_parent(tmp_path):
    """A child that subprocess forks with a preexec_fn runs Python with the kit's handlers until it execs. A signal
    there does nothing: no KeyboardInterrupt in the child (a fresh clone's `make test` showed its traceback when a
    Ctrl-C met a gate stage starting), no signals left ignored in the command it execs, and the parent goes on."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED_CHILD_GETS_CTRL_C)
    env = {**os.environ, "PYTHONPATH": str(KIT_ROOT)}
    result = subprocess.run([sys.executable, str(script)], cwd=KIT_ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr, result.stderr[-1500:]
    assert result.returncode == 0, (result.stdout, result.stderr[-1500:])
    assert result.stdout.splitlines() == ["exec'd child: <built-in function default_int_handler>",
                                          "exec'd child: SIG_DFL"], result.stdout
