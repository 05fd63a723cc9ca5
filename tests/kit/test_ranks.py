"""``scripts/ranks.py``: N ranks with the environment torch.distributed.run gives them, and no rank left when one
fails or the launcher is stopped; each started as ``python script``, or (``JOB_PRELOAD``) forked from the launcher
after it imported the modules named, running the script as ``__main__``."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts import launch, ranks

RANK_SCRIPT = """
import json, os, sys, time
out = sys.argv[1]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
path = os.path.join(out, f"rank{os.environ['RANK']}.json")
with open(path + ".part", "w") as f:  # renamed when whole: a reader polling for the file never sees it half written
    json.dump({k: os.environ[k] for k in keys} | {"pid": os.getpid(), "parent": os.getppid(), "main": __name__,
               "argv": sys.argv, "preloaded": "colorsys" in sys.modules, "path0": sys.path[0]}, f)
os.replace(path + ".part", path)
if os.environ["RANK"] == sys.argv[2]:  # fails once every rank has started, so the others are there to be ended
    started = [os.path.join(out, f"rank{r}.json") for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(map(os.path.exists, started)):
        time.sleep(0.01)
    sys.exit(3)
if sys.argv[2] != "none":
    time.sleep(600)
"""


PRELOADS = pytest.mark.parametrize("preload", ["", "colorsys"], ids=["python-script", "forked"])


def _run(tmp_path, world, fail, preload="", timeout=60):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    return subprocess.run([sys.executable, ranks.__file__, str(world), str(script), str(tmp_path), fail],
                          timeout=timeout, capture_output=True, text=True, env={**os.environ, "JOB_PRELOAD": preload})


@PRELOADS
def test_each_rank_gets_the_environment_of_env_initialization(tmp_path, preload):
    done = _run(tmp_path, 3, "none", preload)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [s["RANK"] for s in seen] == ["0", "1", "2"] == [s["LOCAL_RANK"] for s in seen]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["GROUP_RANK"], s["MASTER_ADDR"]) for s in seen} == {
        ("3", "3", "0", "127.0.0.1")}
    assert len({s["MASTER_PORT"] for s in seen}) == 1
    assert {(s["main"], tuple(s["argv"][1:]), s["path0"]) for s in seen} == {
        ("__main__", (str(tmp_path), "none"), str(tmp_path))}
    assert {s["preloaded"] for s in seen} == {bool(preload)}  # forked after the import, or a new interpreter


@PRELOADS
def test_a_failing_rank_ends_the_others_and_gives_its_status(tmp_path, preload):
    started = time.monotonic()
    done = _run(tmp_path, 2, "1", preload)
    assert done.returncode == 3 and time.monotonic() - started < 30
    waiting = json.loads((tmp_path / "rank0.json").read_text())["pid"]
    assert not launch.running(waiting)


@PRELOADS
def test_sigterm_to_the_launcher_ends_every_rank(tmp_path, preload):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.Popen([sys.executable, ranks.__file__, "2", str(script), str(tmp_path), "wait"],
                            env={**os.environ, "JOB_PRELOAD": preload})
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"rank{r}.json").exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the launcher ended before both ranks started"
        pids = [json.loads((tmp_path / f"rank{r}.json").read_text())["pid"] for r in range(2)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not any(launch.running(pid) for pid in pids)
    finally:
        if proc.poll() is None:  # a failed assertion above: the launcher's own SIGTERM handling ends its ranks
            proc.terminate()
            proc.wait(timeout=30)


def test_a_wrong_count_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, ranks.__file__, "x", "script.py"], capture_output=True, text=True,
                          timeout=30, env={**os.environ})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage" in done.stderr
