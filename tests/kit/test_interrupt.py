"""Issue 22, items 1 and 7: Ctrl-C at several moments of the gate and of the bench, as `make` runs them (through
scripts/runlock.py, the terminal's SIGINT to the whole process group), on tiny throw-away upstreams.

After each interrupt: ``git worktree list`` and every ref of the checkouts are as before (the stage trees are
clones of their own, not registered work trees), no stage or bench tree is left under the output directory, the
exit status is 130 and the message says what was done. An interrupted bench writes what it measured so far.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from scripts import runlock, sources
from scripts.git import git
from scripts.sources import KIT_ROOT
from tests.kit.test_gate import GOOD, make_series, state, write_kit

SLOW_GUARD = {**GOOD, "guard": "assert tiny.VALUE in (1, 2)\n    if 'TINY_MARK' in __import__('os').environ:\n"
                               "        open(__import__('os').environ['TINY_MARK'], 'w')\n"
                               "        __import__('time').sleep(30)"}


def outside_run(tmp_path) -> dict:
    """The environment of a command typed by hand: no KIT_RUN, a lock file of its own."""
    return {**{k: v for k, v in os.environ.items() if k != runlock.ENV}, "KIT_LOCK": str(tmp_path / "run.lock"),
            "PYTHONPATH": str(KIT_ROOT)}


def wait_for(condition, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, f"ended before the moment of the interrupt: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def ctrl_c(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGINT to the process group (a terminal's Ctrl-C); return the exit status and stderr."""
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def registered(repo) -> list[str]:
    """What ``git worktree list`` shows for ``repo``, the main work tree included."""
    return git(repo, "worktree", "list", "--porcelain").stdout.split("\n\n")


@pytest.mark.parametrize("moment", ["making-the-trees", "stage-running", "stage-started"])
def test_interrupted_gate_leaves_worktree_list_refs_and_build_as_they_were(kit, tmp_path, moment):
    make_series(kit, fix=True)
    assert kit.run("apply")[0] == 0
    argv = write_kit(kit, SLOW_GUARD)
    mark, out = kit.root / "in-the-stage", kit.root / "out"
    before, worktrees = state(kit.repo), registered(kit.repo)
    env = {**outside_run(tmp_path), "TINY_MARK": str(mark)}
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make gate", "--", sys.executable,
                             "-m", "scripts.gate", *argv], cwd=KIT_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    if moment == "making-the-trees":
        wait_for(lambda: (out / "trees" / "before").exists(), proc)
    elif moment == "stage-started":
        wait_for(lambda: (out / "before" / "pytest.log").exists(), proc)
    else:
        wait_for(mark.exists, proc)
    assert registered(kit.repo) == worktrees  # not even while it runs: nothing of the gate is in the checkout's .git
    code, err = ctrl_c(proc)
    assert code == 130, err
    assert registered(kit.repo) == worktrees
    assert state(kit.repo) == before  # HEAD, branch, status, every ref, every file
    assert not (out / "trees").exists()
    assert "Traceback" not in err
    assert "gate: interrupted; the stages were stopped and no stage tree is left in" in err, err
    assert err.splitlines()[-1].startswith("make gate: interrupted; no process of the run is left")


FAKE_CHILD = '''
import json, os, sys, time
from pathlib import Path

count = Path(os.environ["FAKE_COUNT"])
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
if n >= int(os.environ["FAKE_RESULTS"]):
    Path(os.environ["FAKE_MARK"]).touch()
    time.sleep(60)
kind = sys.argv[2]
paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and "launch_site" not in p]
module = os.path.join(paths[0] if paths else os.path.join(os.environ["FAKE_CHECKOUTS"], kind), kind, "x.py")
if kind == "deepspeed":
    metrics = ("batches_per_s", "batches_per_cpu_s", "state_dict_s", "load_state_dict_s", "state_roundtrip_s",
               "state_roundtrip_cpu_s")
    result = {"by_scenario": {s: {m: 1.0 for m in metrics} for s in ("single_cluster", "several_clusters")}}
else:
    metrics = ("prepare_s", "workers_after_prepare", "epoch0_s", "prepare_epoch0_s", "epoch1_s")
    result = {"by_workers": {w: {m: 1.0 for m in metrics} for w in ("0", "2", "6")}}
print("BENCH-RESULT " + json.dumps({**result, "versions": {kind: "fake"}, "module": module}))
'''


def fake_checkouts(root) -> dict:
    """Checkouts named accelerate and deepspeed, each a base/<pinned version> tag and one commit of a "fix"."""
    states = {}
    for name in ("accelerate", "deepspeed"):
        repo = root / "upstream" / name
        (repo / name).mkdir(parents=True)
        (repo / name / "x.py").write_text("X = 1\n")
        git(repo, "init", "--quiet")
        ident = ["-c", "user.name=T", "-c", "user.email=t@example.com"]
        git(repo, "add", "--all")
        git(repo, *ident, "commit", "--quiet", "--message", "base")
        git(repo, "tag", f"base/{sources.pin(name).version}")
        (repo / name / "x.py").write_text("X = 2\n")
        git(repo, *ident, "commit", "--quiet", "--all", "--message", "fix")
        states[name] = (state(repo), registered(repo))
    return states


