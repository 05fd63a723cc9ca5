"""Issue 22, item 4: long runs say what they are doing, at most one line per period and none in a short run.

The periods are shortened here (``--progress-every``, ``--say-every``, ``stages.PROGRESS_S``) so that the tests take
seconds; the kit uses 30 s.
"""

import json
import re
import subprocess
import sys
import time

from scripts import gate, launch
from scripts.gate import stages
from scripts.sources import KIT_ROOT
from tests.kit.test_gate import GOOD, make_series, write_kit
from tests.kit.test_runlock import outside_run

SUITE = '''import os, signal, time


def test_fast():
    pass


def test_slow():
    time.sleep(2.5)


def test_last():
    if os.environ.get("INTERRUPT"):
        # Ctrl-C, whatever the runner left SIGINT at (a shell's background job ignores it, and a child inherits that)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGINT)
'''


def pytest_run(tmp_path, *options: str, env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(SUITE)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "scripts.pytest_progress",
                           "-q", f"--rootdir={tmp_path}", *options, str(tmp_path / "test_suite.py")], cwd=KIT_ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


def test_pytest_says_tests_done_of_total_every_period(tmp_path):
    result = pytest_run(tmp_path, "--progress-every=1")
    assert result.returncode == 0, result.stdout
    # a line may name the test running for a period or more (the slow one, whenever the line falls in it)
    lines = re.findall(r"^progress: (\d+)/3 tests done, 0 failed, (\d+) s(?:; running for \d+ s: \S+)?$",
                       result.stdout, re.M)
    assert 1 <= len(lines) <= 3, result.stdout  # the slow test takes 2.5 s: about two lines, not a flood
    assert lines[0][0] == "1"


def test_pytest_says_nothing_in_a_short_run(tmp_path):
    result = pytest_run(tmp_path, "--progress-every=30")
    assert result.returncode == 0 and "progress:" not in result.stdout


def test_gate_prints_each_stage_progress_every_period(kit, capsys, monkeypatch):
    """Issue 33, item 4: `stage-0 237/241 tests done (92 failed)` alarmed (they were the expected failures), and the
    counts stood still for 60 s with no word of what ran. Now: whether the failures are the expected ones, and the
    test a stage has been running for a period."""
    make_series(kit, fix=True)
    slow = {**GOOD, "guard": "assert tiny.VALUE in (1, 2)\n    __import__('time').sleep(2.5)"}
    argv = write_kit(kit, slow)
    monkeypatch.setattr(stages, "PROGRESS_S", 1.0)
    capsys.readouterr()
    assert gate.main(argv) == 0
    out = capsys.readouterr().out
    assert "gate: stages before, after started" in out
    blocks = re.findall(r"^gate: \d+ s: the stages' tests done / collected\n  before: (.*)\n  after: (.*)$", out, re.M)
    assert blocks, out
    lines = [stage for block in blocks for stage in block]
    shape = (r"waiting|collecting|(\d+/\d+ tests done|finished: \d+ tests), (none failed|\d+ failed \(all "
             r"expected\))(, running \S+ for \d+ s)?")
    assert all(re.fullmatch(shape, stage) for stage in lines), lines
    assert any("running suites/tiny/test_tiny_kit.py::test_value_is_known for " in s for s in lines), lines
    assert re.search(r"^gate before: 2 failed, 1 passed \(all expected\) in ", out, re.M), out
    assert re.search(r"^gate after: 3 passed in ", out, re.M), out
    assert "gate: judging the stages, writing the report and removing the stages' trees" in out


def test_gate_says_when_a_stage_fails_tests_it_should_not(kit, capsys):
    make_series(kit, fix=True)
    argv = write_kit(kit, {**GOOD, "guard": "assert tiny.VALUE == 2"})  # a guard that fails before the fix
    capsys.readouterr()
    assert gate.main(argv) == 1
    out = capsys.readouterr().out
    assert re.search(r"^gate before: 3 failed \(1 failure NOT expected: see the log\) in ", out, re.M), out


def test_pytest_names_a_test_that_runs_for_a_period(tmp_path):
    result = pytest_run(tmp_path, "--progress-every=1")
    assert re.search(r"^progress: 1/3 tests done, 0 failed, \d+ s; running for \d+ s: test_suite.py::test_slow$",
                     result.stdout, re.M), result.stdout


def test_runlock_says_what_a_quiet_command_does_every_period(tmp_path):
    result = subprocess.run([sys.executable, "-m", "scripts.runlock", "--name", "make apply", "--say",
                             "installing torch", "--say-every=1", "--", "sleep", "2.5"], cwd=KIT_ROOT,
                            env=outside_run(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert lines[0] == "make apply: installing torch"
    assert 1 <= len(lines[1:]) <= 3 and all(re.fullmatch(r"make apply: still installing torch \(\d s\)", line)
                                            for line in lines[1:]), lines


def test_a_stage_of_a_stack_is_named_with_its_role_and_what_it_has_been_running(tmp_path):
    job = launch.Job(["true"], tmp_path / "stage-1" / "pytest.log", 60)
    role = "after deepspeed 1/3, before deepspeed 2/3, after accelerate"
    assert stages.stage_progress(job, role, str) == f"stage-1 ({role}): waiting"
    job.started = 1.0
    (tmp_path / "stage-1").mkdir()
    assert stages.stage_progress(job, role, str) == f"stage-1 ({role}): collecting"
    counts = {"done": 61, "total": 244, "failed": 13, "expected": 12, "running": ["tests/x.py::test_launch",
                                                                                 time.time() - 45]}
    (tmp_path / "stage-1" / "progress").write_text(json.dumps(counts))
    assert stages.stage_progress(job, role, lambda key: f"renamed/{key}") == (
        f"stage-1 ({role}): 61/244 tests done, 13 failed (1 failure NOT expected: see the log), running "
        "renamed/tests/x.py::test_launch for 45 s")
    (tmp_path / "stage-1" / "junit.xml").write_text("<testsuites/>")  # a stage whose pytest ended
    assert stages.stage_progress(job, role, str) == (
        f"stage-1 ({role}): finished: 61 tests, 13 failed (1 failure NOT expected: see the log)")


def test_a_session_still_collecting_says_so():
    """A newcomer's `make test` printed `progress: 0 tests done, 0 failed, 30 s` for its first 33 s (the xdist
    workers were importing torch); it says that it is collecting."""
    from types import SimpleNamespace

    from scripts.pytest_progress import Progress

    options = {"progress_file": None, "progress_every": 30, "progress_expect": None}
    progress = Progress(SimpleNamespace(getoption=options.get))
    assert re.fullmatch(r"progress: collecting the tests, \d+ s", progress.line()), progress.line()
    progress.total = 3
    assert re.fullmatch(r"progress: 0/3 tests done, 0 failed, \d+ s", progress.line()), progress.line()
