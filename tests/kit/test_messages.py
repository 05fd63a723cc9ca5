"""Issue 22, item 8: messages that said something untrue, and leftovers of the kit's own runs.

Each test names the message it used to get wrong.
"""

import os
import re
import signal
import subprocess
import sys
import time

from scripts.sources import KIT_ROOT
from tests.kit.test_progress import pytest_run
from tests.kit.test_runlock import outside_run


def test_interrupted_pytest_keeps_the_last_complete_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    assert pytest_run(tmp_path, f"--junitxml={junit}").returncode == 0
    complete = junit.read_text()
    result = pytest_run(tmp_path, f"--junitxml={junit}", env={**outside_run(tmp_path), "INTERRUPT": "1"})
    assert result.returncode == 2, result.stdout  # pytest's exit status for an interrupted session
    assert junit.read_text() == complete
    assert (tmp_path / "junit.interrupted.xml").exists()


def test_make_does_not_echo_the_plumbing(tmp_path):
    """`exec python3.11 -m scripts.runlock ...` was printed before every recipe of `make test` and others."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "python").chmod(0o755)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / ".kit-tools").touch()
    result = subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), "test", f"VENV={venv}",
                             f"TOOLS={tmp_path / 'tools'}"], capture_output=True, text=True, timeout=60,
                            env=outside_run(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "scripts.runlock" not in result.stdout + result.stderr


def test_sigint_status_is_130_however_the_command_ends(tmp_path):
    """The same Ctrl-C used to end in 2, 130 or 143, depending on how the command took it."""
    code = "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(2)); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make gate", "--", sys.executable,
                             "-c", code], cwd=KIT_ROOT, env=outside_run(tmp_path), stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "make gate: interrupted; no process of the run is left; checkouts:" in err


def test_discard_on_a_checkout_with_only_the_kits_series_drops_nothing_and_says_so(kit):
    assert kit.run("apply")[0] == 0
    code, _ = kit.run("unapply", "--discard")
    assert code == 0
    assert "dropped" not in kit.out and "tiny: at base/1.0" in kit.out and "series not applied" in kit.out


def test_discard_of_commits_of_the_users_says_they_were_dropped(kit):
    assert kit.run("apply")[0] == 0
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 3\n")
    git = ["git", "-C", str(kit.repo), "-c", "user.name=U", "-c", "user.email=u@example.com"]
    subprocess.run([*git, "commit", "--quiet", "--all", "--message", "mine"], check=True)
    assert kit.run("unapply", "--discard")[0] == 0
    assert "commits not in" in kit.out and "dropped (git reflog still has them)" in kit.out


def test_a_damaged_cached_archive_is_downloaded_again_and_the_pin_is_not_blamed(kit):
    (kit.cache / "tiny-1.0.tar.gz").write_bytes(b"truncated")
    code, err = kit.run("checkout")
    assert code == 0, err
    assert "check the pin" not in err
    assert "the cached tiny-1.0.tar.gz had sha256" in err and "it was deleted and downloaded again" in err
    assert (kit.cache / "tiny-1.0.tar.gz").read_bytes() == (kit.index / "tiny-1.0.tar.gz").read_bytes()


def test_a_cached_archive_damaged_after_the_checkout_is_replaced_by_the_next_apply(kit):
    """Issue 33, item 7: a truncated sdist in the cache passed `make apply` silently (the bad file kept), and was
    caught only when a checkout had to be rebuilt, which then needed the network."""
    assert kit.run("apply")[0] == 0
    (kit.cache / "tiny-1.0.tar.gz").write_bytes(b"truncated")
    code, err = kit.run("apply")
    assert code == 0, err
    assert "the cached tiny-1.0.tar.gz had sha256" in err and "it was deleted and downloaded again" in err
    assert (kit.cache / "tiny-1.0.tar.gz").read_bytes() == (kit.index / "tiny-1.0.tar.gz").read_bytes()


def test_a_damaged_cached_archive_without_network_is_deleted_with_one_warning(kit, tmp_path):
    assert kit.run("apply")[0] == 0
    (kit.cache / "tiny-1.0.tar.gz").write_bytes(b"truncated")
    offline = tmp_path / "empty-index"
    offline.mkdir()
    code, err = kit.run("apply", index=offline)
    assert code == 0, err  # the checkout does not need the archive
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "cannot download tiny-1.0.tar.gz" in lines[0], err
    assert "the checkout's base/1.0 is unaffected" in lines[0]
    assert not (kit.cache / "tiny-1.0.tar.gz").exists()
    assert "series already applied" in kit.out or "applied" in kit.out


def test_interrupt_says_no_process_is_left_not_a_count_of_zero(tmp_path):
    """The command (as the gate does) stops its own 12 processes; the wrapper used to say "0 processes stopped"."""
    code = ("import subprocess, sys, time; from scripts import runlock\n"
            "def work():\n    [subprocess.Popen(['sleep', '60']) for _ in range(3)]\n    time.sleep(60)\n"
            "sys.exit(runlock.interruptible(work))")
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make gate", "--", sys.executable,
                             "-c", code], cwd=KIT_ROOT, env=outside_run(tmp_path), stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "0 processes" not in err and "make gate: interrupted; no process of the run is left; checkouts:" in err


def test_interrupt_probe_names_its_files_without_the_commands_shell_words(tmp_path):
    """The kit's own tests used to leave build/probe/sh-c-setsid sleep 30 & sleep 3.json and the like."""
    probe = [sys.executable, "-m", "scripts.interrupt_probe", "--points=1", "--duration=1", "--grace=0.5",
             f"--out={tmp_path / 'probe'}", "--", "sh", "-c", "sleep 2 & sleep 2"]
    result = subprocess.run(probe, cwd=KIT_ROOT, env=outside_run(tmp_path), capture_output=True, text=True,
                            timeout=60)
    assert "probe sh--c-sleep_2_sleep_2 point 1" in result.stdout, result.stdout + result.stderr
    names = [path.name for path in (tmp_path / "probe").iterdir()]
    assert names and all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in names), names