@pytest.mark.parametrize("results, measured", [(0, 0), (2, 1)],
                         ids=["during-the-first-process", "after-one-repetition"])
def test_interrupted_bench_leaves_the_checkouts_and_writes_what_it_measured(tmp_path, results, measured):
    states = fake_checkouts(tmp_path)
    python = tmp_path / "python"
    (tmp_path / "child.py").write_text(textwrap.dedent(FAKE_CHILD))
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'child.py'} \"$@\"\n")
    python.chmod(0o755)
    out, mark = tmp_path / "bench", tmp_path / "sleeping"
    env = {**outside_run(tmp_path), "FAKE_COUNT": str(tmp_path / "count"), "FAKE_RESULTS": str(results),
           "FAKE_MARK": str(mark), "FAKE_CHECKOUTS": str(tmp_path / "upstream")}
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make bench", "--", sys.executable,
                             "-m", "scripts.bench", f"--python={python}", f"--checkouts={tmp_path / 'upstream'}",
                             f"--out={out}", "--only=deepspeed", "--repeat=3"], cwd=KIT_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(mark.exists, proc)
    code, err = ctrl_c(proc)
    assert code == 130, err
    for name, (files, worktrees) in states.items():
        repo = tmp_path / "upstream" / name
        assert registered(repo) == worktrees and state(repo) == files
    assert not (out / "worktrees").exists() and not (out / "gate" / "trees").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"]
    assert ("deepspeed" in report) == bool(measured)
    if measured:
        assert report["interrupted"] == f"during deepspeed, after {measured} of 3 repetitions"
        assert report["deepspeed"]["by_scenario"]["single_cluster"]["batches_per_s"]["runs"] == measured
    assert "**Interrupted**" in (out / "report.md").read_text()
    assert "what was measured until then is in" in err and "Traceback" not in err


def test_the_run_waits_for_a_slow_clean_up_after_ctrl_c(tmp_path):
    """Under load the bench needed more than the 6 s it had (it was killed before writing its report)."""
    started, done = tmp_path / "started", tmp_path / "cleaned-up"
    code = ("import sys, time; from pathlib import Path; from scripts import runlock\n"
            f"def work():\n    try:\n        Path({str(started)!r}).touch()\n        time.sleep(60)\n    finally:\n"
            f"        time.sleep(8)\n        Path({str(done)!r}).touch()\n    return 0\n"
            "sys.exit(runlock.interruptible(work))")
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make bench", "--", sys.executable,
                             "-c", code], cwd=KIT_ROOT, env=outside_run(tmp_path), stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for(started.exists, proc)
    code, err = ctrl_c(proc)
    assert code == 130, err
    assert done.exists()
    assert "no process of the run is left;" in err  # it ended by itself: the sweep found nothing


def test_an_interrupted_gate_leaves_no_report_that_claims_a_verdict(kit, tmp_path):
    """Issue 33, item 2: after SIGINT at 30 s, report.md still read `Verdict: **PASS**` while the stage log it linked
    was the aborted run's and its junit.xml was gone; 9 MB of the stages' tmp/ was left."""
    make_series(kit, fix=True)
    argv = write_kit(kit, SLOW_GUARD)
    out, mark = kit.root / "out", kit.root / "in-the-stage"
    finished = subprocess.run([sys.executable, "-m", "scripts.gate", *argv], cwd=KIT_ROOT, env=outside_run(tmp_path),
                              capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "Verdict: **PASS**" in (out / "report.md").read_text()
    proc = subprocess.Popen([sys.executable, "-m", "scripts.runlock", "--name", "make gate", "--", sys.executable,
                             "-m", "scripts.gate", *argv, "--no-cache"], cwd=KIT_ROOT,  # its stages run, not reused
                            env={**outside_run(tmp_path), "TINY_MARK": str(mark)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(mark.exists, proc)
    assert not (out / "report.json").exists()  # the old verdict went with its evidence when the run started
    code, err = ctrl_c(proc)
    assert code == 130, err
    md = (out / "report.md").read_text()
    assert "PASS" not in md and md.startswith("# Gate report\n\nVerdict: **none**: this run ended after "), md
    assert "(the run was interrupted)" in md and "[before/pytest.log](before/pytest.log)" in md
    assert not (out / "report.json").exists()
    assert not [path for path in out.glob("*/tmp")], "the stages' temporary files were left"
    assert "report.md says that this run has no verdict" in err
